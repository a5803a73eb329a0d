"""The router's gate in the simulator (``simulate(flow_control=...)``)."""

from dataclasses import replace

import pytest
from autellix_vllm.policy import PolicyConfig, TenantConfig
from autellix_vllm.policy.flow_control import FlowControlConfig
from autellix_vllm.sim.run import Simulation, simulate
from autellix_vllm.workloads import generate

GATE = FlowControlConfig(seat_share=1.0, reserve_share=0.5, linger_s=2.0)


def test_one_band_runs_as_without_the_gate():
    programs = generate("bfcl", 40, 2.0, 0)
    without = simulate(programs, preset="a100-llama8b-kv", max_num_seqs=8)
    gated = simulate(programs, preset="a100-llama8b-kv", max_num_seqs=8, flow_control=GATE)
    assert gated.program_latency == without.program_latency
    assert gated.metrics["calls_held"] == 0


def test_held_batch_calls_leave_the_seats_to_the_interactive_key():
    """A batch flood fills 8 seats: the interactive key's slowest program takes
    more than 1.1x what it takes alone when the flood's calls queue in the
    engine, and what it takes alone when the gate keeps them at the router
    (every batch program still finishes)."""
    flood = [replace(p, program_id=f"b{p.program_id}", owner="batch", priority=1)
             for p in generate("bfcl", 60, 20.0, 1)]  # fmt: skip
    interactive = [replace(p, program_id=f"i{p.program_id}", owner="chat")
                   for p in generate("bfcl", 6, 1.0, 2)]  # fmt: skip
    programs = sorted(flood + interactive, key=lambda p: p.arrival)
    config = PolicyConfig(tenants=TenantConfig(bands={"batch": 1}))
    gate = FlowControlConfig(seat_share=1.0, reserve_share=1.0, linger_s=2.0)

    def slowest_interactive(programs, flow_control):
        result = simulate(programs, preset="a100-llama8b-kv", max_num_seqs=8, config=config,
                          flow_control=flow_control)  # fmt: skip
        if flow_control is not None and len(programs) > len(interactive):
            assert result.metrics["calls_held"] > 0
            assert set(result.program_latency) == {p.program_id for p in programs}
        return max(result.program_latency[p.program_id] for p in interactive)

    alone = slowest_interactive(interactive, None)
    assert slowest_interactive(programs, None) > 1.1 * alone
    assert slowest_interactive(programs, gate) < 1.02 * alone


def test_a_held_call_goes_at_the_starvation_bound():
    """With a bound shorter than the flood, batch calls go as band 0 before the
    interactive load ends: the batch key's last program ends sooner than with
    the engines' 120 s bound."""
    flood = [replace(p, program_id=f"b{p.program_id}", owner="batch", priority=1)
             for p in generate("bfcl", 30, 30.0, 3)]  # fmt: skip
    interactive = [replace(p, program_id=f"i{p.program_id}", owner="chat")
                   for p in generate("bfcl", 60, 2.0, 4)]  # fmt: skip
    programs = sorted(flood + interactive, key=lambda p: p.arrival)
    gate = FlowControlConfig(seat_share=1.0, reserve_share=8.0, linger_s=5.0)

    def batch_makespan(aging_s: float) -> float:
        config = PolicyConfig(tenants=TenantConfig(bands={"batch": 1}, band_aging_s=aging_s))
        result = simulate(programs, preset="a100-llama8b-kv", max_num_seqs=8, config=config,
                          flow_control=gate)  # fmt: skip
        return max(p.arrival + result.program_latency[p.program_id] for p in flood)

    assert batch_makespan(1.0) < batch_makespan(TenantConfig.band_aging_s)


def test_a_held_calls_engine_side_aging_counts_its_hold():
    """One starvation bound from the router: a batch call the gate held for less
    than the bound goes with its wait stated, and the engine ages it at its
    arrival at the router plus the bound, not at its arrival at the engine plus
    the bound; one held to the bound goes as band 0."""
    flood = [replace(p, program_id=f"b{p.program_id}", owner="batch", priority=1)
             for p in generate("bfcl", 30, 30.0, 3)]  # fmt: skip
    interactive = [replace(p, program_id=f"i{p.program_id}", owner="chat")
                   for p in generate("bfcl", 60, 2.0, 4)]  # fmt: skip
    programs = sorted(flood + interactive, key=lambda p: p.arrival)
    bound = 10.0
    config = PolicyConfig(tenants=TenantConfig(bands={"batch": 1}, band_aging_s=bound))
    sim = Simulation(
        programs, "autellix", engines=1, lb="round-robin", preset="a100-llama8b-kv",
        max_num_seqs=8, config=config, locality_threshold=2048, stop_above=None,
        flow_control=FlowControlConfig(seat_share=1.0, reserve_share=0.25, linger_s=1.0),
    )  # fmt: skip
    sim.run()
    batch = [job for job in sim.jobs if job.program.owner == "batch"]
    held = [job for job in batch if job.router_wait_s]
    aged = [job for job in batch if job.band == 0]
    assert held and aged  # both kinds happen here
    for job in held:
        assert job.call is not None
        assert job.router_wait_s == pytest.approx(job.call.arrival_s - job.arrived_at)
        assert job.call.ages_at == pytest.approx(job.arrived_at + bound)
        assert job.call.ages_at < job.call.arrival_s + bound
    for job in batch:
        assert job.call is not None
        if job in aged:
            assert job.call.ages_at is None  # band 0 on arrival: nothing to age
        else:
            assert job.call.ages_at == pytest.approx(job.arrived_at + bound)
