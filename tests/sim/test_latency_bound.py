"""Stopping a run early: only when its average latency per token must exceed the line."""

import pytest
from autellix_vllm.sim import generate, simulate
from autellix_vllm.sim.jobs import ProgramRun
from autellix_vllm.sim.run import LatencyBound


def overloaded(workload: str) -> list:
    # 8 seats and far more programs per second than they serve: queues grow.
    return generate(workload, 300, rate=40.0, seed=3)


@pytest.mark.parametrize("workload", ["sharegpt", "lats"])
def test_a_run_within_the_line_is_never_stopped(workload):
    programs = overloaded(workload)
    full = simulate(programs, "autellix", max_num_seqs=8).metrics
    final = full["avg_latency_per_token"]

    # The line exactly at the final average: the bound may approach it, never cross it.
    same = simulate(programs, "autellix", max_num_seqs=8, stop_above=final).metrics
    assert same["stopped_early"] is False
    for metrics in (full, same):
        metrics.pop("sim_seconds")
    assert same == full


@pytest.mark.parametrize("workload", ["sharegpt", "lats"])
def test_an_overloaded_run_stops_early_with_a_true_lower_bound(workload):
    programs = overloaded(workload)
    full = simulate(programs, "vllm-opt", max_num_seqs=8).metrics
    line = full["avg_latency_per_token"] / 3

    stopped = simulate(programs, "vllm-opt", max_num_seqs=8, stop_above=line).metrics

    assert stopped["stopped_early"] is True
    assert line < stopped["avg_latency_per_token"] <= full["avg_latency_per_token"]
    assert stopped["stopped_at"] < full["makespan"]
    assert stopped["programs_finished"] < full["programs"]


def test_the_bound_counts_finished_waiting_and_future_programs():
    a = ProgramRun("a", arrival=0.0, calls_left=1, decode_total=10, remaining_work=10)
    b = ProgramRun("b", arrival=4.0, calls_left=1, decode_total=2, remaining_work=2)
    c = ProgramRun("c", arrival=50.0, calls_left=1, decode_total=1, remaining_work=1)
    bound = LatencyBound([c, a, b])

    assert bound.at(2.0) == pytest.approx((2.0 / 10) / 3)  # only a has arrived
    assert bound.at(6.0) == pytest.approx((6.0 / 10 + 2.0 / 2) / 3)
    a.calls_left, a.end = 0, 5.0
    bound.finished(a)  # a's latency is now exact: 5 s over 10 tokens
    assert bound.at(8.0) == pytest.approx((5.0 / 10 + 4.0 / 2) / 3)
    b.calls_left, b.end = 0, 9.0
    bound.finished(b)
    assert bound.at(60.0) == pytest.approx((0.5 + 2.5 + 10.0 / 1) / 3)  # c waits since 50


def test_a_program_that_finishes_between_two_looks_counts_once():
    a = ProgramRun("a", arrival=1.0, calls_left=1, decode_total=4, remaining_work=4)
    bound = LatencyBound([a])
    assert bound.at(0.5) == 0.0
    a.calls_left, a.end = 0, 3.0  # arrives and finishes before the bound looks again
    bound.finished(a)
    assert bound.at(10.0) == pytest.approx(2.0 / 4)
