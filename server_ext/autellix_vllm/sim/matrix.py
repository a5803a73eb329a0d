"""The default policy against every other, in every setting (``autellix simulate matrix``).

A *cell* is one workload on one engine setting (a preset, a host KV tier, a
number of engines). For each cell the matrix

1. sweeps every policy (:func:`.sweep.sweep`): each one's highest arrival rate
   within the SLO and its ratio to the baseline's (``vllm-opt``, stock vLLM
   with prefix caching); the peers among them (:data:`PEER_POLICIES`, the
   systems a user would pick instead) name the cell's *best peer*, the one with
   the highest rate;
2. runs the default, the baseline and the best peer side by side, in full, at
   fixed fractions of the baseline's highest rate (0.5x to 1.5x): their average
   latency per token and their tails, the P95 program latency and the P95
   first-call wait (:func:`~autellix_vllm.stats.tails`).

and judges the default on two sets of criteria, each miss named:

* *never lose* (the matrix's first claim): its highest rate is at least the
  baseline's and MLFQ's, and at every fixed rate its average latency per token
  is at most :data:`LATENCY_TOLERANCE` times the baseline's
  (:func:`never_lose_misses`);
* *the targets* (issue 39): its highest rate is at least every peer's, and
  :data:`PEER_RATE_MARGIN` times the best peer's on :data:`PEER_MARGIN_WORKLOADS`;
  at every fixed rate its P95 program latency is at most the baseline's and the
  best peer's, and its P95 first-call wait at most the baseline's
  (:func:`target_misses`).

Several engines are balanced with ``locality``, what ``autellix serve`` runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from ..policy import DEFAULT_POLICY, PolicyConfig
from ..policy.policies import PEER_POLICIES
from ..policy.routing import DEFAULT_LOCALITY_THRESHOLD
from ..stats import TAIL_KEYS
from ..workloads import get_workload
from .presets import get_preset
from .sweep import SweepSetup, run_at, sweep

BASELINE = "vllm-opt"
# The policies a matrix sweeps by default: the baseline first (the ratios' base),
# the program-unaware MLFQ, the paper's KV-blind order, the default, the
# clairvoyant oracle as the ceiling of a KV-blind order, and the peers.
MATRIX_POLICIES = (BASELINE, "mlfq", "plas-atlas", DEFAULT_POLICY, "srpt", *PEER_POLICIES)
MATRIX_WORKLOADS = ("sharegpt", "bfcl", "lats", "mixed", "agent")
# Fractions of the baseline's highest rate at which the latencies are compared.
RATE_MULTIPLES = (0.5, 0.75, 1.0, 1.25, 1.5)
# The default may be this much slower than the baseline at a fixed rate: the
# simulator's runs at one rate differ by a few percent from seed to seed.
LATENCY_TOLERANCE = 1.05
# Where programs are long agents (sessions, and the mix of ReAct, tree search
# and chat), the default's highest rate is to beat the best peer's by this factor.
PEER_RATE_MARGIN = 1.2
PEER_MARGIN_WORKLOADS = ("agent", "mixed")
# Tails this close (relative) are even: two policies that serve a trace alike
# differ only in the rounding of summed times.
TAIL_ROUNDING = 1e-9
# The tails each fixed-rate point gives for each policy run there (seconds).
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


def best_peer(max_rate: dict[str, float]) -> str | None:
    """The peer with the highest rate among those swept (the first of a tie; None:
    no peer swept)."""
    peers = [p for p in PEER_POLICIES if p in max_rate]
    return max(peers, key=lambda p: max_rate[p]) if peers else None


def _fixed_rate(
    workload: str, where: EngineSetting, policy: str, rate: float, seed: int,
    config: PolicyConfig, duration: float | None,
) -> dict[str, Any]:  # fmt: skip
    """One full run at ``rate`` on the sweep's trace."""
    return run_at(where.sweep_setup(workload, seed, config, duration), policy, where.lb, rate)


def _fixed_rates(
    workload: str, where: EngineSetting, base_rate: float, seed: int, config: PolicyConfig,
    duration: float | None, multiples: Sequence[float], workers: int, peer: str | None,
) -> dict[float, dict[str, Any]]:  # fmt: skip
    """The baseline, the default and ``peer`` (None: none) at each multiple of the
    baseline's highest rate: each one's average latency per token (under its name),
    the default's over the baseline's (``ratio``), and each one's :data:`MATRIX_TAILS`.
    Every run is in full: the tails need every program's end."""
    policies = [BASELINE, DEFAULT_POLICY, *([peer] if peer else [])]
    rates = [m * base_rate for m in multiples]
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [
            {p: pool.submit(_fixed_rate, workload, where, p, rate, seed, config, duration)
             for p in policies}
            for rate in rates
        ]  # fmt: skip
        runs = [{p: future.result() for p, future in at_rate.items()} for at_rate in futures]
    points = {}
    for multiple, rate, by_policy in zip(multiples, rates, runs, strict=True):
        averages = {p: run["avg_latency_per_token"] for p, run in by_policy.items()}
        points[multiple] = {
            "rate": rate,
            **averages,
            "ratio": averages[DEFAULT_POLICY] / averages[BASELINE],
            **{key: {p: run[key] for p, run in by_policy.items()} for key in MATRIX_TAILS},
        }
    return points


def _over(ours: float, theirs: float) -> float:
    """``ours / theirs``, for a miss's text and the tails table (0 over 0 is even)."""
    if theirs:
        return ours / theirs
    return 1.0 if not ours else math.inf


def never_lose_misses(cell: dict[str, Any]) -> list[str]:
    """What the default missed of "never lose" in ``cell`` (empty: met): a highest rate
    below the baseline's or MLFQ's, an average latency per token past
    :data:`LATENCY_TOLERANCE` times the baseline's at a fixed rate."""
    misses = []
    rates = cell["max_rate"]
    ours = rates[DEFAULT_POLICY]
    for other in (BASELINE, "mlfq"):
        if other in rates and ours < rates[other]:
            misses.append(f"max rate {ours / rates[other]:.2f}x {other}'s")
    for multiple, point in cell["latency"].items():
        if point["ratio"] > LATENCY_TOLERANCE:
            misses.append(f"latency {point['ratio']:.2f}x at {multiple:g}x")
    return misses


def target_misses(cell: dict[str, Any]) -> list[str]:
    """What the default missed of issue 39's targets in ``cell`` (empty: met): a highest
    rate below a peer's (below :data:`PEER_RATE_MARGIN` times the best peer's on
    :data:`PEER_MARGIN_WORKLOADS`); at a fixed rate, a P95 program latency above the
    baseline's or the best peer's, a P95 first-call wait above the baseline's (beyond
    :data:`TAIL_ROUNDING`).
    Without a peer among the policies only the baseline's tails are judged."""
    misses = []
    rates = cell["max_rate"]
    ours = rates[DEFAULT_POLICY]
    peer = cell["best_peer"]
    for other in (p for p in PEER_POLICIES if p in rates):
        margin = 1.0
        name = other
        if other == peer and cell["workload"] in PEER_MARGIN_WORKLOADS:
            margin, name = PEER_RATE_MARGIN, f"best peer {other}"
        if ours < margin * rates[other]:
            misses.append(f"rate vs {name} {ours / rates[other]:.2f}x < {margin:g}x")
    judged = (
        ("p95_program_latency", "program P95", (BASELINE, *([peer] if peer else []))),
        ("p95_first_call_wait", "first-call P95", (BASELINE,)),
    )
    for multiple, point in cell["latency"].items():
        for key, label, others in judged:
            tail = point[key]
            for other in others:
                ours, theirs = tail[DEFAULT_POLICY], tail[other]
                if ours > theirs and not math.isclose(ours, theirs, rel_tol=TAIL_ROUNDING):
                    ratio = _over(ours, theirs)
                    misses.append(f"{label} at {multiple:g}x {ratio:.3f}x {other}'s")
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
    """Each cell's result as it is done: setting, workload, max rates and ratios, the
    best peer, the comparison at ``multiples``, and the misses of each set of criteria
    (``never_lose_misses``, ``target_misses``: see the module doc).
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
            cell["best_peer"] = best_peer(result["max_rate"])
            cell["latency"] = _fixed_rates(
                workload, where, result["max_rate"][BASELINE], seed, config, duration,
                multiples, workers, cell["best_peer"],
            )  # fmt: skip
            cell["never_lose_misses"] = never_lose_misses(cell)
            cell["target_misses"] = target_misses(cell)
            yield cell


def _width(policy: str) -> int:
    """A policy's column: its name, at least a ratio and its mark wide."""
    return max(6, len(policy))


def format_row(cell: dict[str, Any], policies: Sequence[str]) -> str:
    """One cell as a table row: each policy's ratio, the worst latency ratio, and the
    verdict on each set of criteria, every miss named."""
    ratios = "  ".join(
        f"{cell['ratio'][p]:>{_width(p) - 1}.2f}{'+' if p in cell['censored'] else ' '}"
        for p in policies
    )
    worst = max(cell["latency"].items(), key=lambda item: item[1]["ratio"])
    latency = f"{worst[1]['ratio']:.2f}@{worst[0]:g}x"
    targets = "targets" if cell["best_peer"] else "targets (no peer swept)"
    verdict_text = (
        f"never lose: {_verdict_text(cell['never_lose_misses'])} |"
        f" {targets}: {_verdict_text(cell['target_misses'])}"
    )
    return f"{cell['setting']:<24} {cell['workload']:<9} {ratios}  {latency:>10}  {verdict_text}"


def _verdict_text(misses: Sequence[str]) -> str:
    """``met``, or ``MISS: `` and each miss."""
    return "MISS: " + "; ".join(misses) if misses else "met"


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
    latency and P95 first-call wait over the baseline's, and its P95 program latency
    over the best peer's (``-``: no peer swept)."""
    multiples = list(cells[0]["latency"]) if cells else []
    heads = "  ".join(f"{f'{m:g}x':>14}" for m in multiples)
    lines = [
        f"tails, {DEFAULT_POLICY}'s at each fixed rate: P95 program latency / P95 first-call"
        f" wait over {BASELINE}'s / P95 program latency over the best peer's",
        f"{'SETTING':<24} {'WORKLOAD':<9} {'BEST PEER':<12} {heads}",
    ]
    for cell in cells:
        peer = cell["best_peer"]
        points = "  ".join(f"{_tail_ratios(cell['latency'][m], peer):>14}" for m in multiples)
        lines.append(f"{cell['setting']:<24} {cell['workload']:<9} {peer or '-':<12} {points}")
    return "\n".join(lines)


def _tail_ratios(point: dict[str, Any], peer: str | None) -> str:
    """``0.98/1.20/0.95``: the default's tails over the baseline's and its program
    latency over ``peer``'s at one fixed rate."""
    program, first_call = point["p95_program_latency"], point["p95_first_call_wait"]
    ratios = [
        _over(program[DEFAULT_POLICY], program[BASELINE]),
        _over(first_call[DEFAULT_POLICY], first_call[BASELINE]),
        _over(program[DEFAULT_POLICY], program[peer]) if peer else None,
    ]
    return "/".join("-" if r is None else f"{r:.2f}" for r in ratios)
