"""Command-line mistakes of serve/ps end with one line and exit code 2 (nothing starts)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SERVE = [sys.executable, "-m", "autellix_vllm"]


@pytest.mark.parametrize(
    "arguments",
    [
        ["serve", "--upstream", "http://127.0.0.1:9", "--engines", "2"],
        ["serve", "--lb", "random"],
        ["serve", "--api-key", "k", "--upstream", "http://10.9.9.9:8000"],
        ["serve", "--upstream", "http://127.0.0.1:9/v1"],
        ["ps", "--url", "http://127.0.0.1:9"],
    ],
)
def test_bad_command_lines_end_with_one_line_and_code_2(arguments):
    result = subprocess.run([*SERVE, *arguments], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result
    assert len(result.stderr.strip().splitlines()) == 1 and "error" in result.stderr


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
    assert all(c.model is None for c in cpu)  # the embedded tiny model
