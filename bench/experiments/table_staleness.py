"""Many engines behind the Ray Serve directory: what a stale service table costs.

The directory (``ray_serve.directory``) admits every call and learns how calls
ended in report batches, one per ingress every ``report_interval_s``; a call is
ranked by its program's service as of the last batch. This runs 16 and 64
simulated engines (``locality`` routing, what ``autellix serve`` and the Ray
request router run) at a fixed load per engine (the arrival rate scales with
the engine count), with one always fresh global table and with report batches
``--sync`` seconds apart (``simulate(table_sync_s=...)``, see
``sim/directory.py``), and prints per run:

* ``avg`` and ``p95``: average and P95 latency per token (s/token);
* ``admit/s`` and ``report/s``: messages per second to the table, over the
  run's simulated makespan (fresh: each ended call is its own report).

    python bench/experiments/table_staleness.py                      # mixed, seeds 10-14
    python bench/experiments/table_staleness.py --workload agent --engines 16 --seeds 10,11
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from autellix_vllm.policy import DEFAULT_POLICY
from autellix_vllm.sim.run import simulate
from autellix_vllm.workloads import generate

# Programs per second per engine: about 0.9x the default policy's highest rate
# within the SLO on one a100-llama8b-kv engine, seed 10 (docs/benchmarks.md's
# matrix: mixed 1.54 x 2.936, agent 3.59 x 0.003529), so that engines queue.
RATE_PER_ENGINE = {"mixed": 4.0, "agent": 0.011}
FRESH = "fresh"


def one_run(case: tuple[str, int, int, str, float, str, str]) -> dict[str, Any]:
    """One simulation: ``workload`` on ``engines`` engines, seed, table sync (s or fresh)."""
    workload, engines, seed, sync, duration, preset, lb = case
    rate = RATE_PER_ENGINE[workload] * engines
    programs = generate(workload, max(1, round(rate * duration)), rate, seed)
    sync_s = None if sync == FRESH else float(sync)
    metrics = simulate(
        programs, DEFAULT_POLICY, engines=engines, lb=lb, preset=preset, table_sync_s=sync_s
    ).metrics
    fresh_traffic = metrics["calls"] / metrics["makespan"]  # one admission, one report a call
    return {
        "workload": workload,
        "engines": engines,
        "seed": seed,
        "sync": sync,
        "rate": rate,
        "programs": len(programs),
        "avg": metrics["avg_latency_per_token"],
        "p95": metrics["p95_latency_per_token"],
        "admit_per_s": metrics.get("directory_admissions_per_s", fresh_traffic),
        "report_per_s": metrics.get("directory_reports_per_s", fresh_traffic),
    }


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["workload engines seed sync    rate  programs  avg       p95       admit/s report/s"]
    for r in rows:
        lines.append(
            f"{r['workload']:8} {r['engines']:7} {r['seed']:4} {r['sync']:6} {r['rate']:5.3g}"
            f" {r['programs']:9} {r['avg']:.6f}  {r['p95']:.6f}  {r['admit_per_s']:7.1f}"
            f" {r['report_per_s']:8.1f}"
        )
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    """``10-14`` or ``10,11``."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(part) for part in text.split(",")]


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    made.add_argument("--workload", choices=sorted(RATE_PER_ENGINE), default="mixed",
                      help="(default: %(default)s)")  # fmt: skip
    made.add_argument("--engines", type=_ints, default=[16, 64], help="(default: 16,64)")
    made.add_argument("--seeds", type=_ints, default=list(range(10, 15)),
                      help="(default: 10-14)")  # fmt: skip
    made.add_argument("--sync", default="fresh,0.1,1,10",
                      help="fresh or seconds between batches, comma-separated"
                      " (default: %(default)s)")  # fmt: skip
    made.add_argument("--duration", type=float, default=30.0,
                      help="seconds of arrivals per run (default: %(default)s)")  # fmt: skip
    made.add_argument("--preset", default="a100-llama8b-kv", help="(default: %(default)s)")
    made.add_argument("--lb", default="locality", help="(default: %(default)s)")
    made.add_argument("--workers", type=int, default=1, help="(default: %(default)s)")
    made.add_argument("--json", action="store_true", help="one JSON object per run")
    return made


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    cases = [
        (args.workload, engines, seed, sync, args.duration, args.preset, args.lb)
        for engines in args.engines for seed in args.seeds for sync in args.sync.split(",")
    ]  # fmt: skip
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        rows = []
        for row in pool.map(one_run, cases):
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    if not args.json:
        print(_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
