"""The matrix of the default against the other policies (``autellix simulate matrix``)."""

import json
from dataclasses import replace

import pytest
from autellix_vllm.cli import main
from autellix_vllm.policy import PolicyConfig
from autellix_vllm.policy.routing import DEFAULT_LOCALITY_THRESHOLD
from autellix_vllm.sim.matrix import (
    MATRIX_POLICIES,
    MATRIX_SETTINGS,
    EngineSetting,
    best_peer,
    format_header,
    format_row,
    format_tails,
    matrix,
    never_lose_misses,
    setting,
    target_misses,
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


def _point(ratio=1.0, program=None, first_call=None):
    """A fixed-rate point: the default's average latency per token over the baseline's,
    and each policy's P95 program latency and P95 first-call wait (seconds; by default
    the default's equal to the others')."""
    run = ("vllm-opt", "autellix", "continuum", "mori")
    program = {**dict.fromkeys(run, 10.0), **(program or {})}
    first_call = {**dict.fromkeys(run, 1.0), **(first_call or {})}
    return {"ratio": ratio, "p95_program_latency": program, "p95_first_call_wait": first_call}


def _cell(max_rate, points, workload="bfcl"):
    """A cell as :func:`matrix` gives it, with what the verdicts read."""
    return {"workload": workload, "max_rate": max_rate, "best_peer": best_peer(max_rate),
            "latency": points}  # fmt: skip


RATES = {"vllm-opt": 1.0, "mlfq": 1.1, "autellix": 1.5, "continuum": 1.2, "mori": 1.0}


def test_the_peers_are_matrix_columns_and_the_best_one_has_the_highest_rate():
    assert {"continuum", "thunderagent", "mori", "lru-priority"} <= set(MATRIX_POLICIES)
    assert best_peer(RATES) == "continuum"
    assert best_peer({"vllm-opt": 1.0, "autellix": 1.0}) is None


def test_a_cell_that_beats_the_baseline_and_the_peers_meets_both_verdicts():
    cell = _cell(RATES, {0.5: _point(1.0), 1.5: _point(1.05, {"autellix": 9.0})})
    assert never_lose_misses(cell) == [] and target_misses(cell) == []
    # No queueing at a low rate: a first-call wait of 0 against 0 is even.
    idle = _point(first_call={"vllm-opt": 0.0, "autellix": 0.0, "continuum": 0.0})
    assert target_misses(_cell(RATES, {0.5: idle})) == []
    # So are two tails that differ in the rounding of summed times only.
    rounded = _point(program={"vllm-opt": 44.21491626801646, "autellix": 44.21491626801646,
                              "continuum": 44.21491626801645})  # fmt: skip
    assert target_misses(_cell(RATES, {0.5: rounded})) == []


def test_never_lose_names_each_miss():
    slow = _cell({"vllm-opt": 1.0, "mlfq": 1.3, "autellix": 1.2}, {0.5: _point(1.2), 1: _point()})
    assert never_lose_misses(slow) == ["max rate 0.92x mlfq's", "latency 1.20x at 0.5x"]
    assert never_lose_misses(_cell({"vllm-opt": 2.0, "autellix": 1.0}, {1.0: _point()})) == [
        "max rate 0.50x vllm-opt's"
    ]


def test_the_targets_want_every_peers_rate_and_a_margin_over_the_best_on_agents():
    beaten = _cell({**RATES, "mori": 1.6}, {1.0: _point()})
    assert target_misses(beaten) == ["rate vs mori 0.94x < 1x"]
    # 1.5 over continuum's 1.2 is 1.25x: enough everywhere. 1.3 is 1.08x: enough on
    # bfcl, not on agent sessions or the mix, where the best peer is to be beaten by 1.2x.
    close = {**RATES, "autellix": 1.3}
    assert target_misses(_cell(close, {1.0: _point()})) == []
    for workload in ("agent", "mixed"):
        assert target_misses(_cell(RATES, {1.0: _point()}, workload)) == []
        assert target_misses(_cell(close, {1.0: _point()}, workload)) == [
            "rate vs best peer continuum 1.08x < 1.2x"
        ]
    # Both the never-lose verdict and the rate targets hold there: the old claim
    # reads the same with the peers among the policies.
    assert never_lose_misses(_cell(close, {1.0: _point()}, "agent")) == []


def test_the_targets_name_each_tail_the_default_lost_at_each_rate():
    points = {
        0.5: _point(program={"continuum": 9.0}),
        1.0: _point(program={"autellix": 11.0, "continuum": 12.0}),
        1.5: _point(first_call={"vllm-opt": 0.0, "autellix": 0.2}),
    }
    assert target_misses(_cell(RATES, points)) == [
        "program P95 at 0.5x 1.111x continuum's",
        "program P95 at 1x 1.100x vllm-opt's",
        "first-call P95 at 1.5x infx vllm-opt's",
    ]
    # Without a peer among the policies, only the baseline's tails are judged.
    alone = _cell({"vllm-opt": 1.0, "autellix": 1.5}, points)
    assert alone["best_peer"] is None
    assert target_misses(alone) == [
        "program P95 at 1x 1.100x vllm-opt's",
        "first-call P95 at 1.5x infx vllm-opt's",
    ]


def _judged(max_rate, points, workload):
    """A whole cell, as a row and the tails table read it."""
    cell = _cell(max_rate, points, workload)
    cell.update(setting="a100-llama8bx1", ratio=max_rate, censored=[])
    cell.update(never_lose_misses=never_lose_misses(cell), target_misses=target_misses(cell))
    return cell


def test_a_row_gives_both_verdicts_and_the_tails_table_the_best_peers_tail():
    points = {1.0: _point(program={"continuum": 8.0})}
    cell = _judged({**RATES, "autellix": 1.3}, points, "agent")
    assert format_row(cell, ["vllm-opt", "autellix", "continuum"]).endswith(
        "never lose: met | targets: MISS: rate vs best peer continuum 1.08x < 1.2x;"
        " program P95 at 1x 1.250x continuum's"
    )
    lines = format_tails([cell]).splitlines()
    assert lines[1].split() == ["SETTING", "WORKLOAD", "BEST", "PEER", "1x"]
    assert lines[2].split() == ["a100-llama8bx1", "agent", "continuum", "1.00/1.00/1.25"]
    alone = _judged({"vllm-opt": 1.0, "autellix": 0.9}, points, "agent")
    assert format_row(alone, ["vllm-opt", "autellix"]).endswith(
        "never lose: MISS: max rate 0.90x vllm-opt's | targets (no peer swept): met"
    )
    assert format_tails([alone]).splitlines()[2].split()[2:] == ["-", "1.00/1.00/-"]


def test_a_small_matrix_through_the_cli_runs_the_best_peer_at_the_fixed_rates(capsys):
    args = ["simulate", "matrix", "--workloads", "bfcl", "--settings", "a100-llama8b",
            "--policies", "vllm-opt,autellix,continuum", "--duration", "8",
            "--multiples", "0.5,1", "--workers", "1", "--json"]  # fmt: skip
    assert main(args) == 0
    cell = json.loads(capsys.readouterr().out)
    assert cell["setting"] == "a100-llama8bx1" and cell["workload"] == "bfcl"
    assert set(cell["max_rate"]) == {"vllm-opt", "autellix", "continuum"}
    assert cell["ratio"]["vllm-opt"] == 1.0 and cell["best_peer"] == "continuum"
    base = cell["max_rate"]["vllm-opt"]
    assert list(cell["latency"]) == ["0.5", "1.0"]  # JSON's keys are strings
    for multiple, point in cell["latency"].items():
        assert point["rate"] == pytest.approx(float(multiple) * base)
        assert point["ratio"] == pytest.approx(point["autellix"] / point["vllm-opt"])
        # The three policies in full at the point: each one's average and tails.
        for key in ("p95_program_latency", "p95_first_call_wait"):
            assert set(point[key]) == {"vllm-opt", "autellix", "continuum"}
            assert point[key]["vllm-opt"] > 0 and point[key]["continuum"] > 0
    cell["latency"] = {float(m): point for m, point in cell["latency"].items()}
    assert cell["never_lose_misses"] == never_lose_misses(cell)
    assert cell["target_misses"] == target_misses(cell)


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
            "latency": {1.0: {"ratio": 0.9}}, "best_peer": None, "never_lose_misses": [],
            "target_misses": []}  # fmt: skip
    row = format_row(cell, policies)
    for name, ratio in (("vllm-opt", "1.00"), ("plas-atlas", "1.25+"), ("autellix", "1.50")):
        start = header.index(name)  # the name and the ratio under it end alike
        assert row[start : start + len(name)].strip() == ratio
