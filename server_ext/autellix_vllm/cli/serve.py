"""``autellix serve``: N vLLM engines behind the router, one OpenAI-compatible endpoint.

    autellix serve                                  # 1 engine, the embedded tiny model (CPU)
    autellix serve --engines 2 --lb locality        # 2 engines, paper Algorithm 2
    autellix serve --policy plas                    # the engines' policy (docs/scheduling.md)
    autellix serve --model /models/llama-8b         # on GPUs: one engine per GPU
    autellix serve --model /models/llama-70b --tensor-parallel-size 4
    autellix serve --upstream http://127.0.0.1:8001 --upstream http://127.0.0.1:8002
    autellix serve --engines 2 -- --max-num-batched-tokens 2048   # extra vLLM args

It waits until every engine is healthy, then prints the base URL to give the
SDK (``autellix.AsyncOpenAI(base_url=...)``). Engines listen on free loopback
ports; only the router is reachable (on 127.0.0.1 unless --host says
otherwise). Ctrl-C or SIGTERM stops the router and every engine it started,
also when startup fails. With --upstream it starts no engine and routes over
the given ones.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from autellix_vllm.cli import UsageError
from autellix_vllm.cli.engine import add_engine_arguments, engine_config_from_args
from autellix_vllm.engine.launcher import (
    EngineConfig,
    EngineProcess,
    EngineStartError,
    gpu_available,
    start_all,
    stop_all,
    stop_on_signals,
)
from autellix_vllm.policy.routing import BALANCER_NAMES, DEFAULT_LOCALITY_THRESHOLD
from autellix_vllm.router import RouterConfig, serve_router
from autellix_vllm.router.config import DEFAULT_MAX_BODY_BYTES

ENGINE_WATCH_INTERVAL_S = 2.0


def add_parser(subparsers: argparse._SubParsersAction, name: str) -> None:
    parser = subparsers.add_parser(
        name,
        help="run engines behind the router (one OpenAI-compatible endpoint)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        conflict_handler="resolve",  # the router's --host/--port replace the engine's
    )
    add_engine_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address the router listens on")
    parser.add_argument("--port", type=int, default=8000, help="router port (0 picks one)")
    parser.add_argument("--log-file", help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", type=Path, help="write engine i's output to engine-i.log")
    parser.add_argument(
        "--engines", type=int, help="engines to start (default: one per GPU, or 1 on CPU)"
    )
    parser.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="GPUs per engine (passed to vLLM)"
    )
    parser.add_argument(
        "--upstream",
        action="append",
        metavar="URL",
        help="route over this running engine instead of starting engines (repeatable)",
    )
    add_router_arguments(parser)
    parser.add_argument(
        "--startup-timeout", type=float, default=600.0, help="seconds to wait for each engine"
    )
    parser.add_argument("vllm_args", nargs="*", help="extra vLLM arguments, after --")
    parser.set_defaults(func=run)


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    """The router's flags (shared with the router benchmark)."""
    parser.add_argument(
        "--lb", choices=BALANCER_NAMES, default="locality", help="load-balancing policy"
    )
    parser.add_argument(
        "--locality-threshold",
        type=int,
        default=DEFAULT_LOCALITY_THRESHOLD,
        help="prompt tokens above which a call sticks to its program's engine",
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
        help="require Authorization: Bearer KEY on every route (default: $AUTELLIX_API_KEY)",
    )
    parser.add_argument(
        "--max-body-mb",
        type=float,
        default=DEFAULT_MAX_BODY_BYTES / 2**20,
        help="largest request body accepted, in MiB",
    )
    parser.add_argument("--health-interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--max-attempts", type=int, default=3, help="tries of one call")
    parser.add_argument(
        "--allow-remote-upstreams",
        action="store_true",
        help="allow non-loopback --upstream engines together with --api-key",
    )


def router_config_from_args(args: argparse.Namespace, upstreams: list[str]) -> RouterConfig:
    try:
        return RouterConfig(
            upstreams=tuple(upstreams),
            balancer=args.lb,
            locality_threshold=args.locality_threshold,
            chars_per_token=args.chars_per_token,
            api_key=args.api_key,
            max_body_bytes=int(args.max_body_mb * 2**20),
            health_interval_s=args.health_interval,
            max_attempts=args.max_attempts,
            allow_remote_upstreams=args.allow_remote_upstreams,
        )
    except ValueError as error:
        raise UsageError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    if args.upstream:
        engine_flags = ("engines", "model", "policy", "beta", "levels")
        given = [f"--{flag}" for flag in engine_flags if getattr(args, flag) is not None]
        if given:
            raise UsageError(f"--upstream routes over running engines: drop {'/'.join(given)}")
        config = router_config_from_args(args, args.upstream)
        return run_router(config, args.host, args.port)
    engine_configs = plan_engines(args)
    # Checked before any engine starts: a bad router flag must not cost a minute.
    router_config_from_args(args, ["http://127.0.0.1:1"])
    engines: list[EngineProcess] = []

    def ready(i: int, engine: EngineProcess) -> None:
        pid = engine.process.pid if engine.process else None
        say(f"engine {i} ready at {engine.base_url} (pid {pid})")

    stop_on_signals()
    try:
        engines = start_all(engine_configs, args.startup_timeout, on_ready=ready)
        config = router_config_from_args(args, [engine.base_url for engine in engines])
        return run_router(config, args.host, args.port, engines)
    except EngineStartError as error:
        say(f"error: {error}", err=True)
        return 1
    finally:
        _ignore_signals()  # a second Ctrl-C must not cut the shutdown short
        stop_all(engines)


def plan_engines(args: argparse.Namespace) -> list[EngineConfig]:
    """One config per engine: free loopback ports, GPUs split between engines."""
    if args.tensor_parallel_size < 1:
        raise UsageError("--tensor-parallel-size must be >= 1")
    if args.engines is not None and args.engines < 1:
        raise UsageError("--engines must be >= 1")
    base = engine_config_from_args(args, host="127.0.0.1", port=0, log_file=None)
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
        log_file = args.log_dir / f"engine-{i}.log" if args.log_dir is not None else None
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
    import subprocess

    probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return [str(i) for i, line in enumerate(probe.stdout.splitlines()) if line.startswith("GPU")]


def run_router(
    config: RouterConfig, host: str, port: int, engines: list[EngineProcess] | None = None
) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit code."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watcher = asyncio.create_task(_watch_engines(engines or [], stop))
        try:
            await serve_router(config, host, port, stop, on_ready=_announce)
        finally:
            watcher.cancel()

    try:
        with asyncio.Runner(loop_factory=_fast_loop_factory()) as runner:
            runner.run(main())
    except OSError as error:  # e.g. the port is taken
        say(f"error: the router could not listen on {host}:{port}: {error}", err=True)
        return 1
    say("stopped")
    return 0


def _announce(root_url: str) -> None:
    say(f"router ready at {root_url}; SDK base_url={root_url}/v1 ; Ctrl-C stops everything")


async def _watch_engines(engines: list[EngineProcess], stop: asyncio.Event) -> None:
    """Say when an engine process exits (the router takes it out of rotation)."""
    reported: set[int] = set()
    while not stop.is_set():
        for i, engine in enumerate(engines):
            code = engine.process.poll() if engine.process else None
            if code is not None and i not in reported:
                reported.add(i)
                say(f"engine {i} ({engine.base_url}) exited with code {code}", err=True)
        await asyncio.sleep(ENGINE_WATCH_INTERVAL_S)


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
