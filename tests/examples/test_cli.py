"""The example scripts as commands: bad input gets one line and a non-zero exit."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys

import pytest
from demo import EXAMPLES
from scripted_server import as_json, scripted_server


def run(script: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *options],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("script", "options", "message"),
    [
        ("react_agent.py", ["--agents", "0"], "must be at least 1"),
        ("react_agent.py", ["--agents", "many"], "expected a whole number"),
        ("react_agent.py", ["--max-steps", "-3"], "must be at least 1"),
        ("react_agent.py", ["--retries", "-1"], "--retries must be >= 0"),
        ("react_agent.py", ["--no-such-flag"], "unrecognized arguments"),
        ("mcts_agent.py", ["--width", "0"], "must be at least 1"),
        ("mcts_agent.py", ["--puzzle", "4 seven 8 8"], "whole numbers"),
        ("mcts_agent.py", ["--puzzle", "4"], "2 to 6 numbers"),
        ("mcts_agent.py", ["--iterations", "1.5"], "expected a whole number"),
        ("demo.py", ["--engines", "0"], "must be at least 1"),
        ("demo.py", ["--ps-every", "0"], "must be positive"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(script, options, message):
    result = run(script, *options)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0] and "error" in lines[0], result.stderr


def test_an_unreachable_server_is_one_line_and_exit_code_1():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for script in ("react_agent.py", "mcts_agent.py"):
        result = run(script, "--base-url", f"http://127.0.0.1:{port}/v1", "--quiet")
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [
            f"{script}: error: cannot reach http://127.0.0.1:{port}/v1 (--base-url)"
        ]


async def test_a_run_prints_the_table_and_writes_the_reports(tmp_path):
    def model(body: dict) -> str:
        return as_json({"thought": "done", "action": "finish", "input": "88"})

    reports = tmp_path / "reports.json"
    async with scripted_server(model) as server:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(EXAMPLES / "react_agent.py"), "--base-url", server.base_url,
            "--model", "scripted", "--api-key", "key", "--agents", "2", "--json", str(reports),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, stderr
    lines = stdout.decode().splitlines()
    assert lines[0].split()[:3] == ["PROGRAM", "ID", "CALLS"]
    assert [line.split()[0] for line in lines[1:]] == ["react-1", "react-2"]
    assert all(line.split()[-1] == "88" for line in lines[1:])
    assert [row["answer"] for row in json.loads(reports.read_text())] == ["88", "88"]
    assert "react-1 finished" in stderr.decode()  # progress, unless --quiet


@pytest.mark.parametrize("script", ["react_agent", "mcts_agent", "demo"])
def test_every_flag_of_an_example_shows_its_default_as_the_commands_do(script):
    import importlib

    parser = importlib.import_module(script).parser()
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        shown = formatter._expand_help(action) if action.help else ""
        assert shown, (script, action.option_strings)
        if action.nargs == 0:  # a switch says what giving it does
            assert "(default" not in shown, (script, action.option_strings, shown)
        else:
            assert "(default: " in shown, (script, action.option_strings, shown)


def test_the_examples_ignore_a_shell_set_up_for_a_hosted_api(monkeypatch):
    import react_agent

    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.example.com/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-hosted")
    monkeypatch.delenv("AUTELLIX_API_KEY", raising=False)
    args = react_agent.parser().parse_args([])
    assert args.base_url == "http://127.0.0.1:8000/v1"
    assert args.api_key == "-"
