"""The real-engine agent A/B, simulated over many seeds, speeds and time scales.

One run of ``autellix bench engine --workload agent`` (the KV-bound bench:
SmolLM2, 8 seats, 96 blocks) is 14 programs: a short program more or less in a
seat moves its ratio by a tenth, and one machine's speed decides which. This
replays the bench's workload in the simulator (the ``cpu-smollm2`` preset, its
KV capped as the bench caps the engine's) at each point of a grid of workload
seeds, probe speeds (tokens/s, which set the arrival rate) and time scales (the
preset's step costs times the scale, as ``autellix bench fidelity`` calibrates
it), under FCFS and the candidate policy, and prints per point:

* ``avg_ratio`` and ``p95_ratio``: FCFS's average (P95) latency per token over
  the candidate's, as the bench reports them;
* ``short_over``: programs of the shorter half (by total tokens) whose latency
  per token is more than 1.1x their FCFS latency: "short programs never pay".

    python bench/experiments/replica_grid.py                      # 12 seeds x 5 x 3
    python bench/experiments/replica_grid.py --seeds 0-3 --policy plas-atlas --json
    python bench/experiments/replica_grid.py --programs 24 --max-model-len 1536 --kv-blocks 64

The last replays another mix of the same agents (the bench's flags of the same
names): 24 sessions whose contexts end at 1,536 tokens, in 64 KV blocks.
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from autellix_vllm.bench.fidelity import FidelitySettings
from autellix_vllm.bench.replay import BenchSettings, build_workload, scaled_levels, spread
from autellix_vllm.policy import DEFAULT_POLICY, Levels, PolicyConfig
from autellix_vllm.sim.run import simulate
from autellix_vllm.stats import percentile

# The probe speeds engine runs measured (tokens/s) and the time scales fidelity
# runs calibrated (0.73-0.93), the grid's defaults.
SPEEDS = (170.0, 190.0, 210.0, 234.0, 260.0)
SCALES = (0.736, 0.85, 0.933)
SHORT_LIMIT = 1.1  # a short program may be this much slower than under FCFS


@dataclass(frozen=True)
class Mix:
    """The agent bench's shape: sessions, their context limit, the engine's KV blocks."""

    programs: int = 14
    max_model_len: int = 2560
    kv_blocks: int = 96


def bench_settings(seed: int, policy: str, mix: Mix = Mix()) -> BenchSettings:
    """The KV-bound agent bench of docs/benchmarks.md, on workload seed ``seed``."""
    return BenchSettings(
        workload="agent", programs=mix.programs, max_num_seqs=8,
        max_model_len=mix.max_model_len, kv_blocks=mix.kv_blocks, policy=policy, seed=seed,
    )  # fmt: skip


def replica(point: tuple[int, float, float, str, Mix]) -> dict[str, Any]:
    """One grid point: FCFS and ``policy`` on the simulated bench."""
    seed, speed, scale, policy, mix = point
    bench = bench_settings(seed, policy, mix)
    settings = FidelitySettings.for_bench(bench)
    programs = spread(build_workload(bench), bench.arrival_window, speed)
    config = PolicyConfig(levels=Levels.parse(scaled_levels(bench)))
    latency = {
        scheduler: simulate(
            programs, sim_policy, preset=settings.engine_preset(scale),
            max_num_seqs=bench.max_num_seqs, config=config,
        ).latency_per_token  # fmt: skip
        for scheduler, sim_policy in settings.sim_policies.items()
    }
    fcfs, ours = latency["fcfs"], latency["autellix"]
    tokens = {p.program_id: sum(c.prompt_tokens + c.decode_tokens for c in p.calls)
              for p in programs}  # fmt: skip
    shorter = sorted(tokens, key=tokens.get)[: len(tokens) // 2]
    return {
        "seed": seed,
        "speed": speed,
        "scale": scale,
        "avg_ratio": statistics.fmean(fcfs.values()) / statistics.fmean(ours.values()),
        "p95_ratio": percentile(list(fcfs.values()), 95) / percentile(list(ours.values()), 95),
        "short_over": sorted(p for p in shorter if ours[p] > SHORT_LIMIT * fcfs[p]),
    }


def grid(
    seeds: list[int],
    speeds: list[float],
    scales: list[float],
    policy: str,
    workers: int,
    mix: Mix = Mix(),
) -> list[dict[str, Any]]:
    points = [(seed, speed, scale, policy, mix)
              for seed in seeds for speed in speeds for scale in scales]  # fmt: skip
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(replica, points))


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    avg = [r["avg_ratio"] for r in rows]
    return {
        "points": len(rows),
        "mean_avg_ratio": statistics.fmean(avg),
        "min_avg_ratio": min(avg),
        "points_below_1": sum(a < 1 for a in avg),
        "points_below_1.5": sum(a < 1.5 for a in avg),
        "mean_p95_ratio": statistics.fmean(r["p95_ratio"] for r in rows),
        "points_with_a_short_program_over_1.1x": sum(bool(r["short_over"]) for r in rows),
    }


def _range(text: str) -> list[int]:
    """``0-11`` or ``0,2,5``."""
    if "-" in text:
        first, last = text.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(part) for part in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=_range, default=list(range(12)), help="(default: 0-11)")
    numbers = lambda text: [float(s) for s in text.split(",")]  # noqa: E731
    parser.add_argument("--speeds", type=numbers, default=list(SPEEDS),
                        help=f"probe tokens/s (default: {SPEEDS})")  # fmt: skip
    parser.add_argument("--scales", type=numbers, default=list(SCALES),
                        help=f"time scales (default: {SCALES})")  # fmt: skip
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="(default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="(default: %(default)s)")
    for name, default in asdict(Mix()).items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=int, default=default, help="(default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    mix = Mix(args.programs, args.max_model_len, args.kv_blocks)
    rows = grid(args.seeds, args.speeds, args.scales, args.policy, args.workers, mix)
    result = {"policy": args.policy, "mix": asdict(mix), "summary": summary(rows), "points": rows}
    if args.json:
        print(json.dumps(result))
        return 0
    for row in rows:
        print(f"seed {row['seed']:>2} speed {row['speed']:g} scale {row['scale']:g}:"
              f" avg {row['avg_ratio']:.2f} p95 {row['p95_ratio']:.2f}"
              f" short over 1.1x: {', '.join(row['short_over']) or '-'}")  # fmt: skip
    for key, value in result["summary"].items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
