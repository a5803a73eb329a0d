"""The scheduling policy core: plain Python, no vLLM import.

The vLLM scheduler, the router and the simulator all drive these objects, so
the scheduling math exists exactly once:

* :class:`ProcessTable` (``table``): programs, threads, calls and their counters;
* policies (``policies``): FCFS, MLFQ, PLAS, ATLAS, the paper's PLAS/ATLAS
  order, Autellix (the KV-aware default) and the SRPT oracle, registered by name
  in ``POLICIES``;
* :class:`ProgramScheduler` (``core``): levels, demotion, anti-starvation and
  preemption choices around a policy;
* balancers (``routing``): the locality-aware rule and its baselines, registered
  by name in ``BALANCERS``;
* ``bounded``: the size-bounded maps and sets both process tables keep;
* ``residency``: which idle contexts a KV-aware engine holds and which calls it
  admits (the working-set rule);
* ``config``: levels, the service unit, :class:`ProgramLimits`,
  :class:`TableBounds` and :class:`ResidencyConfig`;
* ``faults``: failures of a policy or an engine hook, confined to one call and counted.
"""

from .config import (
    DEFAULT_BOUNDS,
    DEFAULT_LIMITS,
    Levels,
    PolicyConfig,
    ProgramLimits,
    ResidencyConfig,
    ServiceMeter,
    TableBounds,
    TenantConfig,
)
from .core import ALONE_PREFIX, Counters, ProgramScheduler
from .policies import (
    ATLAS,
    DEFAULT_POLICY,
    DEPRECATED_POLICY_NAMES,
    FCFS,
    MLFQ,
    PLAS,
    POLICIES,
    POLICY_NAMES,
    SRPT,
    Autellix,
    PlasAtlas,
    Policy,
    make_policy,
    policy_name,
)
from .queue import WaitQueue
from .routing import (
    BALANCER_NAMES,
    BALANCERS,
    Balancer,
    ConsistentHash,
    EngineLoad,
    LeastUsed,
    Locality,
    RoundRobin,
    Route,
    make_balancer,
)
from .table import Call, CallState, ProcessTable, Program, Rank, Thread

__all__ = [
    "ALONE_PREFIX",
    "ATLAS",
    "DEFAULT_BOUNDS",
    "DEFAULT_LIMITS",
    "BALANCERS",
    "BALANCER_NAMES",
    "FCFS",
    "MLFQ",
    "PLAS",
    "DEFAULT_POLICY",
    "DEPRECATED_POLICY_NAMES",
    "POLICIES",
    "POLICY_NAMES",
    "SRPT",
    "Autellix",
    "Balancer",
    "Call",
    "CallState",
    "ConsistentHash",
    "Counters",
    "EngineLoad",
    "LeastUsed",
    "Levels",
    "Locality",
    "PlasAtlas",
    "Policy",
    "PolicyConfig",
    "ProcessTable",
    "ProgramLimits",
    "Program",
    "ProgramScheduler",
    "Rank",
    "ResidencyConfig",
    "RoundRobin",
    "Route",
    "ServiceMeter",
    "TableBounds",
    "TenantConfig",
    "Thread",
    "WaitQueue",
    "make_balancer",
    "make_policy",
    "policy_name",
]
