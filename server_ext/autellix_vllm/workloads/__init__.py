"""Workloads: seeded synthetic agent programs and the JSONL trace format.

One source of programs for everything that replays them: the simulator
(``autellix simulate``) and the real-engine benchmarks (``autellix bench``).
Every workload is a :class:`WorkloadSpec` in :data:`WORKLOAD_SPECS`
(``generators``); its programs come from a family module (``conversations``,
``tree_search``, ``agent_sessions``, ``chat_logs``) built on the distributions in
``sampling``.
"""

from .generators import (
    AGENT_MAX_CONTEXT,
    MAX_CONTEXT,
    WORKLOAD_SPECS,
    WORKLOADS,
    WorkloadSpec,
    at_rate,
    generate,
    get_workload,
    with_owners,
)
from .trace import CallSpec, ProgramSpec, TraceError, load_trace, write_trace

__all__ = [
    "AGENT_MAX_CONTEXT",
    "MAX_CONTEXT",
    "WORKLOADS",
    "WORKLOAD_SPECS",
    "CallSpec",
    "ProgramSpec",
    "TraceError",
    "WorkloadSpec",
    "at_rate",
    "generate",
    "get_workload",
    "load_trace",
    "with_owners",
    "write_trace",
]
