"""The default policy against every other, in every setting (``autellix simulate matrix``).

A *cell* is one workload on one engine setting (a preset, a host KV tier, a
number of engines). For each cell the matrix

1. sweeps every policy (:func:`.sweep.sweep`): each one's highest arrival rate
   within the SLO and its ratio to the baseline's (``vllm-opt``, stock vLLM
   with prefix caching);
2. runs the default policy and the baseline side by side at fixed fractions of
   the baseline's highest rate (0.5x to 1.5x): the default's average latency per
   token over the baseline's, and both policies' tails, the P95 program latency
   and the P95 first-call wait (:func:`~autellix_vllm.stats.tails`).

and checks the claim "the default never loses" on it: its highest rate is at
least the baseline's and MLFQ's, and at every fixed rate its average latency
per token is at most :data:`LATENCY_TOLERANCE` times the baseline's. A cell that
misses says which part it missed.

Several engines are balanced with ``locality``, what ``autellix serve`` runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from ..policy import DEFAULT_POLICY, PolicyConfig
from ..policy.routing import DEFAULT_LOCALITY_THRESHOLD
from ..stats import TAIL_KEYS
from ..workloads import get_workload
from .presets import get_preset
from .sweep import SweepSetup, run_at, sweep

BASELINE = "vllm-opt"
# The policies a matrix sweeps by default: the baseline first (the ratios' base),
# the program-unaware MLFQ, the paper's KV-blind order, the default, and the
# clairvoyant oracle as the ceiling of a KV-blind order.
MATRIX_POLICIES = (BASELINE, "mlfq", "plas-atlas", DEFAULT_POLICY, "srpt")
MATRIX_WORKLOADS = ("sharegpt", "bfcl", "lats", "mixed", "agent")
# Fractions of the baseline's highest rate at which the latencies are compared.
RATE_MULTIPLES = (0.5, 0.75, 1.0, 1.25, 1.5)
# The default may be this much slower than the baseline at a fixed rate: the
# simulator's runs at one rate differ by a few percent from seed to seed.
LATENCY_TOLERANCE = 1.05
# The tails each fixed-rate point gives for both policies (seconds).
MATRIX_TAILS = tuple(key for key in TAIL_KEYS if key.startswith("p95_"))


@dataclass(frozen=True)
class EngineSetting:
    """An engine model: a preset, optionally with a host KV tier, and an engine count
    (several: balanced by ``locality`` with ``locality_threshold``, as the router)."""

    preset: str
    kv_offload_gib: float | None = None
    engines: int = 1
    locality_threshold: int = DEFAULT_LOCALITY_THRESHOLD

    @property
    def label(self) -> str:
        """The setting as :func:`setting` reads it, e.g. ``a100-llama8b-kv+64x4``."""
        tier = f"+{self.kv_offload_gib:g}" if self.kv_offload_gib else ""
        return f"{self.preset}{tier}x{self.engines}"

    @property
    def lb(self) -> str:
        return "locality" if self.engines > 1 else "round-robin"

    def sweep_setup(
        self, workload: str, seed: int, config: PolicyConfig, duration: float | None = None,
        **options: Any,
    ) -> SweepSetup:  # fmt: skip
        """The sweep's setup of ``workload`` on this setting (a window of ``duration``
        seconds of arrivals, None: the workload's; ``options``: SweepSetup's others)."""
        return SweepSetup(
            workload, seed, self.engines, self.preset, None, config,
            duration or get_workload(workload).sweep_seconds,
            kv_offload_gib=self.kv_offload_gib, locality_threshold=self.locality_threshold,
            **options,
        )  # fmt: skip


_SETTING = re.compile(r"(?P<preset>[^+]+?)(?:\+(?P<gib>\d+(?:\.\d+)?))?(?:x(?P<engines>\d+))?")


def setting(text: str) -> EngineSetting:
    """``PRESET[+HOST_GIB][xENGINES]``, e.g. ``a100-llama8b-kv+64x4``, as one setting."""
    match = _SETTING.fullmatch(text.strip())
    if not match:
        raise ValueError(
            f"not an engine setting: {text!r} (PRESET[+HOST_GIB][xENGINES],"
            " e.g. a100-llama8b-kv+64x4)"
        )
    preset = get_preset(match["preset"]).with_kv_offload_gib(
        float(match["gib"]) if match["gib"] else None
    )
    engines = int(match["engines"] or 1)
    if engines < 1:
        raise ValueError(f"an engine setting needs at least one engine: {text!r}")
    return EngineSetting(preset.name, preset.kv_offload_gib or None, engines)


# The settings of the matrix: both A100 presets, the context-aware one with a host
# tier of 64 and 256 GiB, each on one engine and on four.
MATRIX_SETTINGS = tuple(
    EngineSetting(preset, gib, engines)
    for engines in (1, 4)
    for preset, gib in (
        ("a100-llama8b", None),
        ("a100-llama8b-kv", None),
        ("a100-llama8b-kv", 64.0),
        ("a100-llama8b-kv", 256.0),
    )
)


def _fixed_rate(
    workload: str, where: EngineSetting, policy: str, rate: float, seed: int,
    config: PolicyConfig, duration: float | None, stop_above: float | None,
) -> dict[str, Any]:  # fmt: skip
    """One run at ``rate`` on the sweep's trace, stopped early past ``stop_above``."""
    setup = where.sweep_setup(workload, seed, config, duration, slo=stop_above or 0.0)
    return run_at(setup, policy, where.lb, rate)


def _latency_ratios(
    workload: str, where: EngineSetting, base_rate: float, seed: int, config: PolicyConfig,
    duration: float | None, multiples: Sequence[float], workers: int,
) -> dict[float, dict[str, Any]]:  # fmt: skip
    """The default's and the baseline's average latency per token at each multiple
    of the baseline's highest rate, and their :data:`MATRIX_TAILS`. The default's
    run stops as soon as it is sure to be past the tolerance (its figure is then a
    lower bound, and it has no tails: None)."""
    rates = [m * base_rate for m in multiples]
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        base_runs = [
            pool.submit(_fixed_rate, workload, where, BASELINE, rate, seed, config, duration, None)
            for rate in rates
        ]
        our_runs = [
            pool.submit(
                _fixed_rate, workload, where, DEFAULT_POLICY, rate, seed, config, duration,
                LATENCY_TOLERANCE * base.result()["avg_latency_per_token"],
            )  # fmt: skip
            for rate, base in zip(rates, base_runs, strict=True)
        ]
        baseline = [b.result() for b in base_runs]
        ours = [o.result() for o in our_runs]
    return {
        m: {
            "rate": r,
            BASELINE: b["avg_latency_per_token"],
            DEFAULT_POLICY: o["avg_latency_per_token"],
            "ratio": o["avg_latency_per_token"] / b["avg_latency_per_token"],
            "stopped_early": o["stopped_early"],
            **{key: {BASELINE: b[key], DEFAULT_POLICY: o.get(key)} for key in MATRIX_TAILS},
        }
        for m, r, b, o in zip(multiples, rates, baseline, ours, strict=True)
    }


def verdict(cell: dict[str, Any]) -> list[str]:
    """What the default missed in ``cell`` (empty: the cell is met)."""
    misses = []
    rates = cell["max_rate"]
    ours = rates[DEFAULT_POLICY]
    for other in (BASELINE, "mlfq"):
        if other in rates and ours < rates[other]:
            misses.append(f"max rate {ours / rates[other]:.2f}x {other}'s")
    for multiple, point in cell["latency"].items():
        if point["ratio"] > LATENCY_TOLERANCE:
            at_least = ">= " if point["stopped_early"] else ""
            misses.append(f"latency {at_least}{point['ratio']:.2f}x at {multiple:g}x")
    return misses


def matrix(
    workloads: Iterable[str] = MATRIX_WORKLOADS,
    settings: Iterable[EngineSetting] = MATRIX_SETTINGS,
    *,
    policies: Sequence[str] = MATRIX_POLICIES,
    seed: int = 0,
    duration: float | None = None,
    multiples: Sequence[float] = RATE_MULTIPLES,
    config: PolicyConfig | None = None,
    workers: int = 2,
    locality_threshold: int = DEFAULT_LOCALITY_THRESHOLD,
    on_policy_done: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Each cell's result as it is done: setting, workload, max rates and ratios,
    the latency comparison at ``multiples``, and ``misses`` (see :func:`verdict`).
    ``duration``: seconds of arrivals per trace (None: each workload's own);
    ``locality_threshold``: the router's, where a setting has several engines."""
    if policies[0] != BASELINE or DEFAULT_POLICY not in policies:
        raise ValueError(f"a matrix compares {DEFAULT_POLICY} with {BASELINE}: name"
                         f" {BASELINE} first and {DEFAULT_POLICY} among the policies")  # fmt: skip
    config = config or PolicyConfig()
    for where in settings:
        where = replace(where, locality_threshold=locality_threshold)
        for workload in workloads:
            result, _ = sweep(
                workload, policies, lbs=(where.lb,), engines=where.engines,
                preset=where.preset, seed=seed, config=config, workers=workers, duration=duration,
                kv_offload_gib=where.kv_offload_gib, locality_threshold=where.locality_threshold,
                on_done=on_policy_done, tails=False,  # the fixed rates below have them
            )  # fmt: skip
            cell = {
                "setting": where.label,
                "workload": workload,
                "seed": seed,
                "locality_threshold": where.locality_threshold,
                "slo": result["slo"],
                "max_rate": result["max_rate"],
                "ratio": result["ratio"],
                "censored": result["censored"],
            }
            base_rate = result["max_rate"][BASELINE]
            cell["latency"] = _latency_ratios(
                workload, where, base_rate, seed, config, duration, multiples, workers
            )
            cell["misses"] = verdict(cell)
            yield cell


def _width(policy: str) -> int:
    """A policy's column: its name, at least a ratio and its mark wide."""
    return max(6, len(policy))


def format_row(cell: dict[str, Any], policies: Sequence[str]) -> str:
    """One cell as a table row: each policy's ratio, the worst latency ratio, the verdict."""
    ratios = "  ".join(
        f"{cell['ratio'][p]:>{_width(p) - 1}.2f}{'+' if p in cell['censored'] else ' '}"
        for p in policies
    )
    worst = max(cell["latency"].items(), key=lambda item: item[1]["ratio"])
    latency = f"{worst[1]['ratio']:.2f}@{worst[0]:g}x"
    verdict_text = "met" if not cell["misses"] else "MISS: " + "; ".join(cell["misses"])
    return (
        f"{cell['setting']:<24} {cell['workload']:<9} {ratios}  {latency:>10}  {verdict_text}"
    )


def format_header(policies: Sequence[str], locality_threshold: int) -> str:
    """What the rows measure (the routing of several engines too), and their columns."""
    names = "  ".join(f"{p:>{_width(p)}}" for p in policies)
    return (
        f"highest rates within the SLO over {policies[0]}'s; several engines routed by"
        f" locality, threshold {locality_threshold} prompt tokens\n"
        f"{'SETTING':<24} {'WORKLOAD':<9} {names}  {'WORST LAT':>10}  VERDICT"
    )


def format_tails(cells: Sequence[dict[str, Any]]) -> str:
    """The cells' tails as a table: at each fixed rate, the default's P95 program
    latency and P95 first-call wait over the baseline's (``-``: the default's run
    stopped early past the latency tolerance, so it has no tails)."""
    multiples = list(cells[0]["latency"]) if cells else []
    heads = "  ".join(f"{f'{m:g}x':>11}" for m in multiples)
    lines = [
        f"tails, {DEFAULT_POLICY} over {BASELINE} at each fixed rate:"
        " P95 program latency / P95 first-call wait",
        f"{'SETTING':<24} {'WORKLOAD':<9} {heads}",
    ]
    for cell in cells:
        points = "  ".join(f"{_tail_ratios(cell['latency'][m]):>11}" for m in multiples)
        lines.append(f"{cell['setting']:<24} {cell['workload']:<9} {points}")
    return "\n".join(lines)


def _tail_ratios(point: dict[str, Any]) -> str:
    """``0.98/1.20``: the default's tails over the baseline's at one fixed rate."""
    ratios = []
    for key in MATRIX_TAILS:
        ours, base = point[key][DEFAULT_POLICY], point[key][BASELINE]
        ratios.append("-" if ours is None else f"{ours / base:.2f}" if base else "inf")
    return "/".join(ratios)
