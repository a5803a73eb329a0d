"""A discrete-event simulator of continuous-batching engines that drives the
same policy objects as the vLLM scheduler (``autellix simulate``)."""

from ..workloads import WORKLOADS, CallSpec, ProgramSpec, TraceError, generate, load_trace
from .run import SIM_POLICIES, SimResult, simulate

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
