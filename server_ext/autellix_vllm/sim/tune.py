"""Sweep the parameters the paper leaves open: ``autellix simulate tune``.

For each workload the rate is fixed just past vllm-opt's SLO-bound max rate
(where the policies differ most) and every candidate runs the same trace:

* levels: K in {4, 6, 8} x growth {2, 4} from a first boundary of 128, and
  first boundaries 64 and 256 at K = 6, growth 4;
* beta (anti-starvation) in {2, 4, 8, 16, 32, off};
* the weight of a prefilled token in the service unit, {0, 1/16, 1/4, 1};
* ATLAS variant (program scalar vs per-thread critical path) on lats.

The tables of docs/scheduling.md come from here (markdown, one per setting).
"""

from __future__ import annotations

import itertools
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..policy import DEFAULT_POLICY, Levels, PolicyConfig, ServiceMeter
from ..workloads import generate, get_workload
from .run import simulate

# The workloads tuned, each at a rate just past vllm-opt's max rate on
# a100-llama8b (docs/benchmarks.md).
RATES = {"sharegpt": 2.6, "bfcl": 10.0, "lats": 1.6, "mixed": 2.0}
QUICK_WORKLOADS = ("sharegpt", "lats")

HEADER = "| setting | avg s/tok | p95 | p99 | preemptions | promotions |\n|---|---|---|---|---|---|"


@dataclass(frozen=True)
class Candidate:
    """One row of a table: a policy and its configuration on one workload."""

    workload: str
    table: str  # what the table varies, e.g. "beta"
    label: str
    config: PolicyConfig
    policy: str = DEFAULT_POLICY


def candidates(workloads: list[str]) -> list[Candidate]:
    """Every row of every table, in print order."""
    rows: list[Candidate] = []
    for wl in workloads:
        rows.append(Candidate(wl, "levels", "vllm-opt (baseline)", PolicyConfig(), "vllm-opt"))
        grid = [(k, 128, g) for k, g in itertools.product((4, 6, 8), (2, 4))]
        grid += [(6, 64, 4), (6, 256, 4)]
        for k, first, growth in grid:
            config = PolicyConfig(levels=Levels.geometric(k, first, growth))
            rows.append(Candidate(wl, "levels", f"K={k} first={first} x{growth}", config))
        for beta in (2, 4, 8, 16, 32, 1e12):
            name = "off" if beta > 1e6 else f"{beta:g}"
            rows.append(Candidate(wl, "beta", f"beta={name}", PolicyConfig(beta=beta)))
        for weight in (0.0, 0.0625, 0.25, 1.0):
            meter = ServiceMeter(prefill_weight=weight)
            rows.append(
                Candidate(wl, "prefill weight", f"weight={weight:g}", PolicyConfig(meter=meter))
            )
    if "lats" in workloads:
        for variant in ("program", "thread"):
            config = PolicyConfig(atlas_variant=variant)
            rows.append(Candidate("lats", "ATLAS variant", variant, config, "atlas"))
    return rows


def run(candidate: Candidate) -> dict[str, Any]:
    """The candidate's metrics on its workload's trace (the same trace for every row):
    the programs arriving in the workload's sweep window."""
    rate = RATES[candidate.workload]
    count = round(rate * get_workload(candidate.workload).sweep_seconds)
    programs = generate(candidate.workload, count, rate, seed=0)
    return simulate(programs, candidate.policy, config=candidate.config).metrics


def row(label: str, m: dict[str, Any]) -> str:
    return (
        f"| {label} | {m['avg_latency_per_token']:.4f} | {m['p95_latency_per_token']:.4f} "
        f"| {m['p99_latency_per_token']:.4f} | {m['preemptions']} | {m['promotions']} |"
    )


def print_tables(quick: bool = False, workers: int = 2) -> None:
    """Run every candidate (of sharegpt and lats only if ``quick``) on ``workers``
    processes; print the tables as their rows finish."""
    rows = candidates(list(QUICK_WORKLOADS if quick else RATES))
    with ProcessPoolExecutor(workers) as pool:
        table = None
        for candidate, metrics in zip(rows, pool.map(run, rows), strict=True):
            if (candidate.workload, candidate.table) != table:
                table = (candidate.workload, candidate.table)
                rate = RATES[candidate.workload]
                title = f"### {candidate.workload}: {candidate.table} (rate {rate}/s)"
                print(f"\n{title}\n\n{HEADER}")
            print(row(candidate.label, metrics), flush=True)
