"""``autellix simulate``: run, sweep and benchmark the policies in the simulator."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from autellix_vllm.cli import UsageError, print_result
from autellix_vllm.cli._arguments import checked

from ..policy import (
    BALANCER_NAMES,
    DEFAULT_POLICY,
    POLICY_NAMES,
    Levels,
    PolicyConfig,
    ServiceMeter,
    policy_name,
)
from ..policy.routing import DEFAULT_LOCALITY_THRESHOLD
from ..sim.presets import PRESETS
from ..sim.run import SIM_POLICIES
from ..workloads import WORKLOAD_SPECS, get_workload
from ..workloads.trace_formats import AUTO, TRACE_FORMATS, import_trace

# The units of ``simulate run``'s results, printed after each value.
RUN_UNITS = {
    "rate": "programs/s",
    **{f"{s}_latency_per_token": "s/token" for s in ("avg", "p50", "p95", "p99")},
    **{f"{s}_program_latency": "s (simulated)" for s in ("p95", "p99")},
    **{f"{s}_first_call_wait": "s (simulated)" for s in ("avg", "p95")},
    "makespan": "s (simulated)",
    "stopped_at": "s (simulated)",
    "total_wait": "s (simulated, summed over calls)",
    "recomputed_tokens": "tokens",
    "reloaded_tokens": "tokens",
    "prefix_hit_rate": "of prompt tokens",
    "sim_seconds": "s (wall clock)",
    "table_sync_s": "s (simulated)",
    "directory_admissions_per_s": "messages/s (simulated)",
    "directory_reports_per_s": "messages/s (simulated)",
}


def _positive(kind: type, zero: bool = False) -> Any:
    """An argparse type: a number of ``kind`` above 0 (or 0 too, with ``zero``)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < 0 or (value == 0 and not zero):
            bound = ">= 0" if zero else "positive"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _names(allowed: tuple[str, ...] | list[str]) -> Any:
    def parse(text: str) -> list[str]:
        names = [policy_name(n.strip()) for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(bad) or 'empty list'} (choose from {', '.join(allowed)})"
            )
        return names

    return parse


def _comma_separated(parse: Callable[[str], Any]) -> Any:
    """An argument type: ``parse`` applied to each comma-separated item."""
    return checked(lambda text: [parse(item.strip()) for item in text.split(",")])


def _per_workload(value: str) -> str:
    """``sharegpt 600, bfcl 600, ...``: one of each workload's defaults, for help texts."""
    return ", ".join(f"{name} {getattr(spec, value):g}" for name, spec in WORKLOAD_SPECS.items())


def _add_locality_threshold(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--locality-threshold", type=_positive(int, zero=True), default=DEFAULT_LOCALITY_THRESHOLD,
        help="with locality balancing: prompt tokens above which a call sticks to its"
        " program's engine (0: every call), as the router's option",
    )  # fmt: skip


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload", choices=list(WORKLOAD_SPECS), default="sharegpt",
        help="; ".join(f"{name}: {spec.description}" for name, spec in WORKLOAD_SPECS.items()),
    )  # fmt: skip
    p.add_argument(
        "--programs", type=_positive(int),
        help="programs in the trace (default: run: "
        f"{_per_workload('programs')}; sweep: as many as --duration brings)",
    )  # fmt: skip
    p.add_argument("--engines", type=_positive(int), default=1, help="simulated engines")
    _add_locality_threshold(p)
    p.add_argument(
        "--preset", choices=sorted(PRESETS), default="a100-llama8b",
        help="the engine model: GPU and model, step costs, batch and KV cache (docs/simulator.md)",
    )  # fmt: skip
    p.add_argument(
        "--max-num-seqs", type=_positive(int),
        help="seats in an engine's batch (default: the preset's; 256 in a100-llama8b)",
    )  # fmt: skip
    p.add_argument(
        "--kv-offload-gib",
        type=_positive(float),
        help="a host-memory KV tier of this many GiB per engine, as vLLM's CPU offloading"
        " (--kv-offloading-size): evicted or preempted prefixes reload over PCIe"
        " (default: the preset's, none in most)",
    )
    p.add_argument(
        "--max-context",
        type=_positive(int),
        help="longest context of a call, for workloads capped at the model's context"
        " (default: the workload's: "
        + ", ".join(f"{n} {s.max_context}" for n, s in WORKLOAD_SPECS.items() if s.max_context)
        + ")",
    )
    p.add_argument(
        "--no-program-end",
        dest="end_programs",
        action="store_false",
        help="clients never end their programs (agents without the SDK): a KV-aware"
        " engine holds a finished program's last context until its hold expires",
    )
    p.add_argument(
        "--retention-hints",
        action="store_true",
        help="clients tell the engine with each call how long their tool takes before the"
        " context's next call, as autellix.expect_tool does: a KV-aware engine holds the"
        " context that long instead of its own estimate",
    )
    p.add_argument("--seed", type=int, default=0, help="the workload generator's seed")
    p.add_argument(
        "--levels", type=checked(Levels.parse),
        help="level boundaries in service units, e.g. 0,128,512"
        f" (default: {PolicyConfig().levels})",
    )  # fmt: skip
    p.add_argument(
        "--beta", type=_positive(float),
        help="anti-starvation threshold on a program's waiting/service ratio"
        " (docs/scheduling.md)"
        f" (default: {PolicyConfig().beta:g})",
    )  # fmt: skip
    p.add_argument(
        "--atlas-variant", choices=("program", "thread"),
        help="ATLAS's critical path: one per program (the paper's), or one per thread"
        f" (default: {PolicyConfig().atlas_variant})",
    )  # fmt: skip
    p.add_argument(
        "--service-unit", choices=("tokens", "time"),
        help=f"what service counts (default: {PolicyConfig().meter.unit})",
    )  # fmt: skip
    p.add_argument(
        "--prefill-weight", type=float,
        help="service per prefilled token, against 1 per decoded token"
        f" (default: {PolicyConfig().meter.prefill_weight:g})",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _config(args: argparse.Namespace) -> PolicyConfig:
    default = PolicyConfig()
    meter = ServiceMeter(
        args.service_unit or default.meter.unit,
        default.meter.prefill_weight if args.prefill_weight is None else args.prefill_weight,
    )
    try:
        return PolicyConfig(
            levels=args.levels or default.levels,
            meter=meter,
            beta=args.beta or default.beta,
            atlas_variant=args.atlas_variant or default.atlas_variant,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    parser = sub.add_parser(name, help="simulate policies on modelled engines")
    commands = parser.add_subparsers(dest="sim_command", required=True, metavar="SUBCOMMAND")

    run = commands.add_parser("run", help="one simulation: latency per token and more")
    _add_engine_args(run)
    run.add_argument(
        "--policy", type=policy_name, choices=sorted(SIM_POLICIES), default=DEFAULT_POLICY,
        help=f"the scheduling policy (default: {DEFAULT_POLICY})",
    )  # fmt: skip
    run.add_argument("--rate", type=_positive(float), default=1.0, help="programs per second")
    run.add_argument(
        "--lb", choices=BALANCER_NAMES, default="round-robin",
        help="how calls are spread over --engines",
    )  # fmt: skip
    run.add_argument(
        "--trace",
        help="JSONL trace to replay instead of --workload: the project's, Mooncake's or"
        " Dynamo's format (docs/simulator.md) (default: none)",
    )
    run.add_argument(
        "--trace-format", choices=[AUTO, *TRACE_FORMATS], default=AUTO,
        help="the --trace file's format (default: auto, detected from its rows)",
    )  # fmt: skip
    run.add_argument(
        "--table-sync-s", type=_positive(float),
        help="calls see their program's service over all engines as the Ray Serve"
        " directory has it, with report batches this many seconds apart (docs/simulator.md);"
        " the output then counts the directory's messages per second"
        " (default: one always fresh table)",
    )  # fmt: skip
    run.add_argument(
        "--timeline", metavar="PROGRAM_ID",
        help="also print where this program's time went, as autellix ps PROGRAM does"
        " (default: none)",
    )  # fmt: skip
    run.add_argument(
        "--chrome-trace", metavar="FILE",
        help="with --timeline: write it to FILE in the Trace Event Format, for Perfetto"
        " (default: no file)",
    )  # fmt: skip
    run.add_argument(
        "--plot", metavar="PNG",
        help="with --timeline: draw it as a waterfall to this PNG (default: no file)",
    )  # fmt: skip
    run.set_defaults(func=_run)

    sweep = commands.add_parser("sweep", help="max rate within the SLO, per policy")
    _add_engine_args(sweep)
    sweep.add_argument(
        "--policies",
        "--policy",
        type=_names(sorted(SIM_POLICIES)),
        default=["vllm-opt", DEFAULT_POLICY],
        metavar="POLICIES",
        help=f"comma-separated, of {', '.join(sorted(SIM_POLICIES))}; the first is the"
        f" baseline of the ratios (default: vllm-opt,{DEFAULT_POLICY})",
    )
    sweep.add_argument(
        "--lb",
        type=_names(list(BALANCER_NAMES)),
        default=["round-robin"],
        help=f"comma-separated load balancers, of {', '.join(BALANCER_NAMES)}; each is swept"
        " with every policy (default: round-robin)",
    )
    sweep.add_argument(
        "--duration",
        type=_positive(float),
        help=f"seconds of arrivals per trace (default: {_per_workload('sweep_seconds')};"
        " ignored with --programs)",
    )
    sweep.add_argument(
        "--slo-factor", type=_positive(float), default=5.0,
        help="the SLO: this many times the unloaded average latency per token",
    )  # fmt: skip
    sweep.add_argument(
        "--workers", type=_positive(int), default=2, help="processes that search at once"
    )
    sweep.add_argument(
        "--tail-rate", type=_positive(float), metavar="RATE",
        help="programs/s at which every policy runs in full once more, for its P95 and"
        " P99 program latency and first-call wait (default: the highest rate every"
        " policy met)",
    )  # fmt: skip
    sweep.add_argument(
        "--plot", metavar="PNG",
        help="write two panels to this PNG: latency-vs-rate curves, and each policy's"
        " program latency CDF at the tails' rate (default: none)",
    )  # fmt: skip
    sweep.set_defaults(func=_sweep)

    _add_matrix_parser(commands)

    bench = commands.add_parser("bench-policy", help="time per scheduling step of the core")
    bench.add_argument("--running", type=_positive(int), default=256, help="calls in the batch")
    bench.add_argument("--waiting", type=_positive(int), default=1000, help="calls queued")
    bench.add_argument("--steps", type=_positive(int), default=2000, help="steps timed")
    bench.add_argument(
        "--policy", type=policy_name, choices=POLICY_NAMES, default=DEFAULT_POLICY,
        help=f"the policy timed (default: {DEFAULT_POLICY})",
    )  # fmt: skip
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.set_defaults(func=_bench)

    tune = commands.add_parser(
        "tune", help="markdown tables: levels, beta, prefill weight, ATLAS variant per workload"
    )
    tune.add_argument("--quick", action="store_true", help="sharegpt and lats only")
    tune.add_argument(
        "--workers", type=_positive(int), default=2, help="processes that simulate at once"
    )
    tune.set_defaults(func=_tune)


def _run(args: argparse.Namespace) -> int:
    from ..sim.sweep import SweepSetup

    if args.timeline is None and (args.chrome_trace or args.plot):
        raise UsageError("--chrome-trace and --plot draw a program's timeline: add --timeline ID")
    if args.plot:
        import matplotlib  # noqa: F401  (missing: one line now, not after the run)

    setup = SweepSetup(
        args.workload, args.seed, args.engines, args.preset, args.max_num_seqs, _config(args),
        duration=0.0,  # a fixed count of programs, not a window of arrivals
        programs=args.programs or get_workload(args.workload).programs,
        kv_offload_gib=args.kv_offload_gib, max_context=args.max_context,
        end_programs=args.end_programs, retention_hints=args.retention_hints,
        locality_threshold=args.locality_threshold, table_sync_s=args.table_sync_s,
    )  # fmt: skip
    try:
        programs = (
            import_trace(args.trace, args.trace_format) if args.trace else setup.trace(args.rate)
        )
        if args.timeline is not None and args.timeline not in {p.program_id for p in programs}:
            first = programs[0].program_id if programs else "none"
            raise ValueError(f"no program {args.timeline!r} in this run (the first: {first!r})")
        result = setup.simulate(programs, args.policy, args.lb, timeline_of=args.timeline)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    source = {"trace": args.trace} if args.trace else {"workload": args.workload, "rate": args.rate}
    output = {**source, "policy": args.policy, **result.metrics}
    if args.timeline is None:
        print_result(output, args.json, RUN_UNITS)
        return 0
    from ..router.timeline import timeline
    from .ps import format_timeline, write_timeline_files

    calls = timeline(result.call_spans, calls_finished=len(result.call_spans))
    write_timeline_files(args.timeline, calls, args.chrome_trace, args.plot)
    if args.json:
        print_result({**output, "timeline": calls}, as_json=True)
    else:
        print_result(output, False, RUN_UNITS)
        print(f"\n{format_timeline({'program_id': args.timeline, **calls})}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..sim.sweep import format_sweep, plot, sweep

    config = _config(args)
    keys = len(args.policies) * len(args.lb)
    # The bar shows after half a second, so that a setting the sweep rejects at once
    # is one line.
    bar = tqdm(total=keys, desc=f"sweep {args.workload}", unit="policy", file=sys.stderr, delay=0.5)
    with bar:
        try:
            result, curves = sweep(
                args.workload,
                args.policies,
                lbs=args.lb,
                locality_threshold=args.locality_threshold,
                engines=args.engines,
                preset=args.preset,
                duration=args.duration,
                programs=args.programs,
                max_num_seqs=args.max_num_seqs,
                seed=args.seed,
                slo_factor=args.slo_factor,
                config=config,
                workers=args.workers,
                on_done=lambda key: bar.update(1),
                kv_offload_gib=args.kv_offload_gib,
                max_context=args.max_context,
                end_programs=args.end_programs,
                retention_hints=args.retention_hints,
                tail_rate=args.tail_rate,
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.plot:
        plot(result, curves, f"{args.workload}, {args.preset}, {args.engines} engine(s)", args.plot)
        result["plot"] = args.plot
    if args.json:
        print_result(result, as_json=True)
    else:
        print(format_sweep(result))
    return 0


def _add_matrix_parser(commands: argparse._SubParsersAction) -> None:
    from ..sim.matrix import (
        LATENCY_TOLERANCE,
        MATRIX_POLICIES,
        MATRIX_SETTINGS,
        MATRIX_WORKLOADS,
        PEER_MARGIN_WORKLOADS,
        PEER_RATE_MARGIN,
        RATE_MULTIPLES,
        setting,
    )

    matrix = commands.add_parser(
        "matrix",
        help=f"does {DEFAULT_POLICY} ever lose? every policy swept in every setting",
        description=f"For each engine setting and workload: each policy's highest rate within"
        f" the SLO and its ratio to vllm-opt's, then {DEFAULT_POLICY}, vllm-opt and the best"
        " peer (the peer with the highest rate) in full at fixed fractions of vllm-opt's"
        f" highest rate. Each cell has two verdicts, every miss named. Never lose:"
        f" {DEFAULT_POLICY}'s highest rate is at least vllm-opt's and mlfq's and its average"
        f" latency per token at most {LATENCY_TOLERANCE}x vllm-opt's at every fixed rate."
        f" Targets: its highest rate is at least every peer's ({PEER_RATE_MARGIN}x the best"
        f" peer's on {' and '.join(PEER_MARGIN_WORKLOADS)}), and at every fixed rate its P95"
        " program latency is at most vllm-opt's and the best peer's and its P95 first-call"
        " wait at most vllm-opt's. One row per cell as it is done (the whole default matrix"
        f" takes hours on 2 cores), then a table of {DEFAULT_POLICY}'s tails at the fixed"
        " rates.",
    )
    matrix.add_argument(
        "--workloads", type=_names(list(WORKLOAD_SPECS)), default=list(MATRIX_WORKLOADS),
        help=f"comma-separated (default: {','.join(MATRIX_WORKLOADS)})",
    )  # fmt: skip
    matrix.add_argument(
        "--settings", type=_comma_separated(setting),
        default=list(MATRIX_SETTINGS),
        help="comma-separated engine settings PRESET[+HOST_GIB][xENGINES] (default:"
        f" {','.join(s.label for s in MATRIX_SETTINGS)})",
    )  # fmt: skip
    matrix.add_argument(
        "--policies", type=_names(sorted(SIM_POLICIES)), default=list(MATRIX_POLICIES),
        help=f"comma-separated, vllm-opt first and {DEFAULT_POLICY} among them; without a"
        f" peer the targets judge vllm-opt's tails only (default: {','.join(MATRIX_POLICIES)})",
    )  # fmt: skip
    matrix.add_argument(
        "--multiples", type=_comma_separated(float),
        default=list(RATE_MULTIPLES),
        help="fractions of vllm-opt's highest rate where the latencies are compared"
        f" (default: {','.join(f'{m:g}' for m in RATE_MULTIPLES)})",
    )  # fmt: skip
    matrix.add_argument(
        "--duration", type=_positive(float),
        help=f"seconds of arrivals per trace (default: {_per_workload('sweep_seconds')})",
    )  # fmt: skip
    matrix.add_argument("--seed", type=int, default=0, help="the workload generator's seed")
    _add_locality_threshold(matrix)
    matrix.add_argument(
        "--workers", type=_positive(int), default=2, help="processes that simulate at once"
    )
    matrix.add_argument("--json", action="store_true", help="print one JSON object per cell")
    matrix.set_defaults(func=_matrix)


def _matrix(args: argparse.Namespace) -> int:
    from ..sim.matrix import format_header, format_row, format_tails, matrix

    cells = matrix(
        args.workloads, args.settings, policies=args.policies, seed=args.seed,
        duration=args.duration, multiples=args.multiples, workers=args.workers,
        locality_threshold=args.locality_threshold,
    )  # fmt: skip
    if not args.json:
        print(format_header(args.policies, args.locality_threshold), flush=True)
    done = []
    try:
        for cell in cells:
            done.append(cell)
            if args.json:
                print_result(cell, as_json=True)
            else:
                print(format_row(cell, args.policies))
            sys.stdout.flush()  # a row as soon as its cell is done: the matrix takes hours
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not args.json:
        never_lose = sum(bool(cell["never_lose_misses"]) for cell in done)
        targets = sum(bool(cell["target_misses"]) for cell in done)
        print(
            f"{never_lose} cell(s) missed never lose, {targets} missed the targets;"
            " +: within the SLO at the search limit"
        )
        print(f"\n{format_tails(done)}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from ..bench.policy_core import bench_policy

    result = bench_policy(args.running, args.waiting, steps=args.steps, policy=args.policy)
    print_result(result, args.json)
    return 0


def _tune(args: argparse.Namespace) -> int:
    from ..sim.tune import print_tables

    print_tables(args.quick, args.workers)
    return 0
