"""Workloads: seeded synthetic agent programs and the JSONL trace format.

One source of programs for everything that replays them: the simulator
(``autellix simulate``) and the real-engine benchmarks (``autellix bench``).
"""

from .generators import MAX_CONTEXT, WORKLOADS, at_rate, generate
from .trace import CallSpec, ProgramSpec, TraceError, load_trace, write_trace

__all__ = [
    "MAX_CONTEXT",
    "WORKLOADS",
    "CallSpec",
    "ProgramSpec",
    "TraceError",
    "at_rate",
    "generate",
    "load_trace",
    "write_trace",
]
