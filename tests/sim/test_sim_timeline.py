"""The simulator's timeline of a program: its calls in the router's timeline type,
so that ``autellix ps``'s waterfall, Perfetto trace and plot draw them."""

import json

import pytest
from autellix_vllm.cli import main
from autellix_vllm.router.timeline import timeline
from autellix_vllm.sim import CallSpec, ProgramSpec, simulate


def agent(pid: str, arrival: float) -> ProgramSpec:
    """Three calls in a row, with tool time before the second and third."""
    calls = (
        CallSpec(f"{pid}.c0", 40, prompt_tokens=900),
        CallSpec(f"{pid}.c1", 60, prompt_tokens=1200, after=(f"{pid}.c0",), tool_gap=0.7),
        CallSpec(f"{pid}.c2", 30, prompt_tokens=1500, after=(f"{pid}.c1",), tool_gap=1.3),
    )
    return ProgramSpec(pid, arrival, calls)


def test_a_simulated_programs_parts_add_up_to_its_latency():
    # Others arrive alongside, so its calls queue and share steps.
    programs = [agent(f"p{i}", 0.05 * i) for i in range(12)]
    result = simulate(programs, "autellix", preset="a100-llama8b", max_num_seqs=4,
                      timeline_of="p3")  # fmt: skip
    data = timeline(result.call_spans, calls_finished=len(result.call_spans))
    assert [call["call_id"] for call in data["calls"]] == ["p3.c0", "p3.c1", "p3.c2"]
    latency = result.program_latency["p3"]
    parts = sum(data[part] for part in ("queue_s", "prefill_s", "decode_s", "other_s"))
    assert parts + data["own_time_s"] == pytest.approx(latency, rel=0.01)
    assert data["latency_s"] == pytest.approx(latency, rel=0.01)
    assert data["own_time_s"] == pytest.approx(0.7 + 1.3)
    assert data["queue_s"] > 0 and data["prefill_s"] > 0 and data["decode_s"] > 0
    assert data["prompt_tokens"] == 3600 and data["completion_tokens"] == 130
    assert data["cached_tokens"] > 0  # each call extends the one before it


def test_simulate_run_writes_a_programs_timeline_as_a_trace_and_a_plot(tmp_path, capsys):
    trace, png = tmp_path / "lats-0.json", tmp_path / "lats-0.png"
    argv = ["simulate", "run", "--workload", "lats", "--programs", "2", "--timeline", "lats-0",
            "--chrome-trace", str(trace), "--plot", str(png), "--json"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    calls = result["timeline"]["calls"]
    assert calls and all(call["call_id"].startswith("lats-0.") for call in calls)
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(event.get("cat") == "call" for event in events) == len(calls)
    assert png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--plot", "t.png"], "--chrome-trace and --plot draw a program's timeline"),
        (["--timeline", "nobody"], "no program 'nobody' in this run"),
    ],
)
def test_simulate_run_names_a_timeline_option_that_does_not_fit(argv, message, capsys):
    assert main(["simulate", "run", "--programs", "2", *argv]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error
