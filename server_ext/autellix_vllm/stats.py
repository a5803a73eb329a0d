"""Summary statistics shared by the simulator and the benchmarks."""

from __future__ import annotations

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
