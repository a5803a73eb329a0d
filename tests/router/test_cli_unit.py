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
