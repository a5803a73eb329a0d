"""``autellix bench router`` and ``autellix bench router-overhead`` (registered by bench.cli).

autellix bench router --json             # round-robin vs locality on 2 real engines
autellix bench router-overhead --json    # the router alone, over a minimal upstream
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from autellix_vllm.cli import UsageError


def add_router_benchmarks(benches: argparse._SubParsersAction) -> None:
    router = benches.add_parser(
        "router",
        help="round-robin vs locality routing on real engines (program latency per token)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    router.add_argument("--programs", type=int, default=32)
    router.add_argument("--rate", type=float, default=4.0, help="program arrivals per second")
    router.add_argument("--seed", type=int, default=0)
    router.add_argument(
        "--workload", default="sharegpt", choices=["sharegpt", "bfcl", "lats", "mixed"]
    )
    router.add_argument("--token-scale", type=float, default=0.5, help="workload tokens x this")
    router.add_argument("--max-num-seqs", type=int, default=4, help="each engine's batch size")
    router.add_argument("--engines", type=int, default=2, help="engines per policy")
    router.add_argument(
        "--side-by-side",
        action="store_true",
        help="each policy on its own engines, both at once (default: one after the other)",
    )
    router.add_argument("--locality-threshold", type=int, default=256, help="prompt tokens")
    router.add_argument(
        "--chars-per-token",
        type=float,
        default=1.0,
        help="the router's prompt-size estimate (1: the tiny model's tokenizer; ~4 for BPE)",
    )
    router.add_argument(
        "--upstream", action="append", metavar="URL", help="use running engines (repeatable)"
    )
    router.add_argument("--json", action="store_true", help="print only the JSON result")
    router.add_argument("vllm_args", nargs="*", help="extra vLLM arguments, after --")
    router.set_defaults(func=_run_router)

    overhead = benches.add_parser(
        "router-overhead",
        help="latency the router adds and calls/s it sustains, over a minimal upstream",
    )
    overhead.add_argument("--seconds", type=float, default=10.0, help="throughput phase")
    overhead.add_argument("--concurrency", type=int, default=32, help="connections")
    overhead.add_argument("--latency-calls", type=int, default=2000)
    overhead.add_argument("--json", action="store_true", help="print only the JSON result")
    overhead.set_defaults(func=_run_overhead)


def _run_router(args: argparse.Namespace) -> int:
    from autellix_vllm.bench.router import router_bench_settings, run_router_bench

    for option in ("programs", "rate", "token_scale", "max_num_seqs", "engines", "chars_per_token"):
        if getattr(args, option) <= 0:
            raise UsageError(f"--{option.replace('_', '-')} must be positive")
    if args.upstream and len(args.upstream) < 2:
        raise UsageError("routing needs at least two --upstream engines")
    settings = router_bench_settings(
        programs=args.programs,
        rate=args.rate,
        seed=args.seed,
        workload=args.workload,
        token_scale=args.token_scale,
        max_num_seqs=args.max_num_seqs,
    )
    if not args.json:
        print(
            f"autellix bench router: {settings.programs} {settings.workload} programs, twice"
            f" (round-robin, locality) over {len(args.upstream or []) or args.engines} engines",
            file=sys.stderr,
        )
    result = run_router_bench(
        settings,
        threshold=args.locality_threshold,
        engines=args.engines,
        upstreams=args.upstream,
        vllm_args=args.vllm_args,
        side_by_side=args.side_by_side,
        chars_per_token=args.chars_per_token,
    )
    _emit(result, args.json)
    return 0


def _run_overhead(args: argparse.Namespace) -> int:
    from autellix_vllm.bench.router_overhead import run_router_overhead

    if args.seconds <= 0 or args.concurrency < 1 or args.latency_calls < 1:
        raise UsageError("--seconds, --concurrency and --latency-calls must be positive")
    _emit(run_router_overhead(args.seconds, args.concurrency, args.latency_calls), args.json)
    return 0


def _emit(result: dict[str, Any], as_json: bool) -> None:
    print(json.dumps(result) if as_json else json.dumps(result, indent=2))
