"""Priority classes in the simulator: a trace's ``priority``, and bands on one engine."""

from dataclasses import replace

import pytest
from autellix_vllm.policy import PolicyConfig, TenantConfig
from autellix_vllm.sim.run import simulate
from autellix_vllm.workloads import load_trace, write_trace
from autellix_vllm.workloads.trace import CallSpec, ProgramSpec, TraceError, parse_program


def one_call(program_id: str, arrival: float, tokens: int = 200) -> ProgramSpec:
    return ProgramSpec(program_id, arrival, (CallSpec("c", decode_tokens=tokens),))


def test_traces_keep_a_programs_class():
    program = parse_program(
        {
            "program_id": "a",
            "arrival": 0,
            "priority": "batch",
            "calls": [{"id": "c", "decode_tokens": 1}],
        },
        "line 1",
    )
    assert program.priority == 1
    with pytest.raises(TraceError, match="line 1: priority must be"):
        parse_program(
            {
                "program_id": "a",
                "arrival": 0,
                "priority": "urgent",
                "calls": [{"id": "c", "decode_tokens": 1}],
            },
            "line 1",
        )


def test_a_trace_round_trips_the_class(tmp_path):
    programs = [replace(one_call("a", 0.0), priority=2), one_call("b", 0.0)]
    write_trace(programs, tmp_path / "t.jsonl")
    assert [p.priority for p in load_trace(tmp_path / "t.jsonl")] == [2, None]


def test_on_one_seat_an_interactive_program_overtakes_a_queue_of_batch_ones():
    """Six batch programs arrive first and queue on a one-seat engine; an
    interactive one arriving after them runs next, not last."""
    batch = [replace(one_call(f"b{i}", 0.0), priority=1) for i in range(6)]
    interactive = one_call("i", 0.1)
    programs = [*batch, interactive]
    classes = simulate(programs, "autellix", preset="a100-llama8b", max_num_seqs=1)
    today = simulate(
        [replace(p, priority=None) for p in programs],
        "autellix",
        preset="a100-llama8b",
        max_num_seqs=1,
    )
    assert classes.program_latency["i"] < 2.5 * classes.program_latency["b0"]
    assert today.program_latency["i"] > 4 * classes.program_latency["i"]


def test_an_owners_band_comes_from_the_config_and_ages_to_band_zero():
    batch = [replace(one_call(f"b{i}", 0.0), owner="nightly") for i in range(6)]
    programs = [*batch, one_call("i", 0.1)]
    banded = PolicyConfig(tenants=TenantConfig(bands={"nightly": 1}))
    classes = simulate(programs, "autellix", preset="a100-llama8b", max_num_seqs=1, config=banded)
    assert max(classes.program_latency[p.program_id] for p in batch) > classes.program_latency["i"]
    # An aging bound shorter than any wait: the batch programs rank as band 0 at once.
    aged = PolicyConfig(tenants=TenantConfig(bands={"nightly": 1}, band_aging_s=1e-9))
    at_once = simulate(programs, "autellix", preset="a100-llama8b", max_num_seqs=1, config=aged)
    assert at_once.program_latency["i"] > classes.program_latency["i"]
