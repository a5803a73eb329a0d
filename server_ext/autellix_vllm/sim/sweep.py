"""Throughput at equal latency: each policy's highest arrival rate within an SLO.

The SLO is a multiple (default 5x) of the unloaded average latency per token,
measured with the first policy at a rate so low that programs barely overlap.
For every policy (or policy/balancer pair) the search brackets the rate where
the average latency per token crosses the SLO by doubling, then bisects. Every
run uses the same programs (the same seed); only arrival times scale with the
rate. Runs of different policies go to a process pool in parallel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..policy import PolicyConfig
from .presets import get_preset
from .run import simulate
from .trace import ProgramSpec
from .workloads import at_rate, generate

BISECTIONS = 5  # the max rate is then known to within a factor 2**(1/32), ~2%
SEARCH_LIMIT = 4.0  # search no further than 4x the engines' nominal capacity


@dataclass(frozen=True)
class SweepSetup:
    programs: list[ProgramSpec]  # arrivals at rate 1.0
    engines: int
    preset: str
    max_num_seqs: int | None
    config: PolicyConfig
    slo: float = 0.0


@dataclass
class Curve:
    key: str
    points: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    max_rate: float = 0.0
    censored: bool = False  # still within the SLO at the search limit


def _run(setup: SweepSetup, policy: str, lb: str, rate: float) -> dict[str, Any]:
    programs = at_rate(setup.programs, 1.0 / rate)
    return simulate(
        programs,
        policy,
        engines=setup.engines,
        lb=lb,
        preset=setup.preset,
        max_num_seqs=setup.max_num_seqs,
        config=setup.config,
    ).metrics


def capacity_rate(setup: SweepSetup) -> float:
    """Programs per second the engines could finish if always full of decodes."""
    preset = get_preset(setup.preset).with_max_num_seqs(setup.max_num_seqs)
    seqs = preset.max_num_seqs
    tokens_per_s = seqs / preset.step_time(seqs, 0) * setup.engines
    mean_decode = sum(p.decode_tokens for p in setup.programs) / len(setup.programs)
    return tokens_per_s / mean_decode


def _search(
    setup: SweepSetup, key: str, policy: str, lb: str, start: float, limit: float
) -> Curve:
    """Find the highest rate whose average latency per token is within the SLO."""
    curve = Curve(key)

    def ok(rate: float) -> bool:
        metrics = _run(setup, policy, lb, rate)
        curve.points.append((rate, metrics))
        return metrics["avg_latency_per_token"] <= setup.slo

    lo, hi = 0.0, start
    while hi <= limit:  # bracket: lo passes, hi fails
        if not ok(hi):
            break
        lo, hi = hi, hi * 2
    else:
        # Within the SLO even far beyond the engines' capacity: with a finite trace
        # an oracle that starves long programs can stay there; report the limit.
        curve.max_rate, curve.censored = lo, True
        curve.points.sort(key=lambda p: p[0])
        return curve
    if lo == 0.0:
        lo = hi
        for _ in range(12):
            lo /= 2
            if ok(lo):
                break
        else:
            curve.points.sort(key=lambda p: p[0])
            return curve  # fails even nearly unloaded: max rate 0
    for _ in range(BISECTIONS):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    curve.max_rate = lo
    curve.points.sort(key=lambda p: p[0])
    return curve


def sweep(
    workload: str,
    policies: Sequence[str],
    *,
    lbs: Sequence[str] = ("round-robin",),
    engines: int = 1,
    preset: str = "a100-llama8b",
    programs: int = 400,
    max_num_seqs: int | None = None,
    seed: int = 0,
    slo_factor: float = 5.0,
    config: PolicyConfig | None = None,
    workers: int = 2,
    on_done: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], list[Curve]]:
    """Max rate within the SLO for every policy (and balancer); see the module doc."""
    if not policies:
        raise ValueError("name at least one policy")
    if slo_factor <= 1:
        raise ValueError("the SLO factor must be > 1")
    setup = SweepSetup(
        generate(workload, programs, 1.0, seed), engines, preset, max_num_seqs,
        config or PolicyConfig(),
    )
    cap = capacity_rate(setup)
    runs = [(p if len(lbs) == 1 else f"{p}/{lb}", p, lb) for p in policies for lb in lbs]
    unloaded = _run(setup, runs[0][1], runs[0][2], cap / 200)
    slo = slo_factor * unloaded["avg_latency_per_token"]
    setup = SweepSetup(setup.programs, engines, preset, max_num_seqs, setup.config, slo)
    curves: list[Curve] = []
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [
            pool.submit(_search, setup, *run, cap / 4, cap * SEARCH_LIMIT) for run in runs
        ]
        for future in futures:
            curves.append(future.result())
            if on_done:
                on_done(curves[-1].key)
    first = curves[0].max_rate
    result = {
        "workload": workload,
        "preset": preset,
        "engines": engines,
        "programs": programs,
        "seed": seed,
        "slo": slo,
        "unloaded_latency_per_token": unloaded["avg_latency_per_token"],
        "max_rate": {c.key: c.max_rate for c in curves},
        "ratio": {c.key: (c.max_rate / first if first else math.inf) for c in curves},
        "censored": [c.key for c in curves if c.censored],
    }
    return result, curves


def plot(curves: list[Curve], slo: float, title: str, path: str) -> None:
    """Average latency per token against arrival rate, one curve per policy (Fig. 12)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for curve in curves:
        rates = [r for r, _ in curve.points]
        lat = [m["avg_latency_per_token"] for _, m in curve.points]
        ax.plot(rates, lat, marker="o", markersize=3, label=curve.key)
    ax.axhline(slo, color="grey", linestyle="--", linewidth=1, label="SLO")
    ax.set_xlabel("arrival rate (programs/s)")
    ax.set_ylabel("avg latency per token (s)")
    ax.set_ylim(0, slo * 2.5)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
