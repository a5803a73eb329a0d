"""Programs run by owners in the simulator: greedy hints and the held share."""

from typing import Any

import pytest
from autellix_vllm.sim.run import Simulation, simulate
from autellix_vllm.workloads import generate, load_trace, with_owners, write_trace
from autellix_vllm.workloads.trace import ProgramSpec, TraceError, parse_program


def simulation(programs: list[ProgramSpec], preset: str, **options: Any) -> Simulation:
    """A simulation of ``programs`` on one engine of ``preset`` under the default policy."""
    return Simulation(
        programs, "autellix", engines=1, lb="round-robin", preset=preset, max_num_seqs=None,
        config=None, locality_threshold=2048, stop_above=None, **options,
    )  # fmt: skip


def test_programs_are_run_by_owners_in_turn_and_traces_keep_them(tmp_path):
    programs = with_owners(generate("bfcl", 5, 1.0, seed=0), 2)
    assert [p.owner for p in programs] == ["owner-0", "owner-1"] * 2 + ["owner-0"]
    write_trace(programs, tmp_path / "t.jsonl")
    assert [p.owner for p in load_trace(tmp_path / "t.jsonl")] == [p.owner for p in programs]
    with pytest.raises(TraceError, match="owner"):
        parse_program({"program_id": "a", "arrival": 0, "owner": 3,
                       "calls": [{"id": "c", "decode_tokens": 1}]}, "line 1")  # fmt: skip


def test_a_greedy_owner_claims_the_longest_hold_on_every_call():
    programs = with_owners(generate("bfcl", 4, 1.0, seed=0), 2)
    sim = simulation(programs, "a100-llama8b", retention_hints=True, greedy_owners=("owner-0",))
    for program in programs:
        hints = {sim.hints[(program.program_id, c.id)] for c in program.calls}
        if program.owner == "owner-0":
            assert hints == {60.0}
        else:
            assert 60.0 not in hints


def test_the_held_share_is_reported_per_owner_once_two_run():
    programs = generate("agent", 8, 0.05, seed=0)
    alone = simulate(programs, "autellix", preset="a100-llama8b-kv", end_programs=False)
    assert "held_share_while_others_wait" not in alone.metrics
    shared = simulate(with_owners(programs, 2), "autellix", preset="a100-llama8b-kv",
                      end_programs=False, greedy_owners=("owner-0",))  # fmt: skip
    shares = shared.metrics["held_share_while_others_wait"]
    assert set(shares) == {"owner-0", "owner-1"}
    assert all(0 <= share <= 1 for share in shares.values())


def test_a_split_programs_calls_are_programs_of_their_own_in_their_agents_order():
    programs = with_owners(generate("bfcl", 4, 1.0, seed=0), 2)
    splitting = [p.program_id for p in programs if p.owner == "owner-0"]
    sim = simulation(programs, "a100-llama8b-kv", end_programs=False, splitting_programs=splitting)
    result = sim.run()
    seen = {program.program_id for program in sim.engines[0].core.table}
    for program in programs:
        ids = {f"{program.program_id}/{c.id}" for c in program.calls}
        if program.owner == "owner-0":  # the engine saw every call as a program
            assert ids <= seen and program.program_id not in seen
        else:
            assert program.program_id in seen and not ids & seen
    # Closed loop: a split call still waits for the calls it follows and its tool gap.
    jobs = {(job.program.program_id, job.spec.id): job for job in sim.jobs}
    for program in programs:
        for call in program.calls:
            if call.after:
                ended = max(jobs[(program.program_id, b)].finished_at for b in call.after)
                arrived = jobs[(program.program_id, call.id)].arrived_at
                assert arrived == pytest.approx(ended + call.tool_gap)
    assert set(result.program_latency) == {p.program_id for p in programs}
