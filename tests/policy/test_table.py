"""The process table: programs, threads, retries, ending and idle eviction."""

from autellix_vllm.policy import PLAS, PolicyConfig, ProcessTable, ProgramScheduler, TableBounds
from autellix_vllm.policy.bounded import CHARGED_CALLS_KEPT
from autellix_vllm.protocol.identity import MAIN_THREAD_ID, CallIdentity


def test_threads_fork_from_their_parent():
    table = ProcessTable()
    program = table.open("p", now_s=0.0)
    main = program.thread(None)
    assert main.thread_id == MAIN_THREAD_ID
    main.critical_path = 7.0
    child = program.thread("t1", parent_thread_id=MAIN_THREAD_ID)
    grandchild = program.thread("t2", parent_thread_id="t1")
    assert child.parent is main and grandchild.parent is child
    assert child.critical_path == 7.0  # a fork starts at its parent's critical path
    assert program.multi_threaded


def test_unknown_parent_is_created_on_the_fly():
    program = ProcessTable().open("p", now_s=0.0)
    child = program.thread("c", parent_thread_id="ghost")
    assert child.parent is not None and child.parent.thread_id == "ghost"


def run_call(core, call_id, program_id, service, aborted=False, **identity):
    """A call that arrives, runs, attains ``service`` and finishes; returns the charge."""
    call = core.add_call(CallIdentity(program_id, **identity, call_id=call_id), now_s=0.0)
    core.enqueue(call)
    core.start(call)
    core.charge(call, decode_tokens=service)
    before = call.program.attained_service
    core.finish(call, now_s=1.0, aborted=aborted)
    return call.program.attained_service - before


def test_a_retry_of_an_attempt_that_did_not_complete_is_charged_once():
    core = ProgramScheduler(PLAS())
    assert run_call(core, "c1", "p", 10, aborted=True) == 10  # computed work is charged
    assert run_call(core, "c1", "p", 10, aborted=True) == 0  # the retry recomputed it
    assert run_call(core, "c1", "p", 14) == 4  # only what is new
    program = core.table.get("p")
    assert (program.calls_aborted, program.calls_completed) == (2, 1)
    assert core.counters.calls_aborted == 2 and core.counters.calls_finished == 3


def test_a_call_id_reused_after_it_completed_is_charged_in_full():
    core = ProgramScheduler(PLAS())
    charges = [run_call(core, "same", "p", 32) for _ in range(10)]
    assert charges == [32] * 10
    assert core.table.get("p").attained_service == 320


def test_concurrent_calls_with_one_call_id_are_each_charged_in_full():
    core = ProgramScheduler(PLAS())
    calls = [core.add_call(CallIdentity("p", call_id="same"), now_s=0.0) for _ in range(3)]
    assert [call.reuse for call in calls] == [False, True, True]
    assert len(core.table.get("p").active_calls) == 3  # none hides another
    for call in calls:
        core.enqueue(call)
        core.start(call)
        core.charge(call, decode_tokens=32)
    for call in calls:
        core.finish(call, now_s=1.0)
    assert core.table.get("p").attained_service == 96


def test_remembered_call_ids_are_bounded():
    program = ProcessTable().open("p", now_s=0.0)
    for i in range(CHARGED_CALLS_KEPT + 1):
        program.settle(f"call-{i}", 1.0, completed=False, reuse=False)
    assert len(program.call_records) == CHARGED_CALLS_KEPT
    assert program.settle(f"call-{CHARGED_CALLS_KEPT}", 1.0, completed=True, reuse=False) == 0.0
    # The oldest was forgotten: its retry is charged as a first attempt.
    assert program.settle("call-0", 1.0, completed=True, reuse=False) == 1.0


def test_end_waits_for_calls_in_flight():
    core = ProgramScheduler(PLAS())
    call = core.add_call(CallIdentity("p", call_id="c1"), now_s=0.0)
    core.enqueue(call)
    assert core.end_program("p")
    assert "p" in core.table  # still in flight
    core.start(call)
    core.finish(call, now_s=1.0)
    assert "p" not in core.table
    assert not core.end_program("p")


def test_idle_programs_are_evicted_and_active_ones_kept():
    core = ProgramScheduler(PLAS(), PolicyConfig(table=TableBounds(idle_ttl_s=10.0)))
    done = core.add_call(CallIdentity("idle", call_id="a1"), now_s=0.0)
    core.enqueue(done)
    core.start(done)
    core.finish(done, now_s=1.0)
    busy = core.add_call(CallIdentity("busy", call_id="b1"), now_s=0.5)
    core.enqueue(busy)
    core.advance(now_s=5.0)
    assert "idle" in core.table
    core.advance(now_s=12.0)
    assert "idle" not in core.table
    assert "busy" in core.table  # a waiting call keeps its program


def test_table_stays_bounded_under_many_programs():
    core = ProgramScheduler(PLAS(), PolicyConfig(table=TableBounds(idle_ttl_s=1.0)))
    for i in range(5000):
        now = i * 0.01
        call = core.add_call(CallIdentity(f"p{i}", call_id=f"c{i}"), now_s=now)
        core.enqueue(call)
        core.start(call)
        core.charge(call, decode_tokens=3)
        core.finish(call, now_s=now)
        core.advance(now_s=now)
    assert len(core.table) <= 200  # ~1 s of programs at 100 programs/s, not 5000
