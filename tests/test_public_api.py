"""The public surface that users configure or script against: it may grow, never shrink.

Dotted paths appear in users' vLLM flags (``--scheduler-cls``, ``--middleware``),
in installed entry points and in their Python code; commands, flags and choice
values appear in their scripts. Moving a module or renaming a flag must keep
the old spelling working, and this test says which spellings those are.
"""

from __future__ import annotations

import argparse
import importlib
from importlib.metadata import entry_points

import pytest
from autellix_vllm.cli import build_parser

# Importable as written (module, attribute): the documented paths.
PUBLIC_PATHS: tuple[tuple[str, str], ...] = (
    ("autellix_vllm.engine.scheduler", "AutellixScheduler"),
    ("autellix_vllm.engine.scheduler", "AutellixAsyncScheduler"),
    ("autellix_vllm.engine.middleware", "IdentityMiddleware"),
    ("autellix_vllm.engine.launcher", "EngineConfig"),
    ("autellix_vllm.engine.launcher", "EngineProcess"),
    ("autellix_vllm.engine.launcher", "EngineStartError"),
    ("autellix_vllm.engine.tiny_model", "ensure_tiny_model"),
    ("autellix_vllm.cli", "main"),
    ("autellix_vllm.policy", "ProgramScheduler"),
    ("autellix_vllm.policy", "PolicyConfig"),
    ("autellix_vllm.policy", "Levels"),
    ("autellix_vllm.policy", "ServiceMeter"),
    ("autellix_vllm.policy", "make_policy"),
    ("autellix_vllm.policy", "make_balancer"),
    ("autellix_vllm.policy", "POLICY_NAMES"),
    ("autellix_vllm.policy", "BALANCER_NAMES"),
    ("autellix_vllm.router", "create_app"),
    ("autellix_vllm.router", "serve_router"),
    ("autellix_vllm.router", "RouterConfig"),
    ("autellix_vllm.sim", "simulate"),
    ("autellix_vllm.sim", "SIM_POLICIES"),
    ("autellix_vllm.sim", "generate"),
    ("autellix_vllm.sim", "load_trace"),
    ("autellix_vllm.sim", "WORKLOADS"),
    ("autellix_vllm.workloads", "generate"),
    ("autellix_vllm.workloads", "load_trace"),
    ("autellix_vllm.workloads", "write_trace"),
) + tuple(
    ("autellix", name)
    for name in (
        "AsyncOpenAI", "OpenAI", "program", "session", "ProgramSession", "fork",
        "create_task", "gather", "thread", "ThreadBlock", "forked", "bound",
        "current_program", "current_thread", "current_identity", "ThreadIdentity",
        "PROGRAM_ID_HEADER", "THREAD_ID_HEADER", "PARENT_THREAD_ID_HEADER",
        "CALL_ID_HEADER", "SESSION_ID_HEADER", "TRANSIENT_STATUS_CODES",
        "expect_tool", "RETENTION_TTL_HEADER", "langchain_clients", "priority", "PRIORITY_HEADER",
    )
)  # fmt: skip

# Every command and flag the `autellix` console script has accepted; none may go.
CLI_FLAGS: dict[str, tuple[str, ...]] = {
    "simulate run": (
        "--workload", "--programs", "--engines", "--preset", "--max-num-seqs", "--seed",
        "--levels", "--beta", "--atlas-variant", "--service-unit", "--prefill-weight", "--json",
        "--policy", "--rate", "--lb", "--trace", "--retention-hints", "--kv-offload-gib",
        "--max-context", "--no-program-end",
    ),
    "simulate sweep": (
        "--workload", "--programs", "--engines", "--preset", "--max-num-seqs", "--seed",
        "--levels", "--beta", "--atlas-variant", "--service-unit", "--prefill-weight", "--json",
        "--policies", "--policy", "--lb", "--duration", "--slo-factor", "--workers", "--plot",
        "--retention-hints", "--kv-offload-gib", "--max-context", "--no-program-end",
    ),
    "simulate bench-policy": ("--running", "--waiting", "--steps", "--json"),
    "engine": (
        "--model", "--served-model-name", "--host", "--port", "--max-num-seqs", "--max-model-len",
        "--kv-cache-gib", "--scheduler", "--device", "--log-file", "--startup-timeout",
        "--policy", "--beta", "--levels", "--api-key", "--tool-call-parser", "--no-tool-calling",
    ),
    "bench engine": (
        "--programs", "--quick", "--seed", "--workload", "--rate", "--max-num-seqs",
        "--schedulers", "--side-by-side", "--json", "--policy", "--max-model-len", "--kv-blocks",
    ),
    "bench scheduler": ("--running", "--waiting", "--steps", "--json"),
    "bench router": (
        "--programs", "--rate", "--seed", "--workload", "--token-scale", "--max-num-seqs",
        "--engines", "--side-by-side", "--locality-threshold", "--chars-per-token", "--upstream",
        "--json",
    ),
    "bench router-overhead": ("--seconds", "--concurrency", "--latency-calls", "--json"),
    "bench soak": ("--minutes", "--rate", "--seed", "--json"),
    "serve": (
        "--model", "--served-model-name", "--max-num-seqs", "--max-model-len", "--kv-cache-gib",
        "--scheduler", "--device", "--host", "--port", "--log-file", "--log-dir", "--engines",
        "--tensor-parallel-size", "--upstream", "--lb", "--locality-threshold",
        "--chars-per-token", "--api-key", "--max-body-mb", "--health-interval", "--max-attempts",
        "--allow-remote-upstreams", "--startup-timeout", "--policy", "--beta", "--levels",
        "--tool-call-parser", "--no-tool-calling", "--engine-key", "--api-keys-file",
        "--admin-key", "--max-programs", "--max-programs-per-key",
    ),
    "ps": ("--url", "--api-key", "--json", "--all"),
    "top": ("--url", "--api-key", "--interval", "--iterations"),
}  # fmt: skip

# Command lines whose choice values must keep parsing (not run).
CHOICE_VALUES: tuple[tuple[str, ...], ...] = (
    *(("simulate", "run", "--workload", w) for w in ("sharegpt", "bfcl", "lats", "mixed")),
    *(
        ("simulate", "run", "--policy", p)
        for p in ("vllm", "vllm-opt", "mlfq", "plas", "atlas", "autellix", "srpt")
    ),
    *(
        ("simulate", "run", "--lb", b)
        for b in ("round-robin", "least-used", "locality", "consistent-hash")
    ),
    *(("simulate", "run", "--preset", p) for p in ("a100-llama8b", "cpu-tiny", "unit")),
    ("simulate", "run", "--atlas-variant", "program", "--service-unit", "time"),
    ("simulate", "sweep", "--policies", "vllm-opt,mlfq,autellix,srpt", "--lb", "locality"),
    *(("engine", "--scheduler", s) for s in ("autellix", "fcfs", "vllm")),
    *(("engine", "--policy", p) for p in ("fcfs", "mlfq", "plas", "atlas", "autellix")),
    ("engine", "--beta", "4", "--levels", "0,64,256"),
    *(("engine", "--device", d) for d in ("auto", "cpu", "gpu")),
    *(("serve", "--scheduler", s, "--lb", "locality") for s in ("autellix", "fcfs")),
    *(("bench", "engine", "--workload", w) for w in ("sharegpt", "bfcl", "lats", "mixed")),
    ("bench", "engine", "--schedulers", "fcfs,fcfs"),
    *(("bench", "router", "--workload", w) for w in ("sharegpt", "bfcl", "lats", "mixed")),
)


@pytest.mark.parametrize(("module", "attribute"), PUBLIC_PATHS)
def test_public_dotted_path_imports(module: str, attribute: str) -> None:
    assert getattr(importlib.import_module(module), attribute) is not None


def test_installed_entry_points_resolve() -> None:
    """vLLM finds the plugins by these names (VLLM_PLUGINS allowlists them)."""
    for group, name in (
        ("vllm.general_plugins", "autellix_general"),
        ("vllm.endpoint_plugins", "autellix_endpoint"),
        ("console_scripts", "autellix"),
    ):
        found = {ep.name: ep for ep in entry_points(group=group)}
        assert name in found, f"entry point {group}:{name} is not installed (run `make install`)"
        assert found[name].load() is not None


def _subcommand(parser: argparse.ArgumentParser, path: str) -> argparse.ArgumentParser:
    for name in path.split():
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


@pytest.mark.parametrize("path", sorted(CLI_FLAGS))
def test_every_flag_is_still_accepted(path: str) -> None:
    parser = _subcommand(build_parser(), path)
    options = {option for action in parser._actions for option in action.option_strings}
    missing = [flag for flag in CLI_FLAGS[path] if flag not in options]
    assert not missing, f"autellix {path} lost {missing}"


@pytest.mark.parametrize("argv", CHOICE_VALUES, ids=" ".join)
def test_choice_values_still_parse(argv: tuple[str, ...]) -> None:
    build_parser().parse_args(list(argv))
