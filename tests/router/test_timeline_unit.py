"""A program's timeline from its calls' spans (router.timeline), the engine's report
in an answer (router.usage), and how ``autellix ps PROGRAM`` shows it; no engine."""

from __future__ import annotations

import json
import sys

import pytest
from autellix_vllm.cli import main
from autellix_vllm.cli.ps import format_timeline
from autellix_vllm.policy.config import ServiceMeter, TableBounds
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.router.keys import ANONYMOUS, Client
from autellix_vllm.router.programs import ProgramEnded, ProgramNotFound, ProgramTable
from autellix_vllm.router.timeline import TIMELINE_CALLS_KEPT, CallSpan, chrome_trace, timeline
from autellix_vllm.router.usage import NO_REPORT, CallReport, call_report, read_whole_answer


def span(call_id, arrived, finished, thread="main", report=None):
    report = report or CallReport(10, 4, 2, queue_s=0.1, prefill_s=0.2, decode_s=0.5)
    return CallSpan(call_id, thread, "engine-0", arrived, finished, True, report)


def test_gaps_are_the_programs_own_time_while_none_of_its_calls_is_in_flight():
    spans = [
        span("c1", 100.0, 101.0),
        span("c2", 101.5, 103.0, thread="a"),  # c2 and c3 overlap: one busy stretch
        span("c3", 102.0, 102.5, thread="b"),
        span("c4", 104.0, 105.0),
    ]
    data = timeline(list(reversed(spans)), calls_finished=6)
    assert [row["call_id"] for row in data["calls"]] == ["c1", "c2", "c3", "c4"]
    gaps = [row["gap_after_s"] for row in data["calls"]]
    assert gaps == [0.5, 1.0, None, None]  # after c2 (which ended last), not c3
    assert data["latency_s"] == 5.0 and data["own_time_s"] == 1.5 and data["in_calls_s"] == 3.5
    assert data["calls_dropped"] == 2
    first = data["calls"][0]
    assert first["start_s"] == 0.0 and first["duration_s"] == 1.0
    assert first["other_s"] == pytest.approx(0.2)  # 1.0 - (0.1 + 0.2 + 0.5)
    assert data["decode_s"] == pytest.approx(2.0) and data["cached_tokens"] == 16


def test_a_call_the_engine_gave_no_timings_for_has_no_parts():
    data = timeline([span("c1", 0.0, 2.0, report=NO_REPORT)], calls_finished=1)
    row = data["calls"][0]
    assert row["queue_s"] is None and row["other_s"] is None and row["prompt_tokens"] is None
    assert data["latency_s"] == data["in_calls_s"] == 2.0 and data["queue_s"] == 0.0
    assert "#" * 10 in format_timeline({"program_id": "p", **data})


def test_an_empty_timeline():
    data = timeline([], calls_finished=0)
    assert data["calls"] == [] and data["latency_s"] == 0.0
    assert "0 calls" in format_timeline({"program_id": "p", **data})


def test_the_engines_report_is_read_from_answers_and_response_events():
    answer = {
        "id": "cmpl-1",
        "usage": {"prompt_tokens": 300, "completion_tokens": 8,
                  "prompt_tokens_details": {"cached_tokens": 256}},
        "metrics": {"queue_time_ms": 12.0, "time_to_first_token_ms": 30.0,
                    "generation_time_ms": 70.0, "mean_itl_ms": 10.0},
    }  # fmt: skip
    service, answer_id, report = read_whole_answer(json.dumps(answer).encode(), ServiceMeter())
    assert answer_id == "cmpl-1" and service is not None
    assert report == CallReport(300, 256, 8, queue_s=0.012, prefill_s=0.03, decode_s=0.07)
    response = {"usage": {"input_tokens": 5, "output_tokens": 2}, "metrics": {"queue_time_ms": -1}}
    assert call_report(response) == CallReport(5, None, 2)
    assert read_whole_answer(b"not json", ServiceMeter())[2] is NO_REPORT


def test_the_chrome_trace_has_a_complete_event_per_call_and_part_in_microseconds():
    spans = [span("c1", 100.0, 101.0), span("c2", 101.5, 102.0, thread="side")]
    trace = chrome_trace("prog-1", timeline(spans, calls_finished=2))
    json.dumps(trace)  # what Perfetto reads
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    calls = [e for e in complete if e["cat"] == "call"]
    assert [(e["name"], e["ts"], e["dur"]) for e in calls] == [
        ("c1", 0.0, 1_000_000.0),
        ("c2", 1_500_000.0, 500_000.0),
    ]
    assert calls[0]["tid"] != calls[1]["tid"]  # one track per thread
    parts = [(e["name"], e["ts"], e["dur"]) for e in complete if e["cat"] == "engine"][:3]
    assert parts == [("queue", 0.0, 100_000.0), ("prefill", 100_000.0, 200_000.0),
                     ("decode", 300_000.0, 500_000.0)]  # fmt: skip
    own = [e for e in complete if e["cat"] == "program"]
    assert [(e["ts"], e["dur"]) for e in own] == [(1_000_000.0, 500_000.0)]
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"program prog-1", "thread main", "thread side"} <= names


def test_ps_prints_a_row_and_a_waterfall_line_per_call():
    spans = [span("c1", 100.0, 101.0), span("c2", 101.5, 102.0)]
    text = format_timeline({"program_id": "prog-1", "name": "agent", **timeline(spans, 2)})
    lines = text.splitlines()
    assert lines[0].startswith("prog-1 (agent): 2 calls in 2.000s: in calls 1.500s")
    assert lines[1].split()[:4] == ["START", "THREAD", "CALL", "ENGINE"]
    assert lines[2].split()[:5] == ["0.000s", "main", "c1", "engine-0", "0.100s"]
    waterfall = lines[-2:]
    assert waterfall[0].startswith("qqqppppppddddddddddddddd") and waterfall[0].endswith("c1")
    assert "." * 10 in waterfall[0]  # the gap after c1
    assert waterfall[1].startswith(" " * 40)  # c2 starts three quarters in


def test_the_plot_draws_a_bar_per_part_of_each_call_and_per_gap(tmp_path):
    from autellix_vllm.plots import save_timeline
    from matplotlib.patches import Rectangle

    spans = [
        span("c1", 100.0, 101.0),  # queue, prefill, decode, other; then 0.5 s of own time
        span("c2", 101.5, 102.0, report=NO_REPORT),  # one bar; then 1.0 s of own time
        span("c3", 103.0, 104.0),
    ]
    path = tmp_path / "timeline.png"
    figure = save_timeline(str(path), "program p", timeline(spans, calls_finished=3))
    assert path.read_bytes().startswith(b"\x89PNG")
    bars = [patch for patch in figure.axes[0].patches if isinstance(patch, Rectangle)]
    assert len(bars) == 4 + 1 + 1 + 1 + 4
    gaps = [bar for bar in bars if bar.get_hatch()]
    assert [(bar.get_x(), bar.get_width()) for bar in gaps] == [(1.0, 0.5), (2.0, 1.0)]
    labels = [text.get_text() for text in figure.axes[0].get_yticklabels()]
    assert labels == ["c1", "c2", "c3"]


def test_a_programs_calls_are_kept_up_to_the_bound():
    table = ProgramTable(TableBounds())
    for number in range(TIMELINE_CALLS_KEPT + 3):
        record = table.call_arrived(CallIdentity(program_id="p"), ANONYMOUS)
        table.call_finished(record, None, engine="e", service=1.0, completed=True,
                            span=span(f"c{number}", number, number + 0.5))  # fmt: skip
    data = table.timeline("p", ANONYMOUS)
    assert len(data["calls"]) == TIMELINE_CALLS_KEPT and data["calls_dropped"] == 3
    assert data["calls"][0]["call_id"] == "c3"


def test_the_timelines_of_the_programs_an_owner_ended_last_are_kept_for_it_only():
    table = ProgramTable(TableBounds(), ended_rows_kept=2)
    alice, bob = Client("alice", "alice"), Client("bob", "bob")
    for program_id in ("p1", "p2", "p3"):
        record = table.call_arrived(CallIdentity(program_id=program_id), alice)
        table.call_finished(record, None, engine="e", service=1.0, completed=True,
                            span=span(f"{program_id}-c", 0.0, 1.0))  # fmt: skip
        table.end(program_id, alice)
    ended = table.timeline("p3", alice)
    assert ended["ended"] is True and [c["call_id"] for c in ended["calls"]] == ["p3-c"]
    with pytest.raises(ProgramNotFound):
        table.timeline("p3", bob)
    with pytest.raises(ProgramEnded):  # past the two kept: its id is still refused
        table.timeline("p1", alice)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ps", "--chrome-trace", "t.json"], "--chrome-trace needs a PROGRAM"),
        (["ps", "--plot", "t.png"], "--plot needs a PROGRAM"),
        (["ps", "prog-1", "--all"], "--all lists programs; it does not go with a PROGRAM"),
    ],
)
def test_ps_names_a_timeline_option_that_does_not_fit_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error


def test_ps_plot_without_matplotlib_names_the_extra_in_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the sim extra were missing
    assert main(["ps", "prog-1", "--plot", "t.png", "--url", "http://127.0.0.1:9"]) != 0
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "pip install 'autellix[sim]'" in error
