"""``autellix serve``: N vLLM engines behind the router, one OpenAI-compatible endpoint.

    autellix serve                                  # 1 engine, SmolLM2-135M-Instruct (CPU)
    autellix serve --model tiny                     # random weights: starts fast
    autellix serve --engines 2 --lb locality        # 2 engines, paper Algorithm 2
    autellix serve --policy plas                    # the engines' policy (docs/scheduling.md)
    autellix serve --model /models/llama-8b         # on GPUs: one engine per GPU
    autellix serve --model /models/llama-70b --tensor-parallel-size 4   # 4 GPUs per engine
    autellix serve --upstream http://127.0.0.1:8001 --upstream http://127.0.0.1:8002
    autellix serve --engines 2 -- --max-num-batched-tokens 2048   # extra vLLM args

It checks the router's port, starts the engines (one line each, with its log
file), waits until every engine is healthy, and prints the base URL and model
to give a client. Engines listen on free loopback ports and take calls only
with the engine key, which the router holds (a fresh random key per run,
unless --engine-key or $AUTELLIX_ENGINE_KEY gives one); only the router is
reachable (on 127.0.0.1 unless --host says otherwise). An engine that dies is
restarted on its port, after 1 s and up to 60 s while it keeps dying; the
router takes it back when it is healthy. Ctrl-C or SIGTERM stops the router
and every engine it started, also when startup fails; if serve itself is
killed, its engines die within a second. With --upstream it starts no engine
and routes over the given ones (--engine-key: the key they were started with).

Engine logs: --log-dir D writes engine i's output to D/engine-i.log (default: a
new folder under the temporary directory, printed at start); --log-file F
appends every engine's output to one file, as ``autellix engine --log-file``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import secrets
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from autellix_vllm.cli import UsageError
from autellix_vllm.cli._arguments import HelpFormatter, checked
from autellix_vllm.cli.engine import add_engine_arguments, engine_config_from_args
from autellix_vllm.engine.launcher import (
    EngineConfig,
    EngineProcess,
    EngineStartError,
    EngineSupervisor,
    device_warning,
    gpu_available,
    nvidia_gpus,
    start_all,
    stop_all,
    stop_on_signals,
)
from autellix_vllm.engine.settings import positive_integer, positive_number
from autellix_vllm.policy.config import DEFAULT_BOUNDS, DEFAULT_LIMITS, ProgramLimits, TableBounds
from autellix_vllm.policy.flow_control import FlowControlConfig
from autellix_vllm.policy.routing import BALANCER_NAMES, DEFAULT_LOCALITY_THRESHOLD
from autellix_vllm.protocol.bearer import ENGINE_KEY_VARIABLE
from autellix_vllm.router import RouterConfig, serve_router
from autellix_vllm.router.config import DEFAULT_MAX_BODY_BYTES

# vLLM flags serve sets itself: after -- they would go around it.
SERVE_RESERVED_FLAGS = {
    "--tensor-parallel-size": "give --tensor-parallel-size T before -- (serve splits the"
    " GPUs between its engines, T each)",
    "-tp": "give --tensor-parallel-size T before -- (serve splits the GPUs between its"
    " engines, T each)",
    "--api-key": "serve gives its engines a fresh key of their own (--api-key before -- is"
    " the router's key)",
    "--host": "serve's engines listen on loopback (--host is the router's address)",
    "--port": "serve's engines listen on free ports (--port is the router's)",
}


# The table's counts: flag, default, what a call or program past it gets.
_TABLE_COUNTS = (
    ("--max-programs", DEFAULT_BOUNDS.max_programs, "programs the router's table holds in"
     " all; a new one past it gets 429 too_many_programs (idle programs are dropped first)"),
    ("--max-programs-per-key", DEFAULT_BOUNDS.max_programs_per_key, "programs one key may"
     " have open at once; a new one past it gets 429"),
    ("--max-threads", DEFAULT_LIMITS.max_threads, "threads one program may open; a call past"
     " it gets 400 too_many_threads"),
    ("--max-fork-depth", DEFAULT_LIMITS.max_fork_depth, "forks between a program's root"
     " thread and its deepest; past it: 400 fork_too_deep"),
    ("--max-live-calls", DEFAULT_LIMITS.max_live_calls, "calls of one program in flight at"
     " once; past it: 400 too_many_live_calls"),
)  # fmt: skip


def add_parser(subparsers: argparse._SubParsersAction, name: str) -> None:
    parser = subparsers.add_parser(
        name,
        help="run engines behind the router (one OpenAI-compatible endpoint)",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    add_engine_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address the router listens on")
    parser.add_argument("--port", type=int, default=8000, help="router port (0 picks one)")
    logs = parser.add_mutually_exclusive_group()
    logs.add_argument(
        "--log-dir",
        type=Path,
        metavar="DIR",
        help="write engine i's output to DIR/engine-i.log (default: a new folder under the"
        " temporary directory)",
    )
    logs.add_argument(
        "--log-file",
        type=Path,
        metavar="FILE",
        help="append every engine's output to this one file instead, as autellix engine"
        " --log-file; lines of several engines interleave (default: none)",
    )
    parser.add_argument(
        "--engines",
        type=int,
        metavar="N",
        help="engines to start (default: one per GPU group, or 1 on CPU)",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        metavar="T",
        help="GPUs per engine: engine i gets GPUs i*T..i*T+T-1 and vLLM gets"
        " --tensor-parallel-size T",
    )
    parser.add_argument(
        "--upstream",
        action="append",
        metavar="URL",
        help="route over this running engine instead of starting engines, repeatable"
        " (default: none, serve starts its engines)",
    )
    parser.add_argument(
        "--engine-key",
        metavar="KEY",
        help="the engine key, which the router sends to every engine: the key serve gives"
        " the engines it starts, or with --upstream the key those were started with"
        f" (autellix engine --api-key) (default: ${ENGINE_KEY_VARIABLE}, else a fresh"
        " random key per run for started engines, none for --upstream)",
    )
    add_router_arguments(parser)
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for each engine to get healthy",
    )
    parser.add_argument("vllm_args", nargs="*", help="extra vLLM arguments, after --")
    parser.set_defaults(func=run)


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    """The router's flags."""
    parser.add_argument(
        "--lb", choices=BALANCER_NAMES, default="locality", help="load-balancing policy"
    )
    parser.add_argument(
        "--locality-threshold",
        type=int,
        default=DEFAULT_LOCALITY_THRESHOLD,
        help="prompt tokens above which a call sticks to its program's engine (0: every call)",
    )
    parser.add_argument(
        "--chars-per-token",
        type=float,
        default=4.0,
        help="prompt-size estimate: characters per token (1 for the tiny model)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("AUTELLIX_API_KEY"),
        metavar="KEY",
        help="a client key: every route of the router then requires Authorization: Bearer"
        " KEY (default: $AUTELLIX_API_KEY, else none)",
    )
    parser.add_argument(
        "--api-keys-file",
        metavar="FILE",
        help="a file of client keys, one per line ('name: key', or a bare key; # comments);"
        " each key sees only the programs it opened (default: none)",
    )
    parser.add_argument(
        "--admin-key",
        default=os.environ.get("AUTELLIX_ADMIN_KEY"),
        metavar="KEY",
        help="a key that sees and ends every program (default: $AUTELLIX_ADMIN_KEY, else none)",
    )
    parser.add_argument(
        "--max-body-mb",
        type=float,
        default=DEFAULT_MAX_BODY_BYTES / 2**20,
        help="largest request body accepted, in MiB",
    )
    table = parser.add_argument_group(
        "the table's bounds (the engines autellix serve starts get the same idle TTL and"
        " program limits)"
    )
    for flag, default, meaning in _TABLE_COUNTS:
        table.add_argument(flag, type=checked(positive_integer), default=default, metavar="N",
                           help=meaning)  # fmt: skip
    table.add_argument(
        "--idle-ttl",
        type=checked(positive_number),
        default=DEFAULT_BOUNDS.idle_ttl_s,
        metavar="SECONDS",
        help="a program with nothing in flight for this long leaves the tables (a later"
        " call opens it again)",
    )
    parser.add_argument(
        "--no-derived-programs",
        dest="derived_programs",
        action="store_false",
        help="a call that names no program runs alone, even if it sends a session header,"
        " prompt_cache_key, previous_response_id, user or a conversation that extends"
        " an earlier call's (see docs/frameworks.md)",
    )
    parser.add_argument(
        "--no-prefix-programs",
        dest="prefix_programs",
        action="store_false",
        help="a call whose messages extend an earlier call's does not join that call's"
        " program (the other derived sources still count)",
    )
    parser.add_argument(
        "--derived-idle-end",
        type=float,
        default=RouterConfig.derived_idle_end_s,
        metavar="SECONDS",
        help="a derived program with nothing in flight for this long is ended",
    )
    parser.add_argument(
        "--flow-control",
        action="store_true",
        help="hold calls of worse classes (bands) at the router (ray-serve: at its"
        " process table) while the engines are saturated for them, instead of queueing"
        ' them in an engine (docs/scheduling.md, "Flow control")',
    )
    parser.add_argument(
        "--health-interval", type=float, default=1.0, help="seconds between engine probes"
    )
    parser.add_argument(
        "--max-attempts", type=int, default=3, help="tries of one call, each on another engine"
    )
    parser.add_argument(
        "--allow-remote-upstreams",
        action="store_true",
        help="allow non-loopback --upstream engines together with client keys",
    )


def table_bounds_from_args(args: argparse.Namespace) -> TableBounds:
    """The table's bounds of ``args``: the router's, and its engines' idle TTL and
    program limits."""
    limits = ProgramLimits(
        max_threads=args.max_threads,
        max_fork_depth=args.max_fork_depth,
        max_live_calls=args.max_live_calls,
    )
    return TableBounds(
        idle_ttl_s=args.idle_ttl,
        limits=limits,
        max_programs=args.max_programs,
        max_programs_per_key=args.max_programs_per_key,
    )


def flow_control_from_args(args: argparse.Namespace) -> FlowControlConfig | None:
    """The flow-control gate of ``args`` (``--flow-control``; None: off)."""
    return FlowControlConfig() if args.flow_control else None


def router_config_from_args(
    args: argparse.Namespace, upstreams: list[str], engine_key: str | None
) -> RouterConfig:
    try:
        return RouterConfig(
            upstreams=tuple(upstreams),
            balancer=args.lb,
            locality_threshold=args.locality_threshold,
            chars_per_token=args.chars_per_token,
            api_key=args.api_key,
            api_keys_file=args.api_keys_file,
            admin_key=args.admin_key,
            engine_key=engine_key,
            max_body_bytes=int(args.max_body_mb * 2**20),
            table=table_bounds_from_args(args),
            derived_programs=args.derived_programs,
            prefix_programs=args.prefix_programs,
            derived_idle_end_s=args.derived_idle_end,
            health_interval_s=args.health_interval,
            max_attempts=args.max_attempts,
            flow_control=flow_control_from_args(args),
            allow_remote_upstreams=args.allow_remote_upstreams,
        )
    except (ValueError, OSError) as error:  # OSError: an unreadable keys file
        raise UsageError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    if args.upstream:
        return run_over_upstreams(args)
    engine_key = args.engine_key or os.environ.get(ENGINE_KEY_VARIABLE) or secrets.token_urlsafe(32)
    engine_configs = plan_engines(args, engine_key)
    # Checked before any engine starts: a bad router flag or a taken port must not
    # cost the minute an engine takes to start.
    router_config_from_args(args, ["http://127.0.0.1:1"], engine_key)
    check_port_free(args.host, args.port)
    if args.log_dir is None and args.log_file is None:
        log_dir = Path(tempfile.mkdtemp(prefix="autellix-serve-"))
        engine_configs = [
            dataclasses.replace(config, log_file=log_dir / f"engine-{i}.log")
            for i, config in enumerate(engine_configs)
        ]
    first = engine_configs[0]
    count = len(engine_configs)
    if warning := device_warning(first):
        say(f"warning: {warning}", err=True)
    say(
        f"starting {count} engine{'s' if count > 1 else ''} ({first.model_name} on the"
        f" {first.resolved_device()}; each takes about a minute)"
    )
    engines: list[EngineProcess] = []
    supervisors: list[EngineSupervisor] = []
    started = time.monotonic()

    def starting(i: int, engine: EngineProcess) -> None:
        log = engine.config.log_file or "not kept"
        say(f"engine {i} starting on {engine.base_url} (log: {log})")

    def ready(i: int, engine: EngineProcess) -> None:
        pid = engine.process.pid if engine.process else None
        elapsed = time.monotonic() - started
        say(f"engine {i} ready at {engine.base_url} (pid {pid}) after {elapsed:.0f} s")

    stop_on_signals()
    try:
        engines = start_all(engine_configs, args.startup_timeout, on_start=starting, on_ready=ready)
        supervisors = [
            EngineSupervisor(engine, _engine_reporter(i, engine), args.startup_timeout).start()
            for i, engine in enumerate(engines)
        ]
        config = router_config_from_args(args, [e.base_url for e in engines], engine_key)
        models = sorted({engine.served_model_name for engine in engines})
        return run_router(config, args.host, args.port, _ready_line(config, models))
    except EngineStartError as error:
        say(f"error: {error}", err=True)
        return 1
    finally:
        _ignore_signals()  # a second Ctrl-C must not cut the shutdown short
        for supervisor in supervisors:
            supervisor.close()
        stop_all(engines)


def run_over_upstreams(args: argparse.Namespace) -> int:
    """Route over engines started elsewhere; warn about those that do not answer."""
    engine_flags = ("engines", "model", "policy", "beta", "levels")
    given = [f"--{flag}" for flag in engine_flags if getattr(args, flag) is not None]
    if given:
        raise UsageError(f"--upstream routes over running engines: drop {'/'.join(given)}")
    engine_key = args.engine_key or os.environ.get(ENGINE_KEY_VARIABLE)
    config = router_config_from_args(args, args.upstream, engine_key)
    check_port_free(args.host, args.port)
    models: set[str] = set()
    for url in config.upstreams:
        try:
            models.update(upstream_models(url, engine_key))
        except (OSError, ValueError) as error:
            say(
                f"warning: engine {url} does not answer ({error}); the router takes it into"
                " rotation once it does",
                err=True,
            )
    return run_router(config, args.host, args.port, _ready_line(config, sorted(models)))


def upstream_models(url: str, engine_key: str | None, timeout_s: float = 3.0) -> list[str]:
    """The model ids an engine serves (``GET /v1/models``, with the engine key)."""
    headers = {"Authorization": f"Bearer {engine_key}"} if engine_key else {}
    request = urllib.request.Request(url + "/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            listing = json.load(answer)
    except urllib.error.HTTPError as error:
        hint = " (wrong or missing --engine-key)" if error.code == 401 else ""
        raise ValueError(f"/v1/models answered {error.code}{hint}") from None
    return [entry["id"] for entry in listing.get("data", []) if isinstance(entry, dict)]


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`UsageError` if the router could not listen on ``host:port``."""
    if port == 0:
        return
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
            probe.bind(address)
    except OSError as error:
        raise UsageError(
            f"the router cannot listen on {host}:{port} ({error.strerror or error});"
            " pick another --port (0 picks a free one)"
        ) from None


def plan_engines(args: argparse.Namespace, engine_key: str | None = None) -> list[EngineConfig]:
    """One config per engine: free loopback ports, GPUs split between engines."""
    if args.tensor_parallel_size < 1:
        raise UsageError("--tensor-parallel-size must be >= 1")
    if args.engines is not None and args.engines < 1:
        raise UsageError("--engines must be >= 1")
    base = engine_config_from_args(
        args,
        SERVE_RESERVED_FLAGS,
        host="127.0.0.1",
        port=0,
        log_file=None,
        api_key=engine_key,
        table=table_bounds_from_args(args),  # the router's own: one source for both
    )
    tp = args.tensor_parallel_size
    gpus = visible_gpus() if base.resolved_device() == "gpu" else []
    count = args.engines if args.engines is not None else max(1, len(gpus) // tp)
    if gpus and count * tp > len(gpus):
        raise UsageError(
            f"{count} engines x {tp} GPUs each need {count * tp} GPUs; found {len(gpus)}"
        )
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    configs = []
    for i in range(count):
        extra_args = list(base.extra_args)
        if tp > 1:
            extra_args += ["--tensor-parallel-size", str(tp)]
        extra_env = dict(base.extra_env)
        if gpus:
            extra_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i * tp : (i + 1) * tp])
        log_file = args.log_dir / f"engine-{i}.log" if args.log_dir is not None else args.log_file
        configs.append(
            EngineConfig(
                **{
                    **vars(base),
                    "extra_args": extra_args,
                    "extra_env": extra_env,
                    "log_file": log_file,
                    "engines_on_host": count,
                }
            )
        )
    return configs


def visible_gpus() -> list[str]:
    """GPU ids this process may use: $CUDA_VISIBLE_DEVICES, else every GPU nvidia-smi lists."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu for gpu in listed.split(",") if gpu.strip()]
    if not gpu_available():
        return []
    return [str(i) for i in range(len(nvidia_gpus()))]


def run_router(config: RouterConfig, host: str, port: int, ready_line: Callable[[str], str]) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit code. ``ready_line`` makes the
    line printed once the router listens, from its root URL."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_router(config, host, port, stop, on_ready=lambda url: say(ready_line(url)))

    try:
        with asyncio.Runner(loop_factory=_fast_loop_factory()) as runner:
            runner.run(main())
    except OSError as error:  # the port was taken after the check
        say(f"error: the router could not listen on {host}:{port}: {error}", err=True)
        return 1
    say("stopped")
    return 0


def _ready_line(config: RouterConfig, models: list[str]) -> Callable[[str], str]:
    """The ready line: where the router is, what it serves, and a client to paste."""
    model = models[0] if models else "<an id of GET /v1/models>"
    # The clients insist on some key; the router asks for none unless given keys.
    keyed = config.api_key or config.api_keys_file or config.admin_key
    key = "<your key>" if keyed else "-"

    def line(root_url: str) -> str:
        served = ", ".join(repr(m) for m in models) or "the engines' models"
        return (
            f"router ready at {root_url}; model {served}; Ctrl-C stops everything.\n"
            "A client (Python):\n"
            "from autellix import OpenAI  # or AsyncOpenAI; openai's clients work too\n"
            f'client = OpenAI(base_url="{root_url}/v1", api_key="{key}")\n'
            f'print(client.chat.completions.create(model="{model}",'
            ' messages=[{"role": "user", "content": "Hi"}]).choices[0].message.content)'
        )

    return line


def _engine_reporter(i: int, engine: EngineProcess) -> Callable[[str], None]:
    def report(event: str) -> None:
        log = f" (log: {engine.config.log_file})" if engine.config.log_file else ""
        say(f"engine {i} ({engine.base_url}) {event}{log}", err=True)

    return report


def say(message: str, err: bool = False) -> None:
    print(f"autellix serve: {message}", file=sys.stderr if err else sys.stdout, flush=True)


def _fast_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _ignore_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
