"""A discrete-event simulator of continuous-batching engines that drives the
same policy objects as the vLLM scheduler (``autellix simulate``)."""

from .run import SIM_POLICIES, SimResult, simulate
from .trace import CallSpec, ProgramSpec, TraceError, load_trace
from .workloads import WORKLOADS, generate

__all__ = [
    "SIM_POLICIES",
    "WORKLOADS",
    "CallSpec",
    "ProgramSpec",
    "SimResult",
    "TraceError",
    "generate",
    "load_trace",
    "simulate",
]
