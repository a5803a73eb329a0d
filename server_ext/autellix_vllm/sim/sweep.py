"""Throughput at equal latency: each policy's highest arrival rate within an SLO.

The SLO is a multiple (default 5x) of the unloaded average latency per token,
measured with the first policy at a rate so low that programs barely overlap.

A trace at rate r holds the programs that arrive in a fixed window of
``duration`` seconds (so about r x duration programs; by default the
workload's ``sweep_seconds``): an overloaded engine
then falls further behind the higher the rate, as a real one would, instead of
draining a fixed backlog. (With ``programs`` given, every rate replays the same
programs instead; past the engines' capacity that degenerates into an offline
batch whose latency no longer grows with the rate.) Program i is the same at
every rate (same seed); only arrival times scale.

For every policy (or policy/balancer pair) the search doubles the rate until the
average latency per token exceeds the SLO, then bisects. Policies run in
parallel in a process pool. A run stops as soon as its average is sure to
exceed the SLO (``simulate(stop_above=...)``): the verdict is the same as a full
run's, and overloaded runs, the slowest, end early.

An average hides the tails, so every policy then runs once more, in full, at one
common rate (by default the highest rate every policy met; a policy whose search
ran that rate in full is not run again): its P95 and P99 program latency, its
first-call wait (:func:`~autellix_vllm.stats.tails`), and each program's
latency, which :func:`plot` draws as a CDF.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from ..plots import draw_latency_cdf, save_panels
from ..policy import PolicyConfig
from ..policy.routing import DEFAULT_LOCALITY_THRESHOLD
from ..stats import TAIL_KEYS
from ..workloads import ProgramSpec, generate, get_workload
from .presets import EnginePreset, get_preset
from .run import SimResult, simulate

BISECTIONS = 5  # the max rate is then known to within a factor 2**(1/32), ~2%
SEARCH_LIMIT = 8.0  # search no further than 8x the engines' nominal capacity


@dataclass(frozen=True)
class SweepSetup:
    """What one run simulates: the engines, the clients, and the trace's recipe (a
    workload at a rate, over a window of ``duration`` seconds or a fixed count)."""

    workload: str
    seed: int
    engines: int
    preset: str | EnginePreset  # a name, or a preset made with replace
    max_num_seqs: int | None
    config: PolicyConfig
    duration: float
    programs: int | None = None  # a fixed count instead of a fixed window
    slo: float = 0.0
    kv_offload_gib: float | None = None  # a host KV tier (None: the preset's)
    max_context: int | None = None  # the workload's context cap (None: its default)
    end_programs: bool = True  # clients end their programs (see simulate)
    retention_hints: bool = False  # clients send retention hints (see simulate)
    locality_threshold: int = DEFAULT_LOCALITY_THRESHOLD  # the locality balancer's (see simulate)
    table_sync_s: float | None = None  # the directory's report period (see simulate)

    def trace(self, rate: float) -> list[ProgramSpec]:
        count = self.programs or max(1, round(rate * self.duration))
        return generate(self.workload, count, rate, self.seed, self.max_context)

    def simulate(
        self, programs: list[ProgramSpec], policy: str, lb: str, timeline_of: str | None = None
    ) -> SimResult:
        """Run ``programs`` under ``policy`` on this setup's engines, balanced by ``lb``;
        the run stops early past ``slo`` (0: runs in full). ``timeline_of``: a
        program whose calls the result keeps (``SimResult.call_spans``)."""
        return simulate(
            programs,
            policy,
            engines=self.engines,
            lb=lb,
            locality_threshold=self.locality_threshold,
            preset=self.preset,
            max_num_seqs=self.max_num_seqs,
            config=self.config,
            stop_above=self.slo or None,  # no SLO yet while measuring it
            kv_offload_gib=self.kv_offload_gib,
            end_programs=self.end_programs,
            retention_hints=self.retention_hints,
            table_sync_s=self.table_sync_s,
            timeline_of=timeline_of,
        )


@dataclass
class Curve:
    key: str
    points: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    max_rate: float = 0.0
    censored: bool = False  # still within the SLO at the search limit
    # Rate -> each program's latency (seconds, sorted) in a full run at that rate:
    # the search's runs that were not stopped early, and the tails' run.
    program_latency: dict[float, list[float]] = field(default_factory=dict)


def run_at(setup: SweepSetup, policy: str, lb: str, rate: float) -> dict[str, Any]:
    """One run of ``policy`` on the setup's trace at ``rate``; it stops early past
    ``setup.slo`` (0: runs in full)."""
    return simulate_at(setup, policy, lb, rate).metrics


def simulate_at(setup: SweepSetup, policy: str, lb: str, rate: float) -> SimResult:
    """:func:`run_at`, with each program's latency too."""
    return setup.simulate(setup.trace(rate), policy, lb)


def unloaded_average(setup: SweepSetup, policy: str, lb: str) -> float:
    """The average latency per token of ``policy`` with programs about 20x further
    apart than the engines can serve them (or at the workload's own unloaded rate):
    the base of the SLO."""
    low = get_workload(setup.workload).unloaded_rate or capacity_rate(setup) / 20
    quiet = replace(setup, duration=100 / low, programs=None, slo=0.0)
    return run_at(quiet, policy, lb, low)["avg_latency_per_token"]


def capacity_rate(setup: SweepSetup) -> float:
    """Programs per second the engines could finish if always full of decodes."""
    preset = get_preset(setup.preset).with_max_num_seqs(setup.max_num_seqs)
    seqs = preset.max_num_seqs
    tokens_per_s = seqs / preset.step_time(seqs, 0) * setup.engines
    sample = generate(setup.workload, 300, 1.0, setup.seed, setup.max_context)
    mean_decode = sum(p.decode_tokens for p in sample) / len(sample)
    return tokens_per_s / mean_decode


def _search(setup: SweepSetup, key: str, policy: str, lb: str, start: float, limit: float) -> Curve:
    """Find the highest rate whose average latency per token is within the SLO."""
    curve = Curve(key)

    def ok(rate: float) -> bool:
        result = simulate_at(setup, policy, lb, rate)
        curve.points.append((rate, result.metrics))
        if not result.metrics["stopped_early"]:
            curve.program_latency[rate] = sorted(result.program_latency.values())
        return result.metrics["avg_latency_per_token"] <= setup.slo

    lo, hi = 0.0, start
    while hi <= limit:  # bracket: lo passes, hi fails
        if not ok(hi):
            break
        lo, hi = hi, hi * 2
    else:
        curve.max_rate, curve.censored = lo, True
    if lo == 0.0:  # fails at the first rate: halve until it passes
        hi = start
        for _ in range(10):
            if ok(hi / 2):
                lo = hi / 2
                break
            hi /= 2
    if lo and not curve.censored:
        for _ in range(BISECTIONS):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        curve.max_rate = lo
    curve.points.sort(key=lambda p: p[0])
    return curve


def common_max_rate(curves: Sequence[Curve]) -> float:
    """The highest rate every policy met: the lowest of their max rates (0: one met none)."""
    return min(c.max_rate for c in curves)


def _tails_at(
    pool: Executor, setup: SweepSetup, curves: list[Curve], runs: list[tuple[str, str, str]],
    rate: float,
) -> dict[str, Any]:  # fmt: skip
    """Every policy's full run at ``rate``: its average and tails for the result, each
    program's latency kept on its curve for the CDF. A policy whose search ran that
    rate in full (the one whose max rate it is) is not run again."""
    full = replace(setup, slo=0.0)
    missing = {
        curve.key: pool.submit(simulate_at, full, policy, lb, rate)
        for curve, (_, policy, lb) in zip(curves, runs, strict=True)
        if rate not in curve.program_latency
    }
    keys = ("avg_latency_per_token", *TAIL_KEYS)
    by_policy = {}
    for curve in curves:
        if curve.key in missing:
            result = missing[curve.key].result()
            curve.program_latency[rate] = sorted(result.program_latency.values())
            metrics = result.metrics
        else:
            metrics = dict(curve.points)[rate]
        by_policy[curve.key] = {key: metrics[key] for key in keys}
    return {"rate": rate, "by_policy": by_policy}


def _point_rows(curve: Curve) -> list[dict[str, Any]]:
    """The curve's runs, one row per rate: the average, and the tails of full runs (a
    run stopped early past the SLO has only a lower bound on the average)."""
    keys = ("stopped_early", "avg_latency_per_token", *TAIL_KEYS)
    return [{"rate": rate, **{k: m[k] for k in keys if k in m}} for rate, m in curve.points]


def sweep(
    workload: str,
    policies: Sequence[str],
    *,
    lbs: Sequence[str] = ("round-robin",),
    locality_threshold: int = DEFAULT_LOCALITY_THRESHOLD,
    engines: int = 1,
    preset: str | EnginePreset = "a100-llama8b",
    duration: float | None = None,
    programs: int | None = None,
    max_num_seqs: int | None = None,
    seed: int = 0,
    slo_factor: float = 5.0,
    config: PolicyConfig | None = None,
    workers: int = 2,
    on_done: Callable[[str], None] | None = None,
    kv_offload_gib: float | None = None,
    max_context: int | None = None,
    end_programs: bool = True,
    retention_hints: bool = False,
    tail_rate: float | None = None,
    tails: bool = True,
) -> tuple[dict[str, Any], list[Curve]]:
    """Max rate within the SLO for every policy (and balancer), then every policy's
    tails at ``tail_rate`` (None: :func:`common_max_rate`, the highest rate every one met;
    no tails if one met none, or without ``tails``); see the module doc."""
    if not policies or not lbs:
        raise ValueError("name at least one policy and one load balancer")
    if slo_factor <= 1:
        raise ValueError("the SLO factor must be > 1")
    if tail_rate is not None and tail_rate <= 0:
        raise ValueError(f"the rate of the tails must be positive, got {tail_rate:g}")
    spec = get_workload(workload)
    window = duration or spec.sweep_seconds
    setup = SweepSetup(
        workload, seed, engines, preset, max_num_seqs, config or PolicyConfig(), window, programs,
        kv_offload_gib=kv_offload_gib, max_context=max_context, end_programs=end_programs,
        retention_hints=retention_hints, locality_threshold=locality_threshold,
    )  # fmt: skip
    cap = capacity_rate(setup)
    runs = [(p if len(lbs) == 1 else f"{p}/{lb}", p, lb) for p in policies for lb in lbs]
    unloaded = unloaded_average(setup, runs[0][1], runs[0][2])
    slo = slo_factor * unloaded
    setup = replace(setup, slo=slo)
    curves: list[Curve] = []
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(_search, setup, *run, cap / 2, cap * SEARCH_LIMIT) for run in runs]
        for future in futures:
            curves.append(future.result())
            if on_done:
                on_done(curves[-1].key)
        rate = (tail_rate or common_max_rate(curves)) if tails else 0.0
        at_rate = _tails_at(pool, setup, curves, runs, rate) if rate else None
    first = curves[0].max_rate
    return {
        "workload": workload,
        "preset": get_preset(preset).name,
        "engines": engines,
        "locality_threshold": locality_threshold,
        "duration": None if programs else window,
        "programs": programs,
        "seed": seed,
        "slo_factor": slo_factor,
        "slo": slo,
        "unloaded_latency_per_token": unloaded,
        "max_rate": {c.key: c.max_rate for c in curves},
        "ratio": {c.key: (c.max_rate / first if first else math.inf) for c in curves},
        "censored": [c.key for c in curves if c.censored],
        "tails": at_rate,
        "points": {c.key: _point_rows(c) for c in curves},
        **({"kv_offload_gib": kv_offload_gib} if kv_offload_gib is not None else {}),
        **({"max_context": max_context} if max_context is not None else {}),
        **({} if end_programs else {"end_programs": False}),
        **({"retention_hints": True} if retention_hints else {}),
    }, curves


PLOT_CAPTION = (
    "left, average latency per token against arrival rate, one curve per policy (a"
    " policy's max rate is where its curve crosses the SLO, dashed); right, each"
    " policy's program latency CDF at the tails' rate"
)
# The tails table's columns: a metric of the result and its heading (seconds).
TAIL_COLUMNS = (
    ("avg_latency_per_token", "AVG/TOKEN"),
    ("p95_program_latency", "P95 PROGRAM"),
    ("p99_program_latency", "P99 PROGRAM"),
    ("avg_first_call_wait", "AVG FIRST WAIT"),
    ("p95_first_call_wait", "P95 FIRST WAIT"),
)


def text_table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as left-aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def format_sweep(result: dict[str, Any]) -> str:
    """:func:`sweep`'s result for a terminal: the setting and the SLO, then each
    policy's max rate and its ratio to the first policy's."""
    arrivals = (
        f"{result['programs']} programs" if result["programs"] else f"{result['duration']:g} s"
    )
    lines = [
        f"{result['workload']} on {result['engines']} engine(s) of {result['preset']},"
        f" seed {result['seed']}, {arrivals} of arrivals per rate",
        f"SLO: {result['slo']:.4g} s/token ({result['slo_factor']:g}x the unloaded"
        f" {result['unloaded_latency_per_token']:.4g} s/token)",
    ]
    first = next(iter(result["max_rate"]))
    rows = [("POLICY", "MAX RATE (programs/s)", f"VS {first}")]
    for key, rate in result["max_rate"].items():
        at_least = ">= " if key in result["censored"] else ""
        rows.append((key, f"{at_least}{rate:.2f}", f"{result['ratio'][key]:.2f}x"))
    lines += text_table(rows)
    if result["censored"]:
        lines.append(">=: still within the SLO at the search limit")
    lines += _format_tails(result["tails"])
    if "plot" in result:
        lines.append(f"plot: {result['plot']}: {PLOT_CAPTION}")
    return "\n".join(lines)


def _format_tails(tails: dict[str, Any] | None) -> list[str]:
    """The tails table: every policy's full run at the common rate."""
    if tails is None:
        return ["no tails: a policy met the SLO at no rate"]
    rows = [("POLICY", *(heading for _, heading in TAIL_COLUMNS))]
    for key, metrics in tails["by_policy"].items():
        rows.append((key, *(f"{metrics[metric]:.4g}" for metric, _ in TAIL_COLUMNS)))
    header = f"each policy in full at {tails['rate']:.3g} programs/s (seconds; AVG/TOKEN: s/token):"
    return ["", header, *text_table(rows)]


def plot(result: dict[str, Any], curves: list[Curve], title: str, path: str) -> Any:
    """Two panels: average latency per token against arrival rate, one curve per
    policy (the paper's Fig. 12); each policy's program latency CDF at the tails'
    rate. Returns the matplotlib figure."""
    tails = result["tails"]
    rate = tails["rate"] if tails else None
    panels = [lambda ax: _draw_curves(ax, curves, result["slo"], rate)]
    if tails is not None:
        latencies = {c.key: c.program_latency[rate] for c in curves}
        caption = f"at {rate:.3g} programs/s"
        panels.append(lambda ax: draw_latency_cdf(ax, latencies, caption))
    return save_panels(path, title, panels)


def _draw_curves(ax: Any, curves: list[Curve], slo: float, tail_rate: float | None) -> None:
    """Average latency per token against arrival rate, one curve per policy, and the
    rate of the tails (dotted)."""
    for curve in curves:
        full = [(r, m["avg_latency_per_token"]) for r, m in curve.points if not m["stopped_early"]]
        line = ax.plot(*zip(*full, strict=True), marker="o", markersize=3, label=curve.key)
        # Runs stopped past the SLO only have a lower bound: a triangle at the bound.
        stopped = [(r, m["avg_latency_per_token"]) for r, m in curve.points if m["stopped_early"]]
        if stopped:
            color = line[0].get_color()
            ax.plot(*zip(*stopped, strict=True), linestyle="", marker="^", color=color)
    ax.axhline(slo, color="grey", linestyle="--", linewidth=1, label="SLO")
    if tail_rate:
        ax.axvline(tail_rate, color="grey", linestyle=":", linewidth=1, label="tails' rate")
    ax.set_xlabel("arrival rate (programs/s)")
    ax.set_ylabel("avg latency per token (s)")
    ax.set_ylim(0, slo * 2.5)
    # Past the highest max rate the search only brackets: its points would squeeze
    # the curves into the left of the plot.
    ax.set_xlim(0, 1.5 * max((c.max_rate for c in curves), default=0.0) or None)
    ax.text(0.01, 0.99, "^ stopped early: latency at least this", transform=ax.transAxes,
            fontsize=7, verticalalignment="top")  # fmt: skip
    ax.legend(fontsize=8)
