"""A policy's average latency per token over a band of rates around its crossing.

Near a policy's highest rate within the SLO, one rate's average is chaotic: a
0.001% change of rate can move it by 5%. A band is steadier: the mean over
``--points`` rates from 0.95x to 1.05x of a centre rate (each seed's highest
rate, from a sweep). Compare settings by their band means, and the band's own
noise by shifting the rates a little (``--shift 0.003``).

    python bench/experiments/band.py --workload agent --setting a100-llama8b-kv \\
        --centre 0:0.0118,1:0.0099,2:0.0116 --residency ttl_gaps=24
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from autellix_vllm.policy import DEFAULT_POLICY, PolicyConfig, ResidencyConfig
from autellix_vllm.sim.matrix import EngineSetting, setting
from autellix_vllm.sim.sweep import run_at


def average(case: tuple[str, EngineSetting, str, PolicyConfig, bool, int, float]) -> float:
    """The average latency per token of one run: the sweep's trace at ``rate``."""
    workload, where, policy, config, hints, seed, rate = case
    setup = where.sweep_setup(workload, seed, config, retention_hints=hints)
    return run_at(setup, policy, where.lb, rate)["avg_latency_per_token"]


def band(
    workload: str, where: EngineSetting, policy: str, centres: dict[int, float],
    config: PolicyConfig, *, points: int = 8, shift: float = 0.0, hints: bool = False,
    workers: int = 2,
) -> dict[str, Any]:  # fmt: skip
    """Per seed, the mean over ``points`` rates from 0.95x to 1.05x its centre (times
    ``1 + shift``); and the mean over all."""
    cases = [
        (workload, where, policy, config, hints, seed,
         centre * (1 + shift) * (0.95 + 0.1 * i / max(1, points - 1)))
        for seed, centre in centres.items() for i in range(points)
    ]  # fmt: skip
    with ProcessPoolExecutor(max_workers=workers) as pool:
        values = list(pool.map(average, cases))
    by_seed = {
        seed: statistics.fmean(values[k * points : (k + 1) * points])
        for k, seed in enumerate(centres)
    }
    return {"by_seed": by_seed, "mean": statistics.fmean(values)}


def _centres(text: str) -> dict[int, float]:
    """``SEED:RATE,...``."""
    pairs = (part.split(":") for part in text.split(","))
    return {int(seed): float(rate) for seed, rate in pairs}


def _residency(text: str) -> dict[str, float]:
    """``NAME=VALUE,...`` of :class:`ResidencyConfig`'s fields."""
    pairs = (part.split("=") for part in text.split(",") if part)
    return {name: float(value) for name, value in pairs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="agent", help="(default: %(default)s)")
    parser.add_argument("--setting", type=setting, default=setting("a100-llama8b-kv"),
                        help="PRESET[+HOST_GIB][xENGINES] (default: a100-llama8b-kv)")  # fmt: skip
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="(default: %(default)s)")
    parser.add_argument("--centre", type=_centres, required=True,
                        help="each seed's centre rate, SEED:RATE,...")  # fmt: skip
    parser.add_argument("--residency", type=_residency, default={},
                        help="ResidencyConfig fields, NAME=VALUE,... (default: none)")  # fmt: skip
    parser.add_argument("--points", type=int, default=8, help="(default: %(default)s)")
    parser.add_argument("--shift", type=float, default=0.0, help="(default: %(default)s)")
    parser.add_argument("--retention-hints", action="store_true", help="clients send hints")
    parser.add_argument("--workers", type=int, default=2, help="(default: %(default)s)")
    args = parser.parse_args(argv)
    config = PolicyConfig(residency=replace(ResidencyConfig(), **args.residency))
    result = band(
        args.workload, args.setting, args.policy, args.centre, config, points=args.points,
        shift=args.shift, hints=args.retention_hints, workers=args.workers,
    )  # fmt: skip
    print(json.dumps({"setting": args.setting.label, "residency": args.residency, **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
