"""Mooncake and Dynamo traces read into programs, detected per file; bad rows named."""

import json
import subprocess
import sys

import pytest
from autellix_vllm.sim import simulate
from autellix_vllm.workloads import CallSpec, ProgramSpec, write_trace
from autellix_vllm.workloads.trace import TraceError, read_rows
from autellix_vllm.workloads.trace_formats import detect_format, import_trace

# Two conversations interleaved (A: blocks 1, 2, 3, 5; B: 7, then 9, 10) and a
# one-turn request that shares A's first block only. The file is out of time order.
MOONCAKE = [
    {"timestamp": 800, "input_length": 300, "output_length": 3, "hash_ids": [1, 4]},
    {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]},
    # 600 tokens: block 8 is partial, so B's next turn need not repeat its id.
    {"timestamp": 100, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]},
    {"timestamp": 500, "input_length": 1536, "output_length": 20, "hash_ids": [1, 2, 3]},
    {"timestamp": 700, "input_length": 1100, "output_length": 0, "hash_ids": [7, 9, 10]},
    {"timestamp": 1200, "input_length": 2048, "output_length": 4, "hash_ids": [1, 2, 3, 5]},
]

# A root session that spawns a subagent and joins it, a one-request session, and an
# aiperf-style session whose second turn carries only its new tokens.
DYNAMO = [
    {"request_id": "r1", "session_id": "root", "timestamp": 1000, "input_length": 1024,
     "output_length": 10, "hash_ids": [1, 2]},
    {"request_id": "r2", "session_id": "root", "timestamp": 1300, "input_length": 1536,
     "output_length": 10, "hash_ids": [1, 2, 3], "wait_for": ["r1"], "delay": 100,
     "tool_wait_ms": 100},
    {"request_id": "s1", "session_id": "sub", "timestamp": 1500, "input_length": 512,
     "output_length": 5, "hash_ids": [9], "wait_for": ["r2"], "delay": 50},
    {"request_id": "r3", "session_id": "root", "timestamp": 2000, "input_length": 2048,
     "output_length": 7, "hash_ids": [1, 2, 3, 4], "wait_for": ["r2", "s1"], "delay": 20},
    {"request_id": "o1", "session_id": "other", "timestamp": 1200, "input_length": 100,
     "output_length": 2, "hash_ids": [5]},
    {"session_id": "chat", "timestamp": 3000, "input_length": 1000, "output_length": 50,
     "hash_ids": [20, 21]},
    {"session_id": "chat", "delay": 2000, "input_length": 200, "output_length": 30,
     "hash_ids": [22]},
]  # fmt: skip


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_mooncake_conversations_become_chained_programs(tmp_path):
    programs = import_trace(write_rows(tmp_path / "m.jsonl", MOONCAKE))
    assert [(p.program_id, p.arrival) for p in programs] == [("c0", 0.0), ("c1", 0.1), ("c2", 0.8)]
    a, b, single = programs
    assert [c.prompt_tokens for c in a.calls] == [1024, 1536, 2048]
    assert [c.after for c in a.calls] == [(), ("0",), ("1",)]
    # The gap is the whole difference of the arrivals: recorded service included.
    assert [c.tool_gap for c in a.calls] == pytest.approx([0.0, 0.5, 0.7])
    assert [(c.prompt_tokens, c.decode_tokens) for c in b.calls] == [(600, 5), (1100, 1)]
    assert [c.tool_gap for c in b.calls] == pytest.approx([0.0, 0.6])
    assert single.calls == (CallSpec("0", 3, prompt_tokens=300),)
    assert {c.context for p in programs for c in p.calls} == {None}  # one context each


def test_dynamo_rows_become_programs_with_subagents_and_waits(tmp_path):
    programs = import_trace(write_rows(tmp_path / "d.jsonl", DYNAMO))
    assert [(p.program_id, p.arrival) for p in programs] == [
        ("root", 1.0), ("other", 1.2), ("chat", 3.0)
    ]  # fmt: skip
    root, other, chat = programs
    assert root.calls == (
        CallSpec("r1", 10, prompt_tokens=1024),
        CallSpec("r2", 10, prompt_tokens=1536, after=("r1",), tool_gap=0.2),
        CallSpec("s1", 5, prompt_tokens=512, thread="sub", parent_thread="main",
                 after=("r2",), tool_gap=0.05, context="sub"),
        CallSpec("r3", 7, prompt_tokens=2048, after=("r2", "s1"), tool_gap=0.02),
    )  # fmt: skip
    assert other.calls == (CallSpec("o1", 2, prompt_tokens=100),)
    # aiperf's second turn: the first turn's prompt and output, then its 200 new tokens.
    assert chat.calls == (
        CallSpec("line6", 50, prompt_tokens=1000),
        CallSpec("line7", 30, prompt_tokens=1250, after=("line6",), tool_gap=2.0),
    )
    result = simulate(programs, "autellix")
    assert result.metrics["calls_completed"] == 7


def test_a_dynamo_row_without_delay_waits_the_difference_of_timestamps(tmp_path):
    rows = [
        {"session_id": "s", "timestamp": 0, "input_length": 10, "output_length": 1},
        {"session_id": "s", "timestamp": 1500, "input_length": 20, "output_length": 1},
        {"session_id": "s", "input_length": 30, "output_length": 1},
    ]
    (program,) = import_trace(write_rows(tmp_path / "d.jsonl", rows))
    assert [c.tool_gap for c in program.calls] == [0.0, 1.5, 0.0]


def test_the_format_is_detected_per_file(tmp_path):
    own = tmp_path / "own.jsonl"
    write_trace([ProgramSpec("A", 0.0, (CallSpec("a", 2),))], own)
    assert detect_format(read_rows(own)) == "autellix"
    assert import_trace(own)[0].program_id == "A"
    mooncake = write_rows(tmp_path / "m.jsonl", MOONCAKE)
    assert detect_format(read_rows(mooncake)) == "mooncake"
    # A Dynamo key on any row, not only the first, makes the file Dynamo's.
    dynamo = write_rows(tmp_path / "d.jsonl", [MOONCAKE[1], {**MOONCAKE[3], "delay": 5}])
    assert detect_format(read_rows(dynamo)) == "dynamo"
    # A named format wins: these rows read as one Mooncake conversation instead.
    (as_mooncake,) = import_trace(dynamo, "mooncake")
    assert [c.tool_gap for c in as_mooncake.calls] == [0.0, 0.5]
    with pytest.raises(TraceError, match=r"m\.jsonl:1: missing key 'program_id'"):
        import_trace(mooncake, "autellix")


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        (['{"unknown": 1}'], r":1: not a row of a known trace format"),
        ([MOONCAKE[1], "not json"], r":2: not valid JSON"),
        ([MOONCAKE[1], {"input_length": 5, "output_length": 1}], r":2: missing key 'timestamp'"),
        ([MOONCAKE[1], {"timestamp": 5, "input_length": 5}], r":2: missing key 'output_length'"),
        ([MOONCAKE[1], {**MOONCAKE[2], "output_length": "x"}], r":2: 'output_length' has the"),
        ([MOONCAKE[1], {**MOONCAKE[2], "input_length": -1}], r":2: input_length and output_len"),
        ([MOONCAKE[1], {**MOONCAKE[2], "hash_ids": [1, "a"]}], r":2: 'hash_ids' must be a list"),
        ([MOONCAKE[1], {**MOONCAKE[2], "timestamp": -3}], r":2: 'timestamp' must be a number"),
        ([MOONCAKE[1], [1, 2]], r":2: a request must be a JSON object"),
        ([DYNAMO[0], {**DYNAMO[1], "wait_for": ["r9"]}], r":2: 'wait_for' names 'r9', which is"),
        ([DYNAMO[0], {**DYNAMO[1], "wait_for": "r1"}], r":2: 'wait_for' must be a list"),
        ([DYNAMO[0], {**DYNAMO[1], "delay": -5}], r":2: 'delay' must be a number of milli"),
        ([DYNAMO[0], {**DYNAMO[1], "tool_wait_ms": "x"}], r":2: 'tool_wait_ms' must be a"),
        ([DYNAMO[0], {**DYNAMO[4], "request_id": "r1"}], r":2: duplicate request_id 'r1'"),
        ([DYNAMO[0], {**DYNAMO[4], "session_id": True}], r":2: 'session_id' must be a non-empty"),
        ([DYNAMO[0], {**DYNAMO[4], "timestamp": None}], r":2: a request that waits for nothing"),
    ],
)
def test_a_malformed_row_is_named_by_its_line(tmp_path, lines, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    with pytest.raises(TraceError, match=r"bad\.jsonl" + problem):
        import_trace(path)


def simulate_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "autellix_vllm", "simulate", "run", *args],
        capture_output=True, text=True,
    )  # fmt: skip


def test_simulate_run_replays_a_mooncake_file(tmp_path):
    path = write_rows(tmp_path / "m.jsonl", MOONCAKE)
    out = simulate_cli("--trace", str(path), "--policy", "autellix", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["programs"] == 3 and result["calls_completed"] == 6
    assert result["prefix_hit_rate"] > 0  # later turns find their conversation cached


def test_simulate_run_rejects_a_bad_trace_in_one_line(tmp_path):
    path = write_rows(tmp_path / "bad.jsonl", [MOONCAKE[1], {"input_length": 5}])
    out = simulate_cli("--trace", str(path), "--trace-format", "mooncake")
    assert out.returncode == 2
    assert "bad.jsonl:2: missing key 'output_length'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
