"""``autellix engine``: run one vLLM server with the Autellix scheduler until Ctrl-C.

    autellix engine                          # SmolLM2-135M-Instruct, port 8000
    autellix engine --model tiny             # random weights: fast, for tests and quick runs
    autellix engine --policy plas --beta 4   # another policy of the Autellix scheduler
    autellix engine --scheduler vllm         # stock vLLM, the baseline
    autellix engine --model /path/to/model --port 8001 -- --max-num-batched-tokens 2048

Everything after ``--`` goes to vLLM unchanged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autellix_vllm.cli import UsageError
from autellix_vllm.cli._arguments import checked
from autellix_vllm.engine.launcher import (
    SCHEDULERS,
    EngineConfig,
    EngineProcess,
    EngineStartError,
    scheduler_environment,
    stop_on_signals,
)
from autellix_vllm.engine.models import MODELS, ModelNotInstalledError, check_installed
from autellix_vllm.engine.settings import ENGINE_POLICY_NAMES, engine_policy, positive_number
from autellix_vllm.policy import Levels

# What `autellix engine` and `autellix serve` serve without --model: the real
# chat model, so agents get sensible answers out of the box.
DEFAULT_MODEL = "smollm2"

def add_parser(subparsers: argparse._SubParsersAction, name: str) -> None:
    parser = subparsers.add_parser(
        name,
        help="run one vLLM server with the Autellix scheduler",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_arguments(parser)
    parser.add_argument(
        "--startup-timeout", type=float, default=600.0, help="seconds to wait for /health"
    )
    parser.add_argument("vllm_args", nargs="*", help="extra vLLM arguments, after --")
    parser.set_defaults(func=run)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine flags, shared with commands that start engines (serve, bench)."""
    defaults = EngineConfig()
    parser.add_argument(
        "--model",
        help=f"{' or '.join(MODELS)} (built in; tiny has random weights), or a local model"
        f" folder (default: {DEFAULT_MODEL})",
    )
    parser.add_argument("--served-model-name", help="name clients use (default: the model's)")
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port, help="0 picks a free port")
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    parser.add_argument("--max-model-len", type=int, default=defaults.max_model_len)
    parser.add_argument(
        "--kv-cache-gib",
        type=int,
        default=defaults.kv_cache_gib,
        help="CPU KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)",
    )
    parser.add_argument(
        "--scheduler",
        choices=list(SCHEDULERS),
        default=defaults.scheduler,
        help="; ".join(f"{name}: {meaning}" for name, meaning in SCHEDULERS.items()),
    )
    parser.add_argument(
        "--policy",
        type=checked(engine_policy),
        metavar="{" + ",".join(ENGINE_POLICY_NAMES) + "}",
        help="the Autellix scheduler's policy (default: $AUTELLIX_POLICY, else autellix)",
    )
    parser.add_argument(
        "--beta",
        type=checked(positive_number),
        help="anti-starvation ratio (default: $AUTELLIX_BETA, else 8)",
    )
    parser.add_argument(
        "--levels",
        type=checked(Levels.parse),
        help="level boundaries in service units, e.g. 0,128,512 (default: $AUTELLIX_LEVELS)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "gpu"], default=defaults.device)
    parser.add_argument("--log-file", type=Path, help="also append the server's output here")


def engine_config_from_args(args: argparse.Namespace, **overrides: object) -> EngineConfig:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    for flag in ("max_num_seqs", "max_model_len", "kv_cache_gib"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1")
    model = args.model or DEFAULT_MODEL
    if model.startswith(("/", ".")) and not Path(model).exists():
        raise UsageError(f"--model {model}: no such path")
    try:
        check_installed(model)
    except ModelNotInstalledError as exc:
        raise UsageError(str(exc)) from None
    values = dict(
        model=model,
        served_model_name=args.served_model_name,
        host=args.host,
        port=args.port,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        kv_cache_gib=args.kv_cache_gib,
        scheduler=args.scheduler,
        policy=args.policy,
        beta=args.beta,
        levels=args.levels,
        device=args.device,
        log_file=args.log_file,
        extra_args=list(getattr(args, "vllm_args", None) or []),
    )
    values.update(overrides)
    try:
        config = EngineConfig(**values)  # type: ignore[arg-type]
        scheduler_environment(config)  # also the AUTELLIX_* variables it inherits
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return config


def run(args: argparse.Namespace) -> int:
    engine = EngineProcess(engine_config_from_args(args, echo=True))
    stop_on_signals()
    try:
        engine.start()
        engine.wait_healthy(args.startup_timeout)
        print(
            f"autellix engine: ready at {engine.base_url}/v1"
            f" (model {engine.served_model_name!r}); Ctrl-C stops it",
            file=sys.stderr,
        )
        code = engine.process.wait() if engine.process else 0
        print(f"autellix engine: vLLM server exited with code {code}", file=sys.stderr)
        return code or 1
    except EngineStartError as exc:
        print(f"autellix engine: error: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.stop()
