"""``autellix bench``: measure the engine extension.

autellix bench engine --quick --json    # program latency: stock FCFS vs Autellix
autellix bench scheduler --json         # per-step overhead of the scheduler
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from autellix_vllm.cli import UsageError


def add_parser(subparsers: argparse._SubParsersAction, name: str) -> None:
    parser = subparsers.add_parser(name, help="benchmarks of the engine extension")
    benches = parser.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")

    engine = benches.add_parser(
        "engine", help="program latency per token on real engines: stock FCFS vs Autellix"
    )
    engine.add_argument("--programs", type=int, help="programs in the workload (default 32)")
    engine.add_argument("--quick", action="store_true", help="16 programs: about 2 minutes")
    engine.add_argument("--seed", type=int, default=0)
    engine.add_argument(
        "--workload", default="mixed", choices=["sharegpt", "bfcl", "lats", "mixed"]
    )
    engine.add_argument(
        "--rate", type=float, help="program arrivals per second (default: from the probe)"
    )
    engine.add_argument("--max-num-seqs", type=int, help="the engines' batch size (default 2)")
    engine.add_argument(
        "--schedulers",
        default="fcfs,autellix",
        help="baseline,candidate (fcfs or autellix); the same twice measures the noise floor",
    )
    engine.add_argument(
        "--side-by-side",
        action="store_true",
        help="run both engines at once (shares background load; crowded on few cores)",
    )
    engine.add_argument("--json", action="store_true", help="print only the JSON result")
    engine.set_defaults(func=_run_engine)

    overhead = benches.add_parser(
        "scheduler", help="median time the Autellix scheduler adds to each schedule() call"
    )
    overhead.add_argument("--running", type=int, default=256)
    overhead.add_argument("--waiting", type=int, default=1000)
    overhead.add_argument("--steps", type=int, default=200)
    overhead.add_argument("--json", action="store_true", help="print only the JSON result")
    overhead.set_defaults(func=_run_overhead)

    from autellix_vllm.bench.router_cli import add_router_benchmarks

    add_router_benchmarks(benches)


def _run_engine(args: argparse.Namespace) -> int:
    from autellix_vllm.bench.engine import BenchSettings, run_engine_bench

    schedulers = tuple(args.schedulers.split(","))
    if len(schedulers) != 2 or not set(schedulers) <= {"fcfs", "autellix"}:
        raise UsageError("--schedulers takes two of fcfs and autellix, e.g. fcfs,autellix")
    overrides: dict[str, Any] = {
        "seed": args.seed,
        "workload": args.workload,
        "schedulers": schedulers,
        "side_by_side": args.side_by_side,
    }
    for option in ("programs", "rate", "max_num_seqs"):
        value = getattr(args, option)
        if value is not None:
            if value <= 0:
                raise UsageError(f"--{option.replace('_', '-')} must be positive")
            overrides[option] = value
    settings = (BenchSettings.quick if args.quick else BenchSettings)(**overrides)
    if not args.json:
        print(
            f"autellix bench engine: {settings.programs} {settings.workload} programs,"
            f" max_num_seqs {settings.max_num_seqs}; {' then '.join(settings.schedulers)}"
            f"{' side by side' if settings.side_by_side else ''}...",
            file=sys.stderr,
        )
    _emit(run_engine_bench(settings), args.json)
    return 0


def _run_overhead(args: argparse.Namespace) -> int:
    from autellix_vllm.bench.overhead import measure

    if min(args.running, args.waiting, args.steps) < 1:
        raise UsageError("--running, --waiting and --steps must be positive")
    _emit(measure(args.running, args.waiting, args.steps), args.json)
    return 0


def _emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
