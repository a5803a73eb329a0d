"""Serve Autellix on a Ray cluster: engine replicas, the program-aware router, one table.

Deploys the Ray Serve application of ``autellix_vllm.ray_serve`` (needs the
``ray`` extra: ``pip install autellix[ray]``) and serves it until Ctrl-C, like
``serve run``: the engines are Serve replicas (restarted when they die), each
running ``autellix engine``; calls are placed by the program-aware request
router (or Ray's own, ``--router``); one process table serves every ingress
replica. Without ``--address`` a local Ray cluster is started and stopped with
the command. ``autellix serve`` remains the single-host router.

--flow-control holds calls of worse classes as ``autellix serve`` does, at the
one process table: the pool's seats are --replicas times --max-num-seqs (on a
CPU its default; a GPU engine needs --max-num-seqs).

  autellix ray-serve --model tiny --replicas 2
  autellix ray-serve --address auto --model smollm2 --replicas 4 --engine-cpus 4
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import TYPE_CHECKING

from autellix_vllm.cli import UsageError
from autellix_vllm.cli._arguments import HelpFormatter
from autellix_vllm.cli.engine import add_engine_arguments, engine_config_from_args
from autellix_vllm.cli.serve import (
    add_router_arguments,
    flow_control_from_args,
    table_bounds_from_args,
)
from autellix_vllm.protocol.bearer import ENGINE_KEY_VARIABLE

if TYPE_CHECKING:  # imported where used: Ray is an extra
    from autellix_vllm.ray_serve.app import RayServeConfig

# EngineConfig fields each replica sets itself (where its engine listens, its key, its log).
_REPLICA_OWNED = ("host", "port", "api_key", "log_file")


def add_parser(subparsers: argparse._SubParsersAction, name: str) -> None:
    parser = subparsers.add_parser(
        name,
        help="serve on a Ray cluster: engine replicas, program-aware routing (ray extra)",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--address",
        metavar="ADDRESS",
        help="the Ray cluster to deploy on, auto for this node's (default: a local one,"
        " started for the command's lifetime)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address Serve's HTTP proxy binds")
    parser.add_argument("--port", type=int, default=8000, help="Serve's HTTP port")
    parser.add_argument("--replicas", type=int, default=2, help="engine replicas")
    parser.add_argument(
        "--ingress-replicas", type=int, default=1, help="replicas of the HTTP ingress"
    )
    parser.add_argument(
        "--router",
        choices=("autellix", "pow2", "consistent-hash"),
        default="autellix",
        help="how engine replicas are picked: autellix (program-aware, --lb), or Ray's"
        " pow2 and consistent-hash (baselines)",
    )
    parser.add_argument(
        "--engine-cpus", type=float, default=1.0, help="CPUs Ray reserves per engine replica"
    )
    parser.add_argument(
        "--engine-gpus",
        type=float,
        default=0.0,
        help="GPUs Ray reserves per engine replica (1 on a GPU cluster: one engine per GPU)",
    )
    parser.add_argument(
        "--engine-key",
        metavar="KEY",
        help="the key every engine replica starts its engine with, for reading the engines"
        f" directly (default: ${ENGINE_KEY_VARIABLE}, else a fresh random key per replica)",
    )
    add_engine_arguments(parser)
    add_router_arguments(parser)
    parser.set_defaults(func=run, log_file=None)


def config_from_args(args: argparse.Namespace) -> RayServeConfig:
    """The application's :class:`~autellix_vllm.ray_serve.app.RayServeConfig` of ``args``."""
    try:
        from autellix_vllm.ray_serve.app import RayServeConfig
        from autellix_vllm.ray_serve.ingress import IngressSettings
    except ImportError as error:
        raise UsageError(f"{error}: install the ray extra (pip install 'autellix[ray]')") from None
    if args.allow_remote_upstreams:
        raise UsageError("--allow-remote-upstreams is for autellix serve --upstream")
    engine = engine_config_from_args(args, table=table_bounds_from_args(args))
    fields = {
        f.name: getattr(engine, f.name)
        for f in dataclasses.fields(engine)
        if f.init and f.name not in _REPLICA_OWNED
    }
    if args.address is None:
        fields["engines_on_host"] = args.replicas  # a local cluster: one host's cores
    try:
        return RayServeConfig(
            engine=fields,
            replicas=args.replicas,
            ingress_replicas=args.ingress_replicas,
            router=args.router,
            balancer=args.lb,
            locality_threshold=args.locality_threshold,
            engine_cpus=args.engine_cpus,
            engine_gpus=args.engine_gpus,
            engine_key=args.engine_key or os.environ.get(ENGINE_KEY_VARIABLE),
            health_check_period_s=args.health_interval,
            flow_control=flow_control_from_args(args),
            directory={
                "bounds": table_bounds_from_args(args),
                "derived_programs": args.derived_programs,
                "prefix_programs": args.prefix_programs,
                "derived_idle_end_s": args.derived_idle_end,
            },
            ingress=IngressSettings(
                chars_per_token=args.chars_per_token,
                max_attempts=args.max_attempts,
                max_body_bytes=int(args.max_body_mb * 2**20),
                api_key=args.api_key,
                api_keys_file=args.api_keys_file,
                admin_key=args.admin_key,
            ),
        )
    except (ValueError, OSError) as error:
        raise UsageError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    from autellix_vllm.ray_serve.launch import serve_until_stopped

    where = args.address or "a local Ray cluster"
    say(f"deploying {args.replicas} engine replicas on {where} (each takes about a minute)")
    try:
        serve_until_stopped(
            config,
            args.address,
            args.host,
            args.port,
            lambda url: say(f"ready at {url}/v1 (Ctrl-C stops it)"),
        )
    except KeyboardInterrupt:
        say("stopped")
    return 0


def say(message: str) -> None:
    print(f"autellix ray-serve: {message}", file=sys.stdout, flush=True)
