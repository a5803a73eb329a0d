"""``autellix engine``: run one vLLM server with the Autellix scheduler until Ctrl-C.

    autellix engine                          # SmolLM2-135M-Instruct, port 8000
    autellix engine --model tiny             # random weights: fast, for tests and quick runs
    autellix engine --policy plas --beta 4   # another policy of the Autellix scheduler
    autellix engine --scheduler vllm         # stock vLLM, the baseline
    autellix engine --api-key "$KEY"         # only callers with the key (also $AUTELLIX_ENGINE_KEY)
    autellix engine --model /path/to/model --port 8001 -- --max-num-batched-tokens 2048

Everything after ``--`` goes to vLLM unchanged, except the flags autellix sets
itself (``--api-key``, ``--host``, ``--port``: use autellix's flags).

The engine key (``--api-key``) guards vLLM's ``/v1/*`` routes, the scheduling
fields (the prior service) and ``/autellix/v1/engine/*``; without one, whoever
reaches the port is trusted (fine on a laptop; ``autellix serve`` always gives
its engines a key). Tool calling is on, with the model's parser (``hermes`` for
the built-in models, read off a folder's chat template), so ``tools=`` calls
work; ``--tool-call-parser`` names another, ``--no-tool-calling`` turns it off.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from autellix_vllm.cli import UsageError
from autellix_vllm.cli._arguments import HelpFormatter, checked, reserved_flag
from autellix_vllm.engine.launcher import (
    AUTO_TOOL_PARSER,
    CPU_KV_CACHE_GIB,
    CPU_MAX_MODEL_LEN,
    CPU_MAX_NUM_SEQS,
    SCHEDULERS,
    EngineConfig,
    EngineProcess,
    EngineStartError,
    device_args,
    device_warning,
    scheduler_environment,
    stop_on_signals,
    tool_call_parser,
)
from autellix_vllm.engine.models import MODELS, ModelNotInstalledError, check_installed
from autellix_vllm.engine.settings import ENGINE_POLICY_NAMES, engine_policy, positive_number
from autellix_vllm.policy import DEFAULT_POLICY, Levels, PolicyConfig
from autellix_vllm.protocol.bearer import ENGINE_KEY_VARIABLE

# What `autellix engine` and `autellix serve` serve without --model: the real
# chat model, so agents get sensible answers out of the box.
DEFAULT_MODEL = "smollm2"

# vLLM flags `autellix engine` sets from its own: given after -- they would go
# around it (a key the Autellix extension does not know, a port it does not watch).
ENGINE_RESERVED_FLAGS = {
    "--api-key": "give the engine key as --api-key before -- (it then guards vLLM's"
    " routes and the Autellix fields alike)",
    "--host": "use --host before --",
    "--port": "use --port before --",
}


def add_parser(subparsers: argparse._SubParsersAction, name: str) -> None:
    parser = subparsers.add_parser(
        name,
        help="run one vLLM server with the Autellix scheduler",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    add_engine_arguments(parser)
    parser.add_argument("--host", default=EngineConfig.host, help="address the engine listens on")
    parser.add_argument(
        "--port", type=int, default=EngineConfig.port, help="port (0 picks a free one)"
    )
    parser.add_argument(
        "--api-key",
        dest="engine_key",
        metavar="KEY",
        default=os.environ.get(ENGINE_KEY_VARIABLE),
        help="the engine key: callers must send Authorization: Bearer KEY (default:"
        f" ${ENGINE_KEY_VARIABLE}, else none)",
    )
    parser.add_argument(
        "--log-file",
        type=Path,
        metavar="FILE",
        help="also append the server's output to this file (default: none)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for /health",
    )
    parser.add_argument("vllm_args", nargs="*", help="extra vLLM arguments, after --")
    parser.set_defaults(func=run)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of what each engine runs, shared with ``autellix serve``."""
    defaults = EngineConfig()
    parser.add_argument(
        "--model",
        metavar="NAME_OR_PATH",
        help=f"{' or '.join(MODELS)} (built in; tiny has random weights), a local model"
        f" folder, or a Hugging Face id already in the local cache (default: {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--served-model-name",
        metavar="NAME",
        help="the name clients send as model (default: the model's)",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        metavar="N",
        help="seats: calls in the engine's batch at once (default: on a CPU"
        f" {CPU_MAX_NUM_SEQS}; on a GPU vLLM's, 256, or 1024 on an H100/H200)",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        metavar="TOKENS",
        help="longest prompt plus output, in tokens (default: on a CPU"
        f" {CPU_MAX_MODEL_LEN}; on a GPU the model's own, from its config)",
    )
    parser.add_argument(
        "--kv-cache-gib",
        type=int,
        metavar="GIB",
        help="KV cache size in GiB: on a CPU host memory (VLLM_CPU_KVCACHE_SPACE), on a"
        " GPU vLLM's --kv-cache-memory-bytes (default: on a CPU"
        f" {CPU_KV_CACHE_GIB}; on a GPU what --gpu-memory-utilization 0.9 leaves)",
    )
    parser.add_argument(
        "--kv-offload-gib",
        type=float,
        metavar="GIB",
        help="GPU only: a KV tier of this many GiB of host memory behind the GPU's (vLLM's"
        " --kv-offloading-size, native backend): evicted contexts reload from it instead"
        " of being computed again (default: none)",
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
        help=f"the Autellix scheduler's policy (default: $AUTELLIX_POLICY, else {DEFAULT_POLICY})",
    )
    parser.add_argument(
        "--beta",
        type=checked(positive_number),
        help=f"anti-starvation ratio (default: $AUTELLIX_BETA, else {PolicyConfig().beta:g})",
    )
    parser.add_argument(
        "--levels",
        type=checked(Levels.parse),
        help="level boundaries in service units, e.g. 0,128,512"
        f" (default: $AUTELLIX_LEVELS, else {Levels()})",
    )
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "gpu"],
        default=defaults.device,
        help="auto: gpu for a real model where vLLM's GPU build sees a GPU, else cpu"
        " (the tiny model always runs on the cpu)",
    )
    tools = parser.add_mutually_exclusive_group()
    tools.add_argument(
        "--tool-call-parser",
        default=AUTO_TOOL_PARSER,
        metavar="NAME",
        help="vLLM's parser of the model's tool calls (hermes, llama3_json, mistral, ...);"
        " auto: the model's own (hermes for the built-in models, else read off the"
        " folder's chat template) (default: auto)",
    )
    tools.add_argument(
        "--no-tool-calling",
        action="store_true",
        help="turn tool calling off: a call with tools= then gets vLLM's 400",
    )


def engine_config_from_args(
    args: argparse.Namespace,
    reserved: Mapping[str, str] = ENGINE_RESERVED_FLAGS,
    **overrides: object,
) -> EngineConfig:
    """The engine config of ``args``; ``reserved`` are the vLLM flags the command
    refuses after ``--`` (each with what to write instead)."""
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    for flag in ("max_num_seqs", "max_model_len", "kv_cache_gib"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1")
    if args.kv_offload_gib is not None and not args.kv_offload_gib > 0:
        raise UsageError("--kv-offload-gib must be positive")
    vllm_args = list(getattr(args, "vllm_args", None) or [])
    if problem := reserved_flag(vllm_args, reserved):
        raise UsageError(problem)
    model = args.model or DEFAULT_MODEL
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
        kv_offload_gib=args.kv_offload_gib,
        scheduler=args.scheduler,
        policy=args.policy,
        beta=args.beta,
        levels=args.levels,
        device=args.device,
        log_file=args.log_file,
        extra_args=vllm_args,
        api_key=getattr(args, "engine_key", None),
        tool_call_parser=None if args.no_tool_calling else args.tool_call_parser,
    )
    values.update(overrides)
    try:
        config = EngineConfig(**values)
        scheduler_environment(config)  # also the AUTELLIX_* variables it inherits
        device_args(config, config.resolved_device())  # e.g. a host KV tier on a CPU
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return config


def tool_calling_summary(engine: EngineProcess) -> str:
    """How the engine answers ``tools=``, in a few words for a ready line."""
    parser = tool_call_parser(engine.config, engine.model)
    if parser is not None:
        return f"tool calling: {parser}"
    if engine.config.tool_call_parser is None:
        return "tool calling off"
    return "tool calling off: no parser known for this model (--tool-call-parser NAME)"


def run(args: argparse.Namespace) -> int:
    engine = EngineProcess(engine_config_from_args(args, echo=True))
    if warning := device_warning(engine.config):
        say(f"warning: {warning}")
    if engine.config.api_key is None:
        say(
            f"warning: no --api-key: whoever reaches {engine.base_url} may set scheduling"
            f" fields and use /autellix/v1/engine/* (fine on a laptop; else set --api-key"
            f" or ${ENGINE_KEY_VARIABLE})"
        )
    stop_on_signals()
    try:
        engine.start()
        engine.wait_healthy(args.startup_timeout)
        say(
            f"ready at {engine.base_url}/v1 (model {engine.served_model_name!r};"
            f" {tool_calling_summary(engine)}); Ctrl-C stops it"
        )
        code = engine.process.wait() if engine.process else 0
        say(f"vLLM server exited with code {code}")
        return code or 1
    except EngineStartError as exc:
        say(f"error: {exc}")
        return 1
    finally:
        engine.stop()


def say(message: str) -> None:
    print(f"autellix engine: {message}", file=sys.stderr, flush=True)
