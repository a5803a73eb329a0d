"""What a program's timeline costs the router, timed in-process.

    python -m autellix_vllm.bench.timeline_cost

Per call, the router reads the engine's report from the final answer
(``call_report``) and records a :class:`~autellix_vllm.router.timeline.CallSpan`
with the call's end (``ProgramTable.call_finished``). The recording has no
switch, so its cost is the difference between ending calls with a span and
without one. A timeline's read (``ProgramTable.timeline``, what
``GET .../timeline`` computes) is timed on a program with the most calls kept.
Prints one JSON object, microseconds per operation, the median of ``repeats``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from autellix_vllm.policy.config import TableBounds
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.router.keys import ANONYMOUS
from autellix_vllm.router.programs import ProgramTable
from autellix_vllm.router.timeline import TIMELINE_CALLS_KEPT, CallSpan
from autellix_vllm.router.usage import call_report

# A final answer as vLLM sends it with --enable-per-request-metrics and
# --enable-prompt-tokens-details.
ANSWER = {
    "usage": {"prompt_tokens": 1200, "completion_tokens": 64,
              "prompt_tokens_details": {"cached_tokens": 1024}},
    "metrics": {"queue_time_ms": 3.0, "time_to_first_token_ms": 40.0,
                "generation_time_ms": 900.0, "mean_itl_ms": 14.0},
}  # fmt: skip
PROGRAMS = 100


def _per_operation_us(run: Callable[[int], None], operations: int, repeats: int) -> float:
    """The median over ``repeats`` of ``run(operations)``'s time per operation."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run(operations)
        times.append((time.perf_counter() - started) / operations * 1e6)
    return statistics.median(times)


def _end_calls(with_span: bool) -> Callable[[int], None]:
    """``count`` calls of :data:`PROGRAMS` programs arrive and end, each with its
    span (the router as it is) or without (no timeline)."""
    table = ProgramTable(TableBounds())
    # No call ids: the table would keep each completed one, to refuse its reuse.
    identities = [CallIdentity(f"p{i}") for i in range(PROGRAMS)]
    report = call_report(ANSWER)

    def run(count: int) -> None:
        for number in range(count):
            record = table.call_arrived(identities[number % PROGRAMS], ANONYMOUS)
            span = CallSpan("c", "main", "e", 0.0, 1.0, True, report) if with_span else None
            table.call_finished(record, None, engine="e", service=1.0, completed=True, span=span)

    return run


def measure(operations: int = 20_000, repeats: int = 5) -> dict[str, Any]:
    end_with, end_without = _end_calls(True), _end_calls(False)
    with_span = _per_operation_us(end_with, operations, repeats)
    without_span = _per_operation_us(end_without, operations, repeats)
    table = ProgramTable(TableBounds())
    for number in range(TIMELINE_CALLS_KEPT):
        record = table.call_arrived(CallIdentity("full"), ANONYMOUS)
        span = CallSpan(f"c{number}", "main", "e", number, number + 0.5, True, call_report(ANSWER))
        table.call_finished(record, None, engine="e", service=1.0, completed=True, span=span)

    def read_timeline(count: int) -> None:
        for _ in range(count):
            table.timeline("full", ANONYMOUS)

    def read_report(count: int) -> None:
        for _ in range(count):
            call_report(ANSWER)

    return {
        "call_report_us": _per_operation_us(read_report, operations, repeats),
        "call_end_with_span_us": with_span,
        "call_end_without_span_us": without_span,
        "span_record_us": with_span - without_span,
        "timeline_read_us": _per_operation_us(read_timeline, operations // 20, repeats),
        "timeline_calls": TIMELINE_CALLS_KEPT,
    }


if __name__ == "__main__":
    print(json.dumps(measure()))
