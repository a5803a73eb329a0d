"""Every ``autellix serve`` and ``autellix engine`` command in README.md and
docs/*.md parses with the real parser and builds consistent engines.

The commands are taken from the files' code blocks, so a doc change is tested.
Each is planned as on a host with 8 GPUs (``CUDA_VISIBLE_DEVICES``, with
``gpu_available`` faked) and, for serve, checked the way a GPU host would need
it: each engine gets its own GPUs, as many as vLLM's tensor-parallel size, and
no more GPUs than the host has. Nothing is started; model folders named in the
docs need not exist.
"""

from __future__ import annotations

import re

import pytest
from autellix_vllm.cli import build_parser
from autellix_vllm.cli import engine as engine_cli
from autellix_vllm.cli.engine import engine_config_from_args
from autellix_vllm.cli.serve import plan_engines, router_config_from_args
from autellix_vllm.engine import launcher
from autellix_vllm.engine.models import ModelSpec
from doc_code import argv_of, doc_commands

GPUS = [str(i) for i in range(8)]
SERVE_OR_ENGINE = re.compile(r"^autellix (?:serve|engine)(?:\s|$)")
COMMANDS = [
    (doc.where, doc.command) for doc in doc_commands() if SERVE_OR_ENGINE.match(doc.command)
]


def test_the_docs_have_serve_and_engine_commands():
    assert sum("serve" in command for _, command in COMMANDS) >= 5
    assert sum("engine" in command for _, command in COMMANDS) >= 5


@pytest.fixture
def gpu_host(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(GPUS))
    monkeypatch.setattr(launcher, "gpu_available", lambda: True)
    monkeypatch.setattr(engine_cli, "check_installed", lambda model: None)


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_builds_consistent_engines(gpu_host, where, command):
    args = build_parser().parse_args(argv_of(command))
    if args.command == "engine":
        config = engine_config_from_args(args)
        server = launcher.server_command(config, spec_of(config), config.port or 8000)
        assert server.count("--port") == 1, where
        return
    if args.upstream:
        router_config_from_args(args, args.upstream, args.engine_key)
        return
    configs = plan_engines(args, engine_key="k")
    tp = args.tensor_parallel_size
    used: list[str] = []
    for config in configs:
        server = launcher.server_command(config, spec_of(config), 1)
        tp_values = [
            server[i + 1] for i, word in enumerate(server) if word == "--tensor-parallel-size"
        ]
        if config.resolved_device() == "gpu":
            gpus = config.extra_env["CUDA_VISIBLE_DEVICES"].split(",")
            assert len(gpus) == tp, (where, gpus)  # vLLM's TP size is the GPUs it was given
            used += gpus
        assert tp_values == ([str(tp)] if tp > 1 else []), (where, server)
    assert len(used) == len(set(used)) and len(used) <= len(GPUS), (where, used)


def spec_of(config: launcher.EngineConfig) -> ModelSpec:
    """A model spec without building a model folder."""
    return ModelSpec(config.model_name, config.model_name, tool_call_parser="hermes")
