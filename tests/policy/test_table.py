"""The process table: programs, threads, retries, ending and idle eviction."""

from autellix_vllm.policy import MAIN_THREAD, PLAS, PolicyConfig, ProcessTable, ProgramScheduler
from autellix_vllm.policy.bounded import CHARGED_CALLS_KEPT


def test_threads_fork_from_their_parent():
    table = ProcessTable()
    program = table.open("p", now_s=0.0)
    main = program.thread(None)
    assert main.thread_id == MAIN_THREAD
    main.critical_path = 7.0
    child = program.thread("t1", parent_thread_id=MAIN_THREAD)
    grandchild = program.thread("t2", parent_thread_id="t1")
    assert child.parent is main and grandchild.parent is child
    assert child.critical_path == 7.0  # a fork starts at its parent's critical path
    assert program.multi_threaded


def test_unknown_parent_is_created_on_the_fly():
    program = ProcessTable().open("p", now_s=0.0)
    child = program.thread("c", parent_thread_id="ghost")
    assert child.parent is not None and child.parent.thread_id == "ghost"


def test_retried_call_is_charged_once():
    program = ProcessTable().open("p", now_s=0.0)
    assert program.remember_completion("call-1", 10.0) == 10.0
    assert program.remember_completion("call-1", 10.0) == 0.0  # the retry adds nothing
    assert program.remember_completion("call-1", 14.0) == 4.0  # only what is new


def test_remembered_call_ids_are_bounded():
    program = ProcessTable().open("p", now_s=0.0)
    for i in range(CHARGED_CALLS_KEPT + 1):
        program.remember_completion(f"call-{i}", 1.0)
    assert len(program.completed_call_service) == CHARGED_CALLS_KEPT
    assert program.remember_completion(f"call-{CHARGED_CALLS_KEPT}", 1.0) == 0.0
    assert program.remember_completion("call-0", 1.0) == 1.0  # the oldest was forgotten


def test_end_waits_for_calls_in_flight():
    core = ProgramScheduler(PLAS())
    call = core.add_call("c1", "p", now_s=0.0)
    core.enqueue(call)
    assert core.end_program("p")
    assert "p" in core.table  # still in flight
    core.start(call)
    core.finish(call, now_s=1.0)
    assert "p" not in core.table
    assert not core.end_program("p")


def test_idle_programs_are_evicted_and_active_ones_kept():
    core = ProgramScheduler(PLAS(), PolicyConfig(idle_ttl_s=10.0))
    done = core.add_call("a1", "idle", now_s=0.0)
    core.enqueue(done)
    core.start(done)
    core.finish(done, now_s=1.0)
    busy = core.add_call("b1", "busy", now_s=0.5)
    core.enqueue(busy)
    core.advance(now_s=5.0)
    assert "idle" in core.table
    core.advance(now_s=12.0)
    assert "idle" not in core.table
    assert "busy" in core.table  # a waiting call keeps its program


def test_table_stays_bounded_under_many_programs():
    core = ProgramScheduler(PLAS(), PolicyConfig(idle_ttl_s=1.0))
    for i in range(5000):
        now = i * 0.01
        call = core.add_call(f"c{i}", f"p{i}", now_s=now)
        core.enqueue(call)
        core.start(call)
        core.charge(call, decode_tokens=3)
        core.finish(call, now_s=now)
        core.advance(now_s=now)
    assert len(core.table) <= 200  # ~1 s of programs at 100 programs/s, not 5000
