"""Summary statistics shared by the simulator and the benchmarks."""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, 0.0 when there are none.

    The value at index round(q / 100 * (n - 1)) in sorted order: always one of
    the values, never an interpolation between two.
    """
    ordered = sorted(values)
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


# What :func:`tails` reports, in this order.
TAIL_KEYS = (
    "p95_program_latency",
    "p99_program_latency",
    "avg_first_call_wait",
    "p95_first_call_wait",
)


def tails(program_latency: Iterable[float], first_call_wait: Iterable[float]) -> dict[str, float]:
    """What an average latency per token hides, in seconds: the slowest programs'
    latency (a program's arrival to its last call's completion), and how long new
    programs wait for their first token (from their first call's arrival)."""
    latency, waits = list(program_latency), list(first_call_wait)
    values = (
        percentile(latency, 95),
        percentile(latency, 99),
        statistics.fmean(waits) if waits else 0.0,
        percentile(waits, 95),
    )
    return dict(zip(TAIL_KEYS, values, strict=True))
