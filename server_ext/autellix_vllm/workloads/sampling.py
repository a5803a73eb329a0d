"""The distributions the workloads draw from, all from a caller's seeded ``Random``."""

from __future__ import annotations

import math
import random
from functools import cache


@cache
def _power_law(max_n: int, mean: float) -> tuple[list[int], list[float]]:
    """Support and cumulative weights of P(n) ~ n^-a on 1..max_n with the given mean."""
    support = list(range(1, max_n + 1))

    def mean_for(a: float) -> float:
        w = [n**-a for n in support]
        return sum(n * x for n, x in zip(support, w, strict=True)) / sum(w)

    lo, hi = 0.0, 5.0  # mean_for decreases in a
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_for(mid) > mean else (lo, mid)
    weights = [n**-lo for n in support]
    cumulative, total = [], 0.0
    for w in weights:
        total += w
        cumulative.append(total)
    return support, cumulative


def power_law_count(rng: random.Random, max_n: int, mean: float) -> int:
    """A heavy-tailed count in 1..max_n with the given mean (e.g. calls per program)."""
    support, cumulative = _power_law(max_n, mean)
    return rng.choices(support, cum_weights=cumulative)[0]


def lognormal(rng: random.Random, mean: float, sigma: float, lo: int, hi: int) -> int:
    """A log-normal integer with the given mean, clipped to ``lo..hi`` (token counts)."""
    mu = math.log(mean) - sigma * sigma / 2
    return int(min(hi, max(lo, round(rng.lognormvariate(mu, sigma)))))


def lognormal_median(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    """A log-normal integer with the given median, clipped to ``lo..hi`` (published
    figures often give a median where :func:`lognormal` takes the mean)."""
    return lognormal(rng, median * math.exp(sigma * sigma / 2), sigma, lo, hi)


def geometric(rng: random.Random, mean: float) -> int:
    """A geometric count in 0, 1, 2, ... with the given mean: each further one
    follows with the same chance, ``mean / (1 + mean)``."""
    go_on = mean / (1 + mean)
    return int(math.log(1.0 - rng.random()) / math.log(go_on))
