"""``autellix bench``: measure the engine extension.

autellix bench engine --quick --json    # program latency: stock FCFS vs Autellix (and peers)
autellix bench fidelity --quick --json  # the simulator against the engine, same trace
autellix bench scheduler --json         # per-step overhead of the scheduler
autellix bench router --json            # round-robin vs locality on 2 real engines
autellix bench router-overhead --json   # the router alone, over a minimal upstream
autellix bench soak --minutes 10 --json # serve under faults and a misbehaving client
autellix bench sdk --json               # what the client SDK adds to a call
autellix bench cpu-preset --json        # fit a simulator cpu-* preset on the engine
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from autellix_vllm.bench import IDENTITIES
from autellix_vllm.cli import UsageError, print_result
from autellix_vllm.cli._arguments import checked
from autellix_vllm.engine.launcher import SCHEDULERS
from autellix_vllm.engine.models import MODELS
from autellix_vllm.engine.settings import ENGINE_POLICY_NAMES, engine_policy
from autellix_vllm.policy import DEFAULT_POLICY
from autellix_vllm.workloads import WORKLOAD_SPECS

FIDELITY_QUICK_PROGRAMS = 8
# The policies an entry of `bench engine --schedulers` can name besides the schedulers.
POLICY_ENTRIES = tuple(name for name in ENGINE_POLICY_NAMES if name not in SCHEDULERS)
MODEL_HELP = f"{' or '.join(MODELS)} (built in), or a local model folder (default: %(default)s)"


def add_parser(subparsers: argparse._SubParsersAction, name: str) -> None:
    parser = subparsers.add_parser(name, help="benchmarks of the engine extension")
    benches = parser.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")

    engine = benches.add_parser(
        "engine",
        help="program latency per token on real engines: stock FCFS, Autellix, its peers",
    )
    _add_workload_arguments(engine)
    engine.add_argument(
        "--schedulers", "--scheduler", default="fcfs,autellix", metavar="BASELINE,CANDIDATE,...",
        help="what to compare, the baseline first, each other entry against it: a scheduler"
        f" ({', '.join(SCHEDULERS)}: as engine --scheduler; autellix runs --policy) or a policy"
        f" the autellix scheduler runs ({', '.join(POLICY_ENTRIES)}); the same entry twice measures"
        " the noise floor (default: %(default)s)",
    )  # fmt: skip
    engine.add_argument(
        "--side-by-side",
        action="store_true",
        help="run every engine at once (shares background load; crowded on few cores)",
    )
    engine.add_argument(
        "--identity", default="sent", choices=IDENTITIES,
        help="how calls name their program: sent (the SDK's headers, straight to the engine,"
        " each program ended after its last call) or derived (an agent without the SDK: plain"
        " chat conversations, no autellix header, never ended, through an autellix serve"
        " router that derives each program from the growing conversation)"
        " (default: %(default)s)",
    )  # fmt: skip
    engine.add_argument(
        "--plot", metavar="PNG",
        help="write two panels to this PNG: each entry's program latency per token"
        " (average, P95, P99) and its program latency CDF (default: none)",
    )  # fmt: skip
    engine.add_argument("--json", action="store_true", help="print only the JSON result")
    engine.set_defaults(func=_run_engine)

    overhead = benches.add_parser(
        "scheduler", help="median time the Autellix scheduler adds to each schedule() call"
    )
    overhead.add_argument("--running", type=int, default=256, help="calls in the batch")
    overhead.add_argument("--waiting", type=int, default=1000, help="calls queued")
    overhead.add_argument("--steps", type=int, default=200, help="steps timed per scheduler")
    overhead.add_argument("--json", action="store_true", help="print only the JSON result")
    overhead.set_defaults(func=_run_overhead)

    fidelity = benches.add_parser(
        "fidelity",
        help="the simulator against the engine: one trace replayed on both, FCFS and Autellix",
    )
    _add_workload_arguments(
        fidelity, quick=f"{FIDELITY_QUICK_PROGRAMS} programs: about 7 minutes on 2 CPU cores"
    )
    fidelity.add_argument(
        "--preset", help="the simulator's preset (default: cpu-smollm2, or cpu-tiny for tiny)"
    )
    fidelity.add_argument("--json", action="store_true", help="print only the JSON result")
    fidelity.set_defaults(func=_run_fidelity)

    _add_router_benchmarks(benches)
    _add_soak(benches)
    _add_client_and_calibration(benches)


def _add_workload_arguments(
    parser: argparse.ArgumentParser, quick: str = "16 programs: about 10 minutes on 2 CPU cores"
) -> None:
    """What a benchmark on one engine replays, and on which engine settings."""
    parser.add_argument("--model", default="smollm2", help=MODEL_HELP)
    parser.add_argument(
        "--programs", type=int, help="programs in the workload (default: 32; a trace: all)"
    )
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--seed", type=int, default=0, help="the workload generator's seed")
    parser.add_argument(
        "--workload", default="mixed", choices=list(WORKLOAD_SPECS),
        help="a generated workload (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--trace", type=Path, metavar="FILE",
        help="replay this JSONL trace (the simulator's, Mooncake's or Dynamo's format, detected)"
        " instead of --workload"
        " (default: none)",
    )  # fmt: skip
    parser.add_argument(
        "--token-scale", type=float,
        help="token counts x this (default: 0.125 for a workload, 1 for a trace)",
    )  # fmt: skip
    parser.add_argument(
        "--rate", type=float,
        help="program arrivals per second (default: from the probe; a trace's own)",
    )  # fmt: skip
    parser.add_argument("--max-num-seqs", type=int, help="the engines' batch size (default: 4)")
    parser.add_argument(
        "--max-model-len", type=int,
        help="the engines' context length; the agent workload's sessions end there (default: 1024)",
    )  # fmt: skip
    parser.add_argument(
        "--kv-blocks", type=int,
        help="cap each engine's KV cache at this many blocks (vLLM's"
        " --num-gpu-blocks-override): a KV-bound engine (default: no cap)",
    )  # fmt: skip
    parser.add_argument(
        "--policy", type=checked(engine_policy), metavar="{" + ",".join(ENGINE_POLICY_NAMES) + "}",
        help=f"the policy of the autellix scheduler (default: the engine's, {DEFAULT_POLICY})",
    )  # fmt: skip


def _bench_settings(args: argparse.Namespace, **overrides: Any) -> Any:
    """The engine benchmark's settings from :func:`_add_workload_arguments`' flags."""
    from autellix_vllm.bench.replay import BenchSettings

    overrides.update(seed=args.seed, workload=args.workload, model=args.model)
    if args.trace is not None:
        overrides.update(trace=args.trace, programs=None, token_scale=1.0)
    if args.policy is not None:
        overrides["policy"] = args.policy
    for option in ("programs", "rate", "max_num_seqs", "token_scale", "max_model_len", "kv_blocks"):
        value = getattr(args, option)
        if value is not None:
            if value <= 0:
                raise UsageError(f"--{option.replace('_', '-')} must be positive")
            overrides[option] = value
    try:
        settings = (BenchSettings.quick if args.quick else BenchSettings)(**overrides)
    except ValueError as error:  # e.g. an unknown entry of --schedulers
        raise UsageError(str(error)) from None
    if settings.trace is not None:
        from autellix_vllm.bench.replay import build_workload
        from autellix_vllm.workloads import TraceError

        try:
            build_workload(settings)  # a broken trace is one line before any engine starts
        except TraceError as error:
            raise UsageError(str(error)) from None
    return settings


def _describe(name: str, settings: Any) -> str:
    source = settings.trace or f"{settings.programs} {settings.workload} programs"
    return (
        f"autellix bench {name}: {source} on {settings.model},"
        f" max_num_seqs {settings.max_num_seqs}, identity {settings.identity};"
        f" {' then '.join(settings.schedulers)}"
        f"{' side by side' if settings.side_by_side else ''}..."
    )


def _run_engine(args: argparse.Namespace) -> int:
    from autellix_vllm.bench.replay import format_engine_bench, plot_engine_bench, run_engine_bench

    schedulers = tuple(entry.strip() for entry in args.schedulers.split(","))
    settings = _bench_settings(
        args, schedulers=schedulers, side_by_side=args.side_by_side, identity=args.identity
    )
    if args.plot:
        import matplotlib  # noqa: F401  (missing: one line now, not after the runs)
    print(_describe("engine", settings), file=sys.stderr)  # stdout: the result alone
    result = run_engine_bench(settings)
    if args.plot:
        plot_engine_bench(result, args.plot)
        result["plot"] = args.plot
    if args.json:
        print_result(result, as_json=True)
    else:
        print(format_engine_bench(result))
    return 0


def _run_fidelity(args: argparse.Namespace) -> int:
    from autellix_vllm.bench.fidelity import FidelitySettings, run_fidelity

    quick = {"programs": FIDELITY_QUICK_PROGRAMS} if args.quick else {}
    bench = _bench_settings(args, **quick)
    try:
        settings = FidelitySettings.for_bench(bench, args.preset)
    except ValueError as error:
        raise UsageError(str(error)) from None
    print(_describe("fidelity", settings.bench), file=sys.stderr)
    print_result(run_fidelity(settings), args.json)
    return 0


def _run_overhead(args: argparse.Namespace) -> int:
    from autellix_vllm.bench.overhead import measure

    if min(args.running, args.waiting, args.steps) < 1:
        raise UsageError("--running, --waiting and --steps must be positive")
    print_result(measure(args.running, args.waiting, args.steps), args.json)
    return 0


def _add_router_benchmarks(benches: argparse._SubParsersAction) -> None:
    router = benches.add_parser(
        "router",
        help="round-robin vs locality routing on real engines (program latency per token)",
    )
    router.add_argument("--programs", type=int, default=32, help="programs in the workload")
    router.add_argument("--rate", type=float, default=4.0, help="program arrivals per second")
    router.add_argument("--seed", type=int, default=0, help="the workload generator's seed")
    router.add_argument(
        "--workload", default="sharegpt", choices=list(WORKLOAD_SPECS), help="what is replayed"
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
        "--upstream",
        action="append",
        metavar="URL",
        help="use this running engine, repeatable (default: none, start --engines engines)",
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
    overhead.add_argument(
        "--latency-calls",
        type=int,
        default=2000,
        help="timed calls of the latency phase, direct and routed each",
    )
    overhead.add_argument("--json", action="store_true", help="print only the JSON result")
    overhead.set_defaults(func=_run_router_overhead)


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
    print_result(result, args.json)
    return 0


def _run_router_overhead(args: argparse.Namespace) -> int:
    from autellix_vllm.bench.router_overhead import run_router_overhead

    if args.seconds <= 0 or args.concurrency < 1 or args.latency_calls < 1:
        raise UsageError("--seconds, --concurrency and --latency-calls must be positive")
    result = run_router_overhead(args.seconds, args.concurrency, args.latency_calls)
    print_result(result, args.json)
    return 0


def _add_soak(benches: argparse._SubParsersAction) -> None:
    soak = benches.add_parser(
        "soak",
        help="autellix serve with 2 tiny engines under agent load, an engine killed and a"
        " misbehaving client; exit code 1 if a program was lost or a forgery accepted",
    )
    soak.add_argument("--minutes", type=float, default=10.0, help="how long the load runs")
    soak.add_argument("--rate", type=float, default=1.0, help="agent programs started per second")
    soak.add_argument("--seed", type=int, default=0, help="the agents' random seed")
    soak.add_argument("--json", action="store_true", help="print only the JSON result")
    soak.set_defaults(func=_run_soak)


def _run_soak(args: argparse.Namespace) -> int:
    from autellix_vllm.bench.soak import SoakSettings, run_soak

    if args.minutes <= 0 or args.rate <= 0:
        raise UsageError("--minutes and --rate must be positive")
    result = run_soak(SoakSettings(minutes=args.minutes, rate=args.rate, seed=args.seed))
    print_result(result, args.json)
    return 0 if result["passed"] else 1


def _add_client_and_calibration(benches: argparse._SubParsersAction) -> None:
    sdk = benches.add_parser("sdk", help="time the autellix SDK adds to a call over plain openai")
    sdk.add_argument("--calls", type=int, default=2000, help="timed calls per client")
    sdk.add_argument("--warmup", type=int, default=200, help="untimed calls per client")
    sdk.add_argument(
        "--transport", choices=("server", "mock"), default="server",
        help="server: a minimal upstream in its own process; mock: in-process answers",
    )  # fmt: skip
    sdk.add_argument("--json", action="store_true", help="print only the JSON result")
    sdk.set_defaults(func=_run_sdk)

    preset = benches.add_parser(
        "cpu-preset", help="fit a simulator cpu-* preset's step costs on a CPU engine"
    )
    preset.add_argument(
        "--model", default="tiny",
        help=f"{' or '.join(MODELS)} (cpu-tiny, cpu-smollm2), or a model folder"
        " (default: %(default)s)",
    )  # fmt: skip
    preset.add_argument("--json", action="store_true", help="print only the JSON result")
    preset.set_defaults(func=_run_cpu_preset)


def _run_sdk(args: argparse.Namespace) -> int:
    from autellix_vllm.bench.sdk import run_sdk_bench

    if args.calls < 1 or args.warmup < 0:
        raise UsageError("--calls must be positive and --warmup not negative")
    print_result(run_sdk_bench(args.calls, args.warmup, args.transport), args.json)
    return 0


def _run_cpu_preset(args: argparse.Namespace) -> int:
    from autellix_vllm.bench.cpu_preset import calibrate_cpu_preset

    print_result(calibrate_cpu_preset(args.model), args.json)
    return 0
