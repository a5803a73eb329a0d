"""What a client that claims the longest holds costs the other clients.

Programs of the agent workload are run by ``--owners`` clients in turn
(``with_owners``); every client sends honest retention hints (its programs'
next tool gaps, as ``autellix.expect_tool`` does), and clients never end
their programs, so a hold outlives a program's last call by its hint. Per
seed, two runs of the same trace: without and with ``owner-0`` claiming the
longest hold (``ResidencyConfig.max_ttl_s``) on every call. Reported: the
other owners' average and p95 latency per token, their ratio with / without
the claims (target <= 1.2), and ``owner-0``'s average share of the hold budget
while other owners' calls waited. ``--no-fair-share`` runs the same without
the fair share, for comparison.

    python bench/experiments/fair_share.py --seeds 10,11,12,13,14
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from autellix_vllm.policy import DEFAULT_POLICY, PolicyConfig, ResidencyConfig
from autellix_vllm.sim.run import simulate
from autellix_vllm.stats import percentile
from autellix_vllm.workloads import generate, with_owners

GREEDY = "owner-0"


def run(case: tuple[int, bool, bool, argparse.Namespace]) -> dict[str, Any]:
    """One run: the other owners' latencies and the greedy owner's held share."""
    seed, claims, fair, args = case
    programs = with_owners(generate(args.workload, args.programs, args.rate, seed), args.owners)
    owner = {p.program_id: p.owner for p in programs}
    result = simulate(
        programs, args.policy, preset=args.preset, retention_hints=True, end_programs=False,
        config=PolicyConfig(residency=ResidencyConfig(fair_share=fair)),
        greedy_owners=(GREEDY,) if claims else (),
    )  # fmt: skip
    others = sorted(v for k, v in result.latency_per_token.items() if owner[k] != GREEDY)
    return {
        "avg": statistics.fmean(others),
        "p95": percentile(others, 95),
        "greedy_held_share": result.metrics.get("held_share_while_others_wait", {}).get(
            GREEDY, 0.0
        ),
    }


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Per seed, the other owners' latency without and with the claims, and ratios."""
    cases = [
        (seed, claims, args.fair_share, args) for seed in args.seeds for claims in (False, True)
    ]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        runs = list(pool.map(run, cases))
    rows = []
    for k, seed in enumerate(args.seeds):
        honest, greedy = runs[2 * k], runs[2 * k + 1]
        rows.append({
            "seed": seed,
            "others_avg": [honest["avg"], greedy["avg"]],
            "others_p95": [honest["p95"], greedy["p95"]],
            "avg_ratio": greedy["avg"] / honest["avg"],
            "p95_ratio": greedy["p95"] / honest["p95"],
            "greedy_held_share": [honest["greedy_held_share"], greedy["greedy_held_share"]],
        })  # fmt: skip
    return {
        "fair_share": args.fair_share,
        "seeds": rows,
        "worst_avg_ratio": max(r["avg_ratio"] for r in rows),
        "worst_p95_ratio": max(r["p95_ratio"] for r in rows),
        "mean_avg_ratio": statistics.fmean(r["avg_ratio"] for r in rows),
        "mean_p95_ratio": statistics.fmean(r["p95_ratio"] for r in rows),
        "fair_share_of_budget": 1 / args.owners,
    }


def _seeds(text: str) -> list[int]:
    return [int(seed) for seed in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="agent", help="(default: %(default)s)")
    parser.add_argument("--preset", default="a100-llama8b-kv", help="(default: %(default)s)")
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="(default: %(default)s)")
    parser.add_argument(
        "--rate", type=float, default=0.015, help="programs/s (default: %(default)s)"
    )
    parser.add_argument("--programs", type=int, default=60, help="(default: %(default)s)")
    parser.add_argument("--owners", type=int, default=4, help="(default: %(default)s)")
    parser.add_argument("--seeds", type=_seeds, default=[0, 1, 2, 3, 4],
                        help="SEED,... (default: 0,1,2,3,4)")  # fmt: skip
    parser.add_argument("--no-fair-share", dest="fair_share", action="store_false",
                        help="hold by rank alone, whoever runs the programs")  # fmt: skip
    parser.add_argument("--workers", type=int, default=2, help="(default: %(default)s)")
    args = parser.parse_args(argv)
    print(json.dumps(compare(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
