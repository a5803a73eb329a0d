"""What a client shapes cannot break the core: walks are iterative, programs are
bounded by ProgramLimits, and a policy that fails for one call is confined to it."""

import logging
import sys

import pytest
from autellix_vllm.policy import (
    ALONE_PREFIX,
    ATLAS,
    PLAS,
    PlasAtlas,
    PolicyConfig,
    ProgramLimits,
    ProgramScheduler,
    TableBounds,
)
from autellix_vllm.protocol.identity import CallIdentity


def arrive(core, call_id, program_id, **identity):
    call = core.add_call(CallIdentity(program_id, **identity, call_id=call_id), now_s=0.0)
    core.enqueue(call)
    return call


def serve(core, call, tokens=1):
    core.start(call)
    core.charge(call, decode_tokens=tokens)
    core.finish(call, now_s=1.0)


def test_a_thread_chain_deeper_than_the_stack_is_walked_without_recursion():
    depth = sys.getrecursionlimit() + 100
    limits = ProgramLimits(max_threads=depth + 2, max_fork_depth=depth + 1)
    core = ProgramScheduler(PlasAtlas(), PolicyConfig(table=TableBounds(limits=limits)))
    serve(core, arrive(core, "root", "chain", thread_id="t0"))
    for k in range(1, depth + 1):
        serve(core, arrive(core, f"c{k}", "chain", thread_id=f"t{k}", parent_thread_id=f"t{k - 1}"))
    join = arrive(core, "join", "chain", thread_id="t0")  # walks every descendant
    assert join.program.program_id == "chain"
    assert join.base == pytest.approx(depth + 1)  # the chain's whole critical path
    assert core.table.get("chain").threads["t42"].depth == 42


def test_the_issue_chain_of_1101_threads_is_cut_at_the_fork_depth():
    core = ProgramScheduler(ATLAS())
    serve(core, arrive(core, "c0", "chain", thread_id="t0"))
    for k in range(1, 1101):
        call = arrive(core, f"c{k}", "chain", thread_id=f"t{k}", parent_thread_id=f"t{k - 1}")
        serve(core, call)
    join = arrive(core, "join", "chain", thread_id="t0")
    max_depth = core.config.table.limits.max_fork_depth
    threads = core.table.get("chain").threads
    # Every 65th call would have forked one level too deep: it ran alone. The
    # next call names that thread as its parent, which is then created as a new
    # root (as any unknown parent is), so no thread is deeper than the limit.
    assert core.table.calls_over_limit == {"max_fork_depth": 1100 // (max_depth + 1)}
    assert max(thread.depth for thread in threads.values()) == max_depth
    assert join.program.program_id == "chain"
    assert join.base == pytest.approx(max_depth + 1)  # t0's subtree: t0 .. t64


@pytest.mark.parametrize(
    ("limits", "calls", "crossed"),
    [
        # main plus two threads fit in 3; the third forked thread does not.
        (ProgramLimits(max_threads=3), [("main", None), ("a", None), ("b", None), ("c", None)],
         "max_threads"),
        # An unknown parent is created too: two new threads at once.
        (ProgramLimits(max_threads=2), [("main", None), ("x", "ghost")], "max_threads"),
        (ProgramLimits(max_fork_depth=2), [("main", None), ("a", "main"), ("b", "a"), ("c", "b")],
         "max_fork_depth"),
        # The unknown parent forks from main (depth 1), so the call's thread is at 2.
        (ProgramLimits(max_fork_depth=1), [("main", None), ("x", "ghost")], "max_fork_depth"),
    ],
)  # fmt: skip
def test_a_call_that_would_grow_its_program_past_a_limit_runs_alone(limits, calls, crossed):
    core = ProgramScheduler(PLAS(), PolicyConfig(table=TableBounds(limits=limits)))
    placed = [
        arrive(core, f"c{i}", "P", thread_id=thread, parent_thread_id=parent)
        for i, (thread, parent) in enumerate(calls)
    ]
    last = placed[-1]
    assert all(call.program.program_id == "P" for call in placed[:-1])
    assert last.program.program_id == ALONE_PREFIX + last.call_id
    assert last.program.ended  # it leaves the table with its call
    assert core.table.calls_over_limit == {crossed: 1}
    assert core.snapshot(0.0)["calls_over_limit"] == {crossed: 1}
    serve(core, last)
    assert last.program.program_id not in core.table


def test_live_calls_beyond_the_limit_run_alone_until_one_finishes():
    core = ProgramScheduler(
        PLAS(), PolicyConfig(table=TableBounds(limits=ProgramLimits(max_live_calls=2)))
    )
    first, second = arrive(core, "a", "P"), arrive(core, "b", "P")
    extra = core.add_call(CallIdentity("P", call_id="c"), now_s=0.0, alone_id="alone:request-c")
    assert extra.program.program_id == "alone:request-c"
    serve(core, first)
    assert arrive(core, "d", "P").program is second.program


def test_prior_service_is_clamped_to_the_limit():
    core = ProgramScheduler(PLAS())
    call = arrive(core, "a", "P", prior_service=1e308)
    assert call.program.attained_service == core.config.table.limits.max_prior_service


class FailsFor(PLAS):
    """PLAS, except that the chosen hook raises for one program."""

    def __init__(self, hook, program_id="doomed"):
        self.hook = hook
        self.program_id = program_id

    def _check(self, hook, call):
        if hook == self.hook and call.program.program_id == self.program_id:
            raise RuntimeError(f"{hook} broke for {call.program.program_id}")

    def base(self, call):
        self._check("base", call)
        return super().base(call)

    def rank(self, call):
        self._check("rank", call)
        return super().rank(call)

    def outranks(self, waiter, victim):
        self._check("outranks", waiter)
        return super().outranks(waiter, victim)

    def complete(self, call, charged):
        self._check("complete", call)


def test_a_call_the_policy_cannot_place_runs_alone_and_is_counted(caplog):
    core = ProgramScheduler(FailsFor("base"))
    with caplog.at_level(logging.ERROR, logger="autellix_vllm.policy.faults"):
        calls = [arrive(core, f"c{i}", "doomed") for i in range(3)]
    assert all(c.program.program_id == ALONE_PREFIX + c.call_id for c in calls)
    assert core.faults.counts == {"base": 3}
    assert core.snapshot(0.0)["hook_failures"] == {"base": 3}
    assert len(caplog.records) == 1  # once per kind, not per call
    assert "base broke for doomed" in caplog.text
    assert arrive(core, "ok", "healthy").program.program_id == "healthy"
    for call in calls:
        serve(core, call)
    # The alone programs left with their calls.
    assert {program.program_id for program in core.table} == {"doomed", "healthy"}


def test_a_call_the_policy_cannot_rank_waits_by_its_level():
    core = ProgramScheduler(FailsFor("rank"))
    healthy = arrive(core, "h", "healthy")
    doomed = arrive(core, "d", "doomed")
    assert [call.call_id for call in core.waiting] == ["h", "d"]
    assert core.pop() is healthy and core.pop() is doomed
    assert core.faults.counts["rank"] >= 1


def test_a_failing_outranks_preempts_nothing():
    core = ProgramScheduler(FailsFor("outranks"))
    runner = arrive(core, "r", "runner", prior_service=1000)
    core.start(runner)
    arrive(core, "d", "doomed")
    assert core.victims([runner], free_seats=0) == []
    assert core.faults.counts["outranks"] == 1


def test_a_failing_completion_still_closes_the_books():
    core = ProgramScheduler(FailsFor("complete"), PolicyConfig())
    call = arrive(core, "d", "doomed")
    core.end_program("doomed")
    serve(core, call, tokens=5)
    assert core.faults.counts == {"complete": 1}
    assert "doomed" not in core.table  # not left busy forever
    assert core.counters.calls_finished == 1
