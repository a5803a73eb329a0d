"""Old dotted path of the trace format; it lives in :mod:`autellix_vllm.workloads.trace`."""

from autellix_vllm.workloads.trace import (
    CallSpec,
    ProgramSpec,
    TraceError,
    load_trace,
    parse_program,
    write_trace,
)

__all__ = ["CallSpec", "ProgramSpec", "TraceError", "load_trace", "parse_program", "write_trace"]
