"""The scheduling policy core: plain Python, no vLLM import.

The vLLM scheduler, the router and the simulator all drive these objects, so
the scheduling math exists exactly once:

* :class:`ProcessTable` (``table``): programs, threads, calls and their counters;
* policies (``policies``): FCFS, MLFQ, PLAS, ATLAS, Autellix and the SRPT oracle,
  registered by name in ``POLICIES``;
* :class:`ProgramScheduler` (``core``): levels, demotion, anti-starvation and
  preemption choices around a policy;
* balancers (``routing``): the locality-aware rule and its baselines, registered
  by name in ``BALANCERS``;
* ``bounded``: the size-bounded maps and sets both process tables keep;
* ``residency``: which idle contexts a KV-aware engine holds and which calls it
  admits (the working-set rule);
* ``config``: levels, the service unit, :class:`ProgramLimits` and
  :class:`ResidencyConfig`;
* ``faults``: failures of a policy or an engine hook, confined to one call and counted.
"""

from .config import (
    DEFAULT_LIMITS,
    Levels,
    PolicyConfig,
    ProgramLimits,
    ResidencyConfig,
    ServiceMeter,
)
from .core import ANONYMOUS_PREFIX, Counters, ProgramScheduler
from .policies import (
    ATLAS,
    FCFS,
    MLFQ,
    PLAS,
    POLICIES,
    POLICY_NAMES,
    SRPT,
    Autellix,
    AutellixKV,
    Policy,
    make_policy,
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
    "ANONYMOUS_PREFIX",
    "ATLAS",
    "DEFAULT_LIMITS",
    "BALANCERS",
    "BALANCER_NAMES",
    "FCFS",
    "MLFQ",
    "PLAS",
    "POLICIES",
    "POLICY_NAMES",
    "SRPT",
    "Autellix",
    "AutellixKV",
    "Balancer",
    "Call",
    "CallState",
    "ConsistentHash",
    "Counters",
    "EngineLoad",
    "LeastUsed",
    "Levels",
    "Locality",
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
    "Thread",
    "WaitQueue",
    "make_balancer",
    "make_policy",
]
