"""The client-side benchmark and how every benchmark prints its result."""

import json
import subprocess
import sys

from autellix_vllm.cli import print_result


def test_the_sdk_benchmark_runs_in_process():
    out = subprocess.run(
        [sys.executable, "-m", "autellix_vllm", "bench", "sdk", "--transport", "mock",
         "--calls", "20", "--warmup", "2", "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["calls_per_variant"] == 20
    assert result["autellix_vs_plain"]["client_cpu"]["baseline_median_us"] > 0


def test_results_print_as_one_json_line_or_as_indented_rows(capsys):
    result = {"avg": 0.123456789, "baseline": {"p95": 2.0, "scheduler": "vllm"}, "n": 3}
    print_result(result, as_json=True)
    assert json.loads(capsys.readouterr().out) == result
    print_result(result, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines] == [
        ["avg", "0.123457"], ["baseline"], ["p95", "2"], ["scheduler", "vllm"], ["n", "3"],
    ]
    assert lines[2].startswith("  p95")
