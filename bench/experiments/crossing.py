"""Where exactly a policy crosses the SLO: a fine grid of rates around a guess.

A sweep's bisection knows the highest rate within the SLO to about 2%, and
near it the average latency per token is chaotic, so two policies' ratio from
one sweep can be off by a step. This runs ``--points`` rates ``--step`` apart
around each policy's guessed crossing, with the sweep's SLO (5x vllm-opt's
unloaded average), and prints every rate's average with the highest passing
and the lowest failing rate, and their ratios to the first policy's.

    python bench/experiments/crossing.py --workload agent --seed 0 \\
        --guess vllm-opt:0.00792,autellix:0.0121
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from autellix_vllm.policy import PolicyConfig
from autellix_vllm.sim.matrix import BASELINE, setting
from autellix_vllm.sim.sweep import SweepSetup, run_at, unloaded_average


def _average(case: tuple[SweepSetup, str, str, float]) -> float:
    return run_at(*case)["avg_latency_per_token"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="agent", help="(default: %(default)s)")
    parser.add_argument("--setting", type=setting, default=setting("a100-llama8b-kv"),
                        help="PRESET[+HOST_GIB][xENGINES] (default: a100-llama8b-kv)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument(
        "--guess", required=True,
        help="each policy's guessed crossing, POLICY:RATE,...; the first is the base",
    )  # fmt: skip
    parser.add_argument("--points", type=int, default=21, help="(default: %(default)s)")
    parser.add_argument("--step", type=float, default=0.006, help="(default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="(default: %(default)s)")
    args = parser.parse_args(argv)
    where = args.setting
    guesses = {p: float(r) for p, r in (part.split(":") for part in args.guess.split(","))}
    setup = where.sweep_setup(args.workload, args.seed, PolicyConfig())
    # The sweep's SLO: 5x the baseline's unloaded average.
    setup = replace(setup, slo=5.0 * unloaded_average(setup, BASELINE, where.lb))
    low = 1 - args.step * (args.points - 1) / 2
    crossing = {}
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for policy, guess in guesses.items():
            rates = [guess * (low + args.step * i) for i in range(args.points)]
            values = list(pool.map(_average, [(setup, policy, where.lb, r) for r in rates]))
            passing = [r for r, v in zip(rates, values, strict=True) if v <= setup.slo]
            failing = [r for r, v in zip(rates, values, strict=True) if v > setup.slo]
            crossing[policy] = (max(passing, default=0.0), min(failing, default=0.0))
            print(json.dumps({"policy": policy, "slo": setup.slo,
                              "averages": dict(zip(rates, values, strict=True))}))  # fmt: skip
    base = crossing[next(iter(guesses))]
    for policy, (passing, failing) in crossing.items():
        print(json.dumps({
            "policy": policy, "highest_passing": passing, "lowest_failing": failing,
            "ratio_passing": passing / base[0] if base[0] else None,
            "ratio_failing": failing / base[1] if base[1] else None,
        }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
