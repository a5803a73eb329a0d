"""The matrix of the default against the other policies (``autellix simulate matrix``)."""

from dataclasses import replace

import pytest
from autellix_vllm.cli import main
from autellix_vllm.policy import PolicyConfig
from autellix_vllm.policy.routing import DEFAULT_LOCALITY_THRESHOLD
from autellix_vllm.sim.matrix import (
    MATRIX_SETTINGS,
    EngineSetting,
    format_header,
    format_row,
    matrix,
    setting,
    verdict,
)
from autellix_vllm.sim.sweep import run_at


def test_a_setting_reads_as_its_label_writes_it():
    assert setting("a100-llama8b") == EngineSetting("a100-llama8b", None, 1)
    assert setting("a100-llama8b-kv+64x4") == EngineSetting("a100-llama8b-kv", 64.0, 4)
    assert setting("a100-llama8b-kv+0.5") == EngineSetting("a100-llama8b-kv", 0.5, 1)
    for where in MATRIX_SETTINGS:
        assert setting(where.label) == where
    assert {where.lb for where in MATRIX_SETTINGS} == {"round-robin", "locality"}


@pytest.mark.parametrize(
    ("text", "problem"),
    [("h100", "unknown preset 'h100'"), ("a100-llama8b+x", "not an engine setting"),
     ("a100-llama8bx0", "at least one engine"), ("unit+8", "no KV size per token")],
)  # fmt: skip
def test_a_bad_setting_is_one_error_naming_it(text, problem):
    with pytest.raises(ValueError, match=problem):
        setting(text)


def _cell(max_rate, ratios, stopped=False):
    latency = {m: {"ratio": r, "stopped_early": stopped} for m, r in ratios.items()}
    return {"max_rate": max_rate, "latency": latency}


def test_the_verdict_names_each_miss():
    met = _cell({"vllm-opt": 1.0, "mlfq": 1.1, "autellix": 1.2}, {0.5: 1.0, 1.5: 1.05})
    assert verdict(met) == []
    slow = _cell({"vllm-opt": 1.0, "mlfq": 1.3, "autellix": 1.2}, {0.5: 1.2, 1.0: 0.9}, True)
    assert verdict(slow) == ["max rate 0.92x mlfq's", "latency >= 1.20x at 0.5x"]
    assert verdict(_cell({"vllm-opt": 2.0, "autellix": 1.0}, {1.0: 1.0})) == [
        "max rate 0.50x vllm-opt's"
    ]


def test_a_small_matrix_compares_the_default_with_the_baseline():
    (cell,) = matrix(
        ["bfcl"], [setting("a100-llama8b")], policies=["vllm-opt", "autellix"],
        duration=20, multiples=[0.5, 1.0], workers=1,
    )  # fmt: skip
    assert cell["setting"] == "a100-llama8bx1" and cell["workload"] == "bfcl"
    assert set(cell["max_rate"]) == {"vllm-opt", "autellix"} and cell["ratio"]["vllm-opt"] == 1.0
    base = cell["max_rate"]["vllm-opt"]
    for multiple, point in cell["latency"].items():
        assert point["rate"] == pytest.approx(multiple * base)
        assert point["ratio"] == pytest.approx(point["autellix"] / point["vllm-opt"])
        # Both policies' tails at the point (the default's None if it stopped early).
        for key in ("p95_program_latency", "p95_first_call_wait"):
            assert point[key]["vllm-opt"] > 0
            assert (point[key]["autellix"] is None) == point["stopped_early"]
    assert cell["misses"] == verdict(cell)


def test_the_matrix_wants_the_baseline_first_and_the_default_among_the_policies(capsys):
    with pytest.raises(ValueError, match="name vllm-opt first"):
        next(matrix(["bfcl"], [setting("a100-llama8b")], policies=["mlfq", "autellix"]))
    code = main(["simulate", "matrix", "--workloads", "bfcl", "--policies", "vllm-opt,mlfq"])
    assert code == 2
    assert "name vllm-opt first and autellix among the policies" in capsys.readouterr().err


def test_the_matrix_routes_several_engines_with_the_locality_threshold_it_is_given():
    # bfcl's calls are short: at 0 every call sticks to its program's engine and
    # finds its prefix cached there, so the baseline's highest rate is higher.
    def cell(threshold):
        (result,) = matrix(
            ["bfcl"], [setting("a100-llama8b-kvx2")], policies=["vllm-opt", "autellix"],
            duration=8, multiples=[1.0], workers=1, locality_threshold=threshold,
        )  # fmt: skip
        assert result["locality_threshold"] == threshold
        return result

    bound, spread = cell(0), cell(10**9)
    assert bound["max_rate"]["vllm-opt"] > spread["max_rate"]["vllm-opt"]
    # The fixed-rate runs route as the sweep did.
    where = setting("a100-llama8b-kvx2")
    default = where.sweep_setup("bfcl", 0, PolicyConfig())
    assert default.locality_threshold == DEFAULT_LOCALITY_THRESHOLD
    point = bound["latency"][1.0]
    setup = replace(where, locality_threshold=0).sweep_setup("bfcl", 0, PolicyConfig(), 8)
    again = run_at(setup, "vllm-opt", "locality", point["rate"])
    assert again["avg_latency_per_token"] == point["vllm-opt"]


def test_the_text_header_says_how_several_engines_are_routed():
    lines = format_header(["vllm-opt", "autellix"], 0).splitlines()
    assert lines[0].endswith("several engines routed by locality, threshold 0 prompt tokens")
    assert lines[1].split()[:4] == ["SETTING", "WORKLOAD", "vllm-opt", "autellix"]


def test_a_policy_column_is_as_wide_as_the_policys_name():
    """Any registered policy may be a column: its name in full, its ratio under it."""
    policies = ["vllm-opt", "plas-atlas", "autellix"]
    header = format_header(policies, 0).splitlines()[1]
    cell = {"setting": "a100-llama8bx1", "workload": "bfcl", "censored": ["plas-atlas"],
            "ratio": {"vllm-opt": 1.0, "plas-atlas": 1.25, "autellix": 1.5},
            "latency": {1.0: {"ratio": 0.9}}, "misses": []}  # fmt: skip
    row = format_row(cell, policies)
    for name, ratio in (("vllm-opt", "1.00"), ("plas-atlas", "1.25+"), ("autellix", "1.50")):
        start = header.index(name)  # the name and the ratio under it end alike
        assert row[start : start + len(name)].strip() == ratio
