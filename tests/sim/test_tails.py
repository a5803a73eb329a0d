"""What an average hides: program latency tails and the first-call wait, in the
simulator's run, sweep and matrix, their text and JSON, and the sweep's plot."""

import json

import pytest
from autellix_vllm.cli import main
from autellix_vllm.policy import PolicyConfig
from autellix_vllm.sim import CallSpec, ProgramSpec, simulate
from autellix_vllm.sim.matrix import format_tails
from autellix_vllm.sim.sweep import SweepSetup, format_sweep, plot, run_at, sweep
from autellix_vllm.stats import TAIL_KEYS, percentile
from autellix_vllm.workloads.trace import write_trace


def two_programs(prompt_tokens: int) -> list[ProgramSpec]:
    """A: two calls one after the other, 1 s of tool between them; B arrives at 0.5 s."""
    a0 = CallSpec("a0", 2, prompt_tokens)
    a1 = CallSpec("a1", 2, prompt_tokens, after=("a0",), tool_gap=1.0)
    return [ProgramSpec("A", 0.0, (a0, a1)), ProgramSpec("B", 0.5, (CallSpec("b0", 3),))]


# One seat, one second a step, first come first served: a0 prefills in [0, 1] (its
# first token at 1) and decodes in [1, 2]; B waits for the seat, prefills in [2, 3]
# (first token at 3) and decodes until 5; a1 arrives at 3, runs from 5 to 7. A
# prompt of one token (prompt_tokens 0) runs as a decode step, a longer one as a
# prefill: the same times either way.
@pytest.mark.parametrize("prompt_tokens", [0, 40])
def test_program_latency_and_first_call_wait_of_a_hand_built_run(prompt_tokens):
    result = simulate(two_programs(prompt_tokens), "vllm", preset="unit", max_num_seqs=1)
    assert result.program_latency == {"A": 7.0, "B": 4.5}
    metrics = result.metrics
    assert metrics["p95_program_latency"] == metrics["p99_program_latency"] == 7.0
    assert metrics["avg_first_call_wait"] == pytest.approx((1.0 + 2.5) / 2)
    assert metrics["p95_first_call_wait"] == 2.5


def test_the_first_call_wait_starts_at_the_first_calls_arrival():
    """A first call's own tool gap (the program thinks first) is not waiting."""
    (late,) = [ProgramSpec("C", 1.0, (CallSpec("c0", 2, 40, tool_gap=2.0),))]
    metrics = simulate([late], "vllm", preset="unit", max_num_seqs=1).metrics
    assert metrics["avg_first_call_wait"] == 1.0  # arrives at 3, first token at 4
    assert metrics["p95_program_latency"] == 4.0  # program arrival 1 to completion 5


def test_the_run_cli_shows_the_tails_in_text_and_json(tmp_path, capsys):
    trace = tmp_path / "two.jsonl"
    write_trace(two_programs(40), trace)
    args = ["simulate", "run", "--trace", str(trace), "--policy", "vllm", "--preset", "unit",
            "--max-num-seqs", "1"]  # fmt: skip
    assert main([*args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [result[key] for key in TAIL_KEYS] == [7.0, 7.0, 1.75, 2.5]
    assert main(args) == 0
    lines = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()}
    assert lines["p99_program_latency"] == ["7", "s", "(simulated)"]
    assert lines["avg_first_call_wait"] == ["1.75", "s", "(simulated)"]


def test_a_sweep_compares_the_tails_at_the_highest_rate_every_policy_met(tmp_path):
    result, curves = sweep("bfcl", ["vllm-opt", "autellix"], duration=8, max_num_seqs=8,
                           workers=1)  # fmt: skip
    tails = result["tails"]
    assert tails["rate"] == min(result["max_rate"].values())
    for curve in curves:
        measured = tails["by_policy"][curve.key]
        latencies = curve.program_latency[tails["rate"]]
        assert measured["p95_program_latency"] == percentile(latencies, 95)
        assert measured["p99_program_latency"] == percentile(latencies, 99)
        assert measured["avg_first_call_wait"] > 0 and measured["p95_first_call_wait"] > 0
        # Each rate the search ran is a row; full runs have their tails.
        rows = result["points"][curve.key]
        assert [row["rate"] for row in rows] == [rate for rate, _ in curve.points]
        for row in rows:
            assert set(TAIL_KEYS) <= set(row) or row["stopped_early"]
    # The same figures as a run of its own at that rate, in full, whether the
    # search had run that rate already (the policy whose max rate it is) or not.
    setup = SweepSetup("bfcl", 0, 1, "a100-llama8b", 8, PolicyConfig(), 8)
    for key, measured in tails["by_policy"].items():
        alone = run_at(setup, key, "round-robin", tails["rate"])
        assert measured == {k: alone[k] for k in measured}
    text = format_sweep(result)
    assert f"each policy in full at {tails['rate']:.3g} programs/s" in text
    assert "P95 PROGRAM  P99 PROGRAM  AVG FIRST WAIT  P95 FIRST WAIT" in text
    figure = plot(result, curves, "bfcl", str(tmp_path / "sweep.png"))
    assert len(figure.axes) == 2  # the average against the rate, the latency CDF
    assert figure.axes[1].get_xscale() == "log"
    assert (tmp_path / "sweep.png").stat().st_size > 1000


def test_the_sweep_cli_takes_the_rate_of_the_tails_and_plots_both_panels(tmp_path, capsys):
    png = tmp_path / "sweep.png"
    args = ["simulate", "sweep", "--workload", "bfcl", "--duration", "5", "--max-num-seqs", "8",
            "--workers", "1", "--tail-rate", "1.5"]  # fmt: skip
    assert main([*args, "--json", "--plot", str(png)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tails"]["rate"] == 1.5 and result["plot"] == str(png)
    assert set(result["tails"]["by_policy"]) == {"vllm-opt", "autellix"}
    assert png.stat().st_size > 1000
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "each policy in full at 1.5 programs/s (seconds; AVG/TOKEN: s/token):" in out
    with pytest.raises(SystemExit) as refused:  # a rate of 0: one line, exit code 2
        main([*args[:-1], "0"])
    assert refused.value.code == 2
    assert "--tail-rate: must be positive, got 0" in capsys.readouterr().err


def _point(ours, base, peer):
    """A fixed-rate point's tails: the default's, the baseline's and the best peer's."""
    return {key: {"autellix": ours, "vllm-opt": base, "mori": peer} for key in (
            "p95_program_latency", "p95_first_call_wait")}  # fmt: skip


def test_the_matrix_tails_table_gives_the_defaults_over_the_baselines_and_best_peers():
    cell = {"setting": "a100-llama8bx1", "workload": "bfcl", "best_peer": "mori",
            "latency": {0.5: _point(2.0, 4.0, 2.0), 1.5: _point(8.0, 4.0, 16.0)}}  # fmt: skip
    lines = format_tails([cell]).splitlines()
    assert lines[0].endswith(
        "P95 program latency / P95 first-call wait over vllm-opt's"
        " / P95 program latency over the best peer's"
    )
    assert lines[1].split()[4:] == ["0.5x", "1.5x"]
    assert lines[2].split() == ["a100-llama8bx1", "bfcl", "mori", "0.50/0.50/1.00",
                                "2.00/2.00/0.50"]  # fmt: skip


def test_every_simulator_policy_may_be_a_sweep_or_matrix_column():
    """The columns come from the registry: a policy added there is a column at once."""
    from autellix_vllm.cli import build_parser
    from autellix_vllm.sim import SIM_POLICIES

    names = ",".join(SIM_POLICIES)
    parser = build_parser()
    for command in ("sweep", "matrix"):
        args = parser.parse_args(["simulate", command, "--policies", f"vllm-opt,{names}"])
        assert args.policies == ["vllm-opt", *SIM_POLICIES]
