"""Sweep the parameters the paper leaves open and print markdown tables.

    python tests/bench/tune_defaults.py [--quick]

For each workload the rate is fixed just past vllm-opt's SLO-bound max rate
(where the policies differ most) and every candidate runs the same trace:

* levels: K in {4, 6, 8} x growth {2, 4} from a first boundary of 128, and
  first boundaries 64 and 256 at K = 6, growth 4;
* beta (anti-starvation) in {2, 4, 8, 16, 32, off};
* the weight of a prefilled token in the service unit, {0, 1/16, 1/4, 1};
* ATLAS variant (program scalar vs per-thread critical path) on lats.

The numbers behind docs/scheduling.md come from this script.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from concurrent.futures import ProcessPoolExecutor

from autellix_vllm.policy import Levels, PolicyConfig, ServiceMeter
from autellix_vllm.sim import generate, simulate

# Rates just past vllm-opt's max rate on a100-llama8b (docs/benchmarks.md).
RATES = {"sharegpt": 2.6, "bfcl": 10.0, "lats": 1.6, "mixed": 2.0}
DURATION = {"sharegpt": 300.0, "bfcl": 120.0, "lats": 200.0, "mixed": 150.0}


def run(workload: str, config: PolicyConfig, policy: str = "autellix") -> dict:
    rate = RATES[workload]
    programs = generate(workload, round(rate * DURATION[workload]), rate, seed=0)
    return simulate(programs, policy, config=config).metrics


def row(label: str, m: dict) -> str:
    return (
        f"| {label} | {m['avg_latency_per_token']:.4f} | {m['p95_latency_per_token']:.4f} "
        f"| {m['p99_latency_per_token']:.4f} | {m['preemptions']} | {m['promotions']} |"
    )


HEADER = "| setting | avg s/tok | p95 | p99 | preemptions | promotions |\n|---|---|---|---|---|---|"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sharegpt and lats only")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    workloads = ["sharegpt", "lats"] if args.quick else ["sharegpt", "bfcl", "lats", "mixed"]

    jobs: list[tuple[str, str, PolicyConfig, str]] = []
    for wl in workloads:
        jobs.append((f"{wl}: levels", "vllm-opt (baseline)", PolicyConfig(), "vllm-opt"))
        grid = [(k, 128, g) for k, g in itertools.product((4, 6, 8), (2, 4))]
        grid += [(6, 64, 4), (6, 256, 4)]
        for k, first, growth in grid:
            levels = Levels.geometric(k, first, growth)
            jobs.append((f"{wl}: levels", f"K={k} first={first} x{growth}",
                         PolicyConfig(levels=levels), "autellix"))
        for beta in (2, 4, 8, 16, 32, 1e12):
            name = "off" if beta > 1e6 else f"{beta:g}"
            jobs.append((f"{wl}: beta", f"beta={name}", PolicyConfig(beta=beta), "autellix"))
        for weight in (0.0, 0.0625, 0.25, 1.0):
            meter = ServiceMeter(prefill_weight=weight)
            jobs.append((f"{wl}: prefill weight", f"weight={weight:g}",
                         PolicyConfig(meter=meter), "autellix"))
    if "lats" in workloads:
        for variant in ("program", "thread"):
            jobs.append(("lats: ATLAS variant", variant,
                         PolicyConfig(atlas_variant=variant), "atlas"))

    with ProcessPoolExecutor(args.workers) as pool:
        results = pool.map(run, [j[0].split(":")[0] for j in jobs], [j[2] for j in jobs],
                           [j[3] for j in jobs])
        section = None
        for (group, label, _, _), metrics in zip(jobs, results, strict=True):
            if group != section:
                section = group
                rate = RATES[group.split(":")[0]]
                print(f"\n### {group} (rate {rate}/s)\n\n{HEADER}")
            print(row(label, metrics), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
