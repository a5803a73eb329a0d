"""Command-line mistakes of serve/ps end with one line and exit code 2 (nothing starts)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from autellix_vllm.policy.config import ProgramLimits

SERVE = [sys.executable, "-m", "autellix_vllm"]


@pytest.mark.parametrize(
    "arguments",
    [
        ["serve", "--upstream", "http://127.0.0.1:9", "--engines", "2"],
        ["serve", "--lb", "random"],
        ["serve", "--api-key", "k", "--upstream", "http://10.9.9.9:8000"],
        ["serve", "--upstream", "http://127.0.0.1:9/v1"],
        ["serve", "--upstream", "http://127.0.0.1:9", "--locality-threshold", "-1"],
        ["ps", "--url", "http://127.0.0.1:9"],
        ["serve", "--policy", "srpt"],
        ["serve", "--upstream", "http://127.0.0.1:9", "--policy", "plas"],
        ["engine", "--beta", "0"],
        ["serve", "--model", "tiny", "--", "--tensor-parallel-size", "4"],
        ["serve", "--model", "tiny", "--", "-tp=2"],
        ["engine", "--model", "tiny", "--", "--api-key", "k"],
        ["engine", "--model", "meta-llama/Llama-3.1-8B-Instruct"],
        ["serve", "--model", "./no-such-folder"],
        ["engine", "--tool-call-parser", "hermes", "--no-tool-calling"],
        ["serve", "--max-threads", "0"],
        ["serve", "--idle-ttl", "-1"],
    ],
)
def test_bad_command_lines_end_with_one_line_and_code_2(arguments):
    result = subprocess.run([*SERVE, *arguments], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result
    assert len(result.stderr.strip().splitlines()) == 1 and "error" in result.stderr


def test_a_bad_autellix_variable_ends_with_one_line_and_code_2_before_any_engine():
    env = {**os.environ, "AUTELLIX_POLICY": "lottery"}
    result = subprocess.run(
        [*SERVE, "engine", "--port", "0"], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 2, result
    assert result.stderr.strip() == (
        "autellix engine: error: AUTELLIX_POLICY='lottery': unknown policy 'lottery'"
        " (choose from fcfs, mlfq, plas, atlas, plas-atlas, autellix,"
        " continuum, thunderagent, mori, lru-priority)"
    )


def parse(command: str, *arguments: str):
    from autellix_vllm.cli import build_parser

    return build_parser({command: f"autellix_vllm.cli.{command}"}).parse_args([command, *arguments])


def parse_error(capsys, command: str, *arguments: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        parse(command, *arguments)
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("command", ["engine", "serve"])
def test_policy_flags_reach_the_engine_config(command, monkeypatch):
    from autellix_vllm.cli.engine import engine_config_from_args

    monkeypatch.delenv("AUTELLIX_POLICY", raising=False)
    args = parse(command, "--policy", "plas", "--beta", "4", "--levels", "0,4,8")
    config = engine_config_from_args(args)
    assert (config.scheduler, config.policy, config.beta) == ("autellix", "plas", 4.0)
    assert config.levels.boundaries == (0.0, 4.0, 8.0)
    default = engine_config_from_args(parse(command))
    assert (default.policy, default.beta, default.levels) == (None, None, None)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--policy", "srpt"], "argument --policy: srpt is a clairvoyant oracle"),
        (["--policy", "vllm"], "unknown policy 'vllm' (choose from fcfs, mlfq, plas, atlas,"),
        (["--beta", "-2"], "argument --beta: must be positive, got -2"),
        (["--levels", "8,16"], "argument --levels: level boundaries must start at 0"),
        (["--scheduler", "stock"], "invalid choice: 'stock'"),
    ],
)
def test_bad_policy_flags_are_one_line_errors(capsys, arguments, message):
    assert message in parse_error(capsys, "engine", *arguments)


def test_every_scheduler_name_parses_and_stock_vllm_takes_no_policy():
    from autellix_vllm.cli import UsageError
    from autellix_vllm.cli.engine import engine_config_from_args

    for name in ("autellix", "vllm", "fcfs"):
        assert engine_config_from_args(parse("engine", "--scheduler", name)).scheduler == name
    with pytest.raises(UsageError, match="tune the Autellix scheduler"):
        engine_config_from_args(parse("engine", "--scheduler", "vllm", "--policy", "plas"))


def serve_args(*arguments: str):
    from autellix_vllm.cli import build_parser

    return build_parser({"serve": "autellix_vllm.cli.serve"}).parse_args(["serve", *arguments])


def test_one_engine_per_gpu_by_default_and_tensor_parallel_groups(monkeypatch, tmp_path):
    from autellix_vllm.cli import UsageError
    from autellix_vllm.cli.serve import plan_engines

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    gpu = ["--device", "gpu", "--model", str(tmp_path)]
    per_gpu = plan_engines(serve_args(*gpu))
    assert [c.extra_env["CUDA_VISIBLE_DEVICES"] for c in per_gpu] == ["0", "1", "2", "3"]
    assert {(c.host, c.port) for c in per_gpu} == {("127.0.0.1", 0)}  # loopback, free ports
    pairs = plan_engines(serve_args(*gpu, "--tensor-parallel-size", "2", "--", "--seed", "1"))
    assert [c.extra_env["CUDA_VISIBLE_DEVICES"] for c in pairs] == ["0,1", "2,3"]
    assert pairs[0].extra_args == ["--seed", "1", "--tensor-parallel-size", "2"]
    with pytest.raises(UsageError, match="GPUs"):
        plan_engines(serve_args(*gpu, "--engines", "3", "--tensor-parallel-size", "2"))
    cpu = plan_engines(serve_args("--device", "cpu", "--engines", "2"))
    assert len(cpu) == 2 and all("CUDA_VISIBLE_DEVICES" not in c.extra_env for c in cpu)
    assert all(c.model == "smollm2" for c in cpu)  # the real model unless --model says
    assert {c.model for c in plan_engines(serve_args("--model", "tiny"))} == {"tiny"}


def test_serve_refuses_tensor_parallel_after_the_separator_and_names_its_own_flag():
    result = subprocess.run(
        [*SERVE, "serve", "--model", "tiny", "--", "--tensor-parallel-size", "4"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("autellix serve: error: --tensor-parallel-size after --")
    assert "give --tensor-parallel-size T before --" in result.stderr


def test_a_model_that_is_not_here_is_one_line_before_anything_starts():
    result = subprocess.run(
        [*SERVE, "engine", "--model", "meta-llama/Llama-3.1-8B-Instruct"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "not in the local Hugging Face cache" in result.stderr
    assert "--model /path/to/model" in result.stderr and "Traceback" not in result.stderr


def test_serve_checks_the_router_port_before_it_starts_an_engine():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*SERVE, "serve", "--model", "tiny", "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 2, result
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "starting" not in result.stdout  # no engine was started


def test_serve_warns_about_upstreams_that_are_down_and_prints_a_client_to_paste():
    import signal

    served = subprocess.Popen(
        [*SERVE, "serve", "--upstream", "http://127.0.0.1:9", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ready = served.stdout.readline()
        snippet = [served.stdout.readline() for _ in range(4)]
    finally:
        served.send_signal(signal.SIGTERM)
        _, errors = served.communicate(timeout=30)
    assert "warning: engine http://127.0.0.1:9 does not answer" in errors
    assert ready.startswith("autellix serve: router ready at http://127.0.0.1:")
    assert ready.rstrip().endswith("Ctrl-C stops everything.")  # a line of its own
    assert snippet[0] == "A client (Python):\n"
    assert snippet[1].startswith("from autellix import OpenAI")
    assert 'api_key="-"' in snippet[2] and "/v1" in snippet[2]
    assert "chat.completions.create(" in snippet[3]


def test_serve_gives_every_engine_the_runs_key_and_the_router_the_same(monkeypatch):
    from autellix_vllm.cli.serve import plan_engines, router_config_from_args

    args = serve_args("--model", "tiny", "--engines", "2", "--admin-key", "admin-k")
    configs = plan_engines(args, engine_key="run-key")
    assert [c.api_key for c in configs] == ["run-key", "run-key"]
    router = router_config_from_args(args, ["http://127.0.0.1:1"], "run-key")
    assert (router.engine_key, router.admin_key) == ("run-key", "admin-k")


def test_serve_gives_its_engines_the_routers_own_limits_and_idle_ttl(monkeypatch):
    """One source: the flags make the router's table bounds, and the engines serve
    starts read the same limits and idle TTL from the variables it writes."""
    from autellix_vllm.cli.serve import plan_engines, router_config_from_args
    from autellix_vllm.engine.launcher import scheduler_environment
    from autellix_vllm.engine.settings import SchedulerSettings

    monkeypatch.setenv("AUTELLIX_MAX_THREADS", "99")  # the flag wins over the inherited one
    args = serve_args("--model", "tiny", "--engines", "2", "--max-threads", "8",
                      "--max-fork-depth", "3", "--max-live-calls", "5", "--idle-ttl", "30",
                      "--max-programs", "40")  # fmt: skip
    router = router_config_from_args(args, ["http://127.0.0.1:1"], "run-key")
    assert router.table.limits == ProgramLimits(max_threads=8, max_fork_depth=3, max_live_calls=5)
    assert (router.table.idle_ttl_s, router.table.max_programs) == (30.0, 40)
    for config in plan_engines(args, engine_key="run-key"):
        engine = SchedulerSettings.from_env(scheduler_environment(config)).config.table
        assert (engine.limits, engine.idle_ttl_s) == (router.table.limits, 30.0)


def test_tool_calling_flags_reach_the_engine_config():
    from autellix_vllm.cli.engine import engine_config_from_args

    assert engine_config_from_args(parse("engine", "--model", "tiny")).tool_call_parser == "auto"
    named = parse("engine", "--model", "tiny", "--tool-call-parser", "llama3_json")
    assert engine_config_from_args(named).tool_call_parser == "llama3_json"
    off = parse("engine", "--model", "tiny", "--no-tool-calling")
    assert engine_config_from_args(off).tool_call_parser is None


def test_engine_takes_its_key_from_the_flag_or_the_variable(monkeypatch):
    from autellix_vllm.cli.engine import engine_config_from_args

    monkeypatch.setenv("AUTELLIX_ENGINE_KEY", "from-env")
    assert engine_config_from_args(parse("engine", "--model", "tiny")).api_key == "from-env"
    flagged = parse("engine", "--model", "tiny", "--api-key", "from-flag")
    assert engine_config_from_args(flagged).api_key == "from-flag"


@pytest.mark.parametrize("output", ["--all", "--json"])
async def test_ps_cut_short_by_its_reader_ends_quietly(output):
    """`autellix ps --all | head -8` once ended in a BrokenPipeError traceback."""
    from aiohttp import web
    from local_http import serving

    rows = [{"program_id": f"prog-{i}", "name": "react", "age_s": 1.0} for i in range(20000)]

    async def table(request: web.Request) -> web.Response:
        return web.json_response({"programs": rows, "total": len(rows), "engines": []})

    app = web.Application()
    app.router.add_get("/autellix/v1/programs", table)
    async with serving(web.AppRunner(app)) as url:
        shell = await asyncio.create_subprocess_exec(
            "bash", "-c", f"set -o pipefail; {sys.executable} -m autellix_vllm ps --url {url}"
            f" {output} | head -c 100 >/dev/null",
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, stderr = await asyncio.wait_for(shell.communicate(), timeout=120)
    assert shell.returncode == 0 and stderr.decode() == ""
