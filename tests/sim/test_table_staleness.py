"""The simulator's service table: always fresh, or report batches apart as the Ray
Serve directory's (``sim/directory.py``, ``simulate(table_sync_s=...)``)."""

import pytest
from autellix_vllm.policy import PolicyConfig, ProgramScheduler, make_policy
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.sim import generate, simulate
from autellix_vllm.sim.directory import ServiceTable


def test_a_fresh_table_counts_an_ended_call_at_once():
    table = ServiceTable()
    table.call_ended("A", 300.0, ingress=0, now=0.5)
    assert table.service("A", 0.5) == 300.0


def test_a_synced_table_counts_an_ended_call_from_its_ingress_next_batch():
    table = ServiceTable(sync_s=1.0)
    table.call_ended("A", 300.0, ingress=0, now=0.5)
    table.call_ended("A", 50.0, ingress=1, now=1.2)
    assert table.service("A", 0.5) == 0.0
    assert table.service("A", 0.99) == 0.0
    assert table.service("A", 1.0) == 300.0  # the batch of tick 1 landed
    assert table.service("A", 1.5) == 300.0
    assert table.service("A", 2.0) == 350.0
    assert table.service("B", 2.0) == 0.0


def test_the_traffic_is_one_admission_a_call_and_one_batch_per_ingress_and_tick():
    table = ServiceTable(sync_s=0.1)
    for now, ingress in [(0.01, 0), (0.02, 0), (0.03, 1), (0.15, 0)]:
        table.service("A", now)
        table.call_ended("A", 1.0, ingress, now)
    # ingress 0: ticks 1 and 2; ingress 1: tick 1.
    assert table.traffic(2.0) == {
        "directory_admissions_per_s": 2.0,
        "directory_reports_per_s": 1.5,
    }
    fresh = ServiceTable()
    for now in (0.01, 0.02):
        fresh.service("A", now)
        fresh.call_ended("A", 1.0, 0, now)
    assert fresh.traffic(1.0)["directory_reports_per_s"] == 2.0  # each report alone


@pytest.mark.parametrize("sync_s", [0.0, -1.0, float("inf"), float("nan")])
def test_a_sync_interval_must_be_positive_and_finite(sync_s):
    with pytest.raises(ValueError, match="sync interval"):
        ServiceTable(sync_s)


def _first_served(prior_of_a: float) -> str:
    """Which of two waiting calls PLAS serves first: program A's, arriving with
    ``prior_of_a`` as prior service, or program C's, with 200."""
    core = ProgramScheduler(make_policy("plas"), PolicyConfig())
    for program, prior in (("A", prior_of_a), ("C", 200.0)):
        identity = CallIdentity(program, call_id=f"{program}1", prior_service=prior)
        core.enqueue(core.add_call(identity, 0.6, prompt_tokens=10))
    first = core.peek()
    assert first is not None
    return first.program.program_id


def test_a_stale_table_ranks_a_program_ahead_of_one_a_fresh_table_puts_first():
    # Program A's call of 1000 service units ended at 0.5 s on another engine; its
    # next call arrives at 0.6 s, before the batch of tick 1 s lands.
    fresh, stale = ServiceTable(), ServiceTable(sync_s=1.0)
    for table in (fresh, stale):
        table.call_ended("A", 1000.0, ingress=0, now=0.5)
    assert _first_served(fresh.service("A", 0.6)) == "C"
    assert _first_served(stale.service("A", 0.6)) == "A"


def test_one_engine_never_sees_a_stale_table():
    # The engine's own count of a program's service is never behind the table.
    programs = generate("mixed", 20, rate=20.0, seed=1)
    fresh = simulate(programs, "autellix", max_num_seqs=8)
    synced = simulate(programs, "autellix", max_num_seqs=8, table_sync_s=1.0)
    assert synced.latency_per_token == fresh.latency_per_token
    assert "directory_reports_per_s" not in fresh.metrics
    assert synced.metrics["table_sync_s"] == 1.0


def test_across_engines_a_stale_table_changes_the_order():
    programs = generate("lats", 20, rate=20.0, seed=1)
    fresh = simulate(programs, "autellix", engines=2, max_num_seqs=8)
    synced = simulate(programs, "autellix", engines=2, max_num_seqs=8, table_sync_s=1.0)
    assert synced.latency_per_token != fresh.latency_per_token
    calls = synced.metrics["calls"]
    admissions = synced.metrics["directory_admissions_per_s"] * synced.metrics["makespan"]
    assert admissions == pytest.approx(calls)
    assert (
        0 < synced.metrics["directory_reports_per_s"] < synced.metrics["directory_admissions_per_s"]
    )
