"""The Autellix scheduler inside vLLM's real Scheduler, without a model.

Each test drives real vLLM ``Request``s through ``schedule()`` /
``update_from_output()`` (see conftest.SchedulerHarness): what vLLM admits,
preempts and frees is vLLM's own code, ordered by the policy core.

Small level boundaries (``AUTELLIX_LEVELS``) keep the tests short: with
"0,4,8", a program is in level 0 below 4 tokens of service, level 1 below 8,
level 2 above.
"""

import time

import pytest

pytest.importorskip("vllm")

from autellix_vllm.engine.scheduler import ALONE_PREFIX  # noqa: E402
from autellix_vllm.protocol.identity import CallIdentity
from vllm.v1.request import RequestStatus  # noqa: E402

SMALL_LEVELS = {"AUTELLIX_LEVELS": "0,4,8"}
# The paper's KV-blind order, for what only it does: the level as vLLM's priority
# (the default sets the KV victim order there), critical paths, vLLM's own KV victim.
PAPER_ORDER = {"AUTELLIX_POLICY": "plas-atlas"}
# An engine with a key honours the prior service calls carry (its middleware
# drops the field from callers without the key); one without ignores it.
KEYED = {"AUTELLIX_ENGINE_KEY": "test-key"}


def program(scheduler, program_id):
    return next(
        (p for p in scheduler.autellix_snapshot()["programs"] if p["program_id"] == program_id),
        None,
    )


def admitted(output):
    return [r.req_id for r in output.scheduled_new_reqs]


def test_waiting_calls_are_admitted_in_order_of_program_service(harness):
    scheduler = harness.scheduler(max_num_seqs=1, **SMALL_LEVELS, **KEYED)
    # Program "old" has already attained 100 tokens elsewhere; "new" has none.
    scheduler.add_request(harness.request("old-1", program="old", prior_service=100))
    scheduler.add_request(harness.request("mid-1", program="mid", prior_service=5))
    scheduler.add_request(harness.request("new-1", program="new"))
    order = []
    while scheduler.has_requests():
        order += admitted(harness.step(scheduler))
    assert order == ["new-1", "mid-1", "old-1"]


def test_a_program_that_ran_long_waits_behind_a_short_one(harness):
    scheduler = harness.scheduler(max_num_seqs=1, **SMALL_LEVELS)
    scheduler.add_request(harness.request("long-1", program="long", max_tokens=12))
    harness.run_until_idle(scheduler)
    # Its next call arrives before the short program's first call, yet runs after it.
    scheduler.add_request(harness.request("long-2", program="long"))
    scheduler.add_request(harness.request("short-1", program="short"))
    assert admitted(harness.step(scheduler)) == ["short-1"]


def test_running_call_is_demoted_as_it_attains_service(harness):
    scheduler = harness.scheduler(**SMALL_LEVELS, **PAPER_ORDER)
    request = harness.request("a", program="A", prompt_len=8, max_tokens=12)
    scheduler.add_request(request)
    levels = []
    while scheduler.has_requests():
        harness.step(scheduler)
        if "a" in scheduler.calls:
            levels.append(scheduler.calls["a"].level)
    assert levels[0] == 0 and levels[-1] == 2
    assert levels == sorted(levels)
    assert scheduler.autellix_snapshot()["demotions"] == 2
    assert request.priority == 2  # vLLM's own KV victim rule sees the level


def test_better_level_waiter_preempts_when_the_batch_is_full(harness):
    scheduler = harness.scheduler(max_num_seqs=1, **SMALL_LEVELS)
    long_call = harness.request("long-1", program="long", max_tokens=20)
    scheduler.add_request(long_call)
    for _ in range(10):  # long-1 is now in level 2
        harness.step(scheduler)
    assert scheduler.calls["long-1"].level == 2
    scheduler.add_request(harness.request("short-1", program="short", max_tokens=3))
    output = harness.step(scheduler)
    assert output.preempted_req_ids == {"long-1"}
    assert admitted(output) == ["short-1"]
    assert long_call.status == RequestStatus.PREEMPTED
    snapshot = scheduler.autellix_snapshot()
    assert (snapshot["preemptions"], snapshot["kv_preemptions"]) == (1, 0)  # for a waiter
    assert snapshot["waiter_preemptions"] == {"seat": 1, "kv_blocks": 0, "token_budget": 0}
    harness.run_until_idle(scheduler)
    # The preempted call resumes (recompute) and still produces all its tokens.
    assert long_call.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert long_call.num_output_tokens == 20


def test_a_waiter_displaces_a_running_call_only_once_it_has_paid_for_its_prompt(harness):
    # A 320-token prompt is 20 units at the default prefill weight: its own prefill
    # demotes the call to level 2, and a waiter may displace it once it has decoded
    # 20 tokens since its admission (ProgramScheduler.displaceable).
    scheduler = harness.scheduler(max_num_seqs=1, **SMALL_LEVELS)
    late = harness.request("late-1", program="late", prompt_len=320, max_tokens=40)
    scheduler.add_request(late)
    harness.step(scheduler)  # the prefill, which samples the first token
    assert scheduler.calls["late-1"].level == 2
    scheduler.add_request(harness.request("new-1", program="new", max_tokens=3))
    for _ in range(19):  # decoded 1..19 when each step is scheduled
        assert not harness.step(scheduler).preempted_req_ids
    assert harness.step(scheduler).preempted_req_ids == {"late-1"}


def test_no_preemption_within_a_level(harness):
    scheduler = harness.scheduler(max_num_seqs=1)  # default levels: 0..128 is level 0
    first = harness.request("a-1", program="A", max_tokens=20)
    scheduler.add_request(first)
    for _ in range(5):
        harness.step(scheduler)
    scheduler.add_request(harness.request("b-1", program="B", max_tokens=3))
    while "a-1" in scheduler.requests:
        output = harness.step(scheduler)
        assert not output.preempted_req_ids
        assert "b-1" not in output.num_scheduled_tokens
    harness.run_until_idle(scheduler)
    assert scheduler.autellix_snapshot()["preemptions"] == 0


def test_anti_starvation_promotes_a_long_waiting_call(harness):
    # beta 0.5: a call is promoted once its waiting reaches half its program's service.
    scheduler = harness.scheduler(
        max_num_seqs=1, AUTELLIX_LEVELS="0,4", AUTELLIX_BETA="0.5", **KEYED
    )
    scheduler.add_request(harness.request("heavy-1", program="heavy", prior_service=20))
    # A stream of short programs would keep the seat forever without promotion.
    arrivals = iter(range(100))
    order = []
    for _ in range(200):
        if len(scheduler.waiting) < 3:
            n = next(arrivals)
            scheduler.add_request(harness.request(f"s{n}", program=f"s{n}", max_tokens=2))
        order += admitted(harness.step(scheduler))
        if "heavy-1" in order:
            break
    assert "heavy-1" in order
    assert 3 < order.index("heavy-1") < 40
    snapshot = scheduler.autellix_snapshot()
    assert snapshot["promotions"] >= 1
    assert scheduler.calls["heavy-1"].promotions == 1


def test_atlas_threads_inherit_the_critical_path(harness):
    scheduler = harness.scheduler(**SMALL_LEVELS, **PAPER_ORDER)
    scheduler.add_request(harness.request("root", program="P", thread="main", max_tokens=5))
    harness.run_until_idle(scheduler)
    root_service = program(scheduler, "P")["critical_path"]
    assert root_service > 4
    # Two forked threads start at their parent's critical path, not at zero.
    for tid in ("t1", "t2"):
        scheduler.add_request(
            harness.request(f"fork-{tid}", program="P", thread=tid, parent="main", max_tokens=3)
        )
    assert scheduler.calls["fork-t1"].base == scheduler.calls["fork-t2"].base == root_service
    assert scheduler.calls["fork-t1"].level == 1  # 4 <= service < 8
    harness.run_until_idle(scheduler)
    # The join (next call on main) inherits the longest path through a child.
    scheduler.add_request(harness.request("join", program="P", thread="main"))
    join = scheduler.calls["join"]
    child_service = 3 + 7 * 0.0625  # 3 decoded tokens + 7 prefilled at weight 1/16
    assert join.base == pytest.approx(root_service + child_service)
    assert program(scheduler, "P")["threads"] == 3


def test_completion_and_abort_accounting_leaks_nothing(harness):
    scheduler = harness.scheduler(max_num_seqs=1, num_blocks=64)
    scheduler.add_request(harness.request("run", program="A", max_tokens=50))
    scheduler.add_request(harness.request("wait", program="B", max_tokens=50))
    for _ in range(4):
        harness.step(scheduler)
    service_before_abort = scheduler.calls["run"].service
    aborted = scheduler.finish_requests(["run", "wait"], RequestStatus.FINISHED_ABORTED)
    assert {r.request_id for r in aborted} == {"run", "wait"}
    snapshot = scheduler.autellix_snapshot()
    assert snapshot["calls_aborted"] == 2 and snapshot["calls_finished"] == 2
    assert program(scheduler, "A")["attained_service"] == pytest.approx(service_before_abort)
    assert program(scheduler, "A")["active_calls"] == 0
    assert snapshot["waiting"] == 0 and snapshot["queue_depth"] == [0] * 6
    assert scheduler.calls == {} and len(scheduler.waiting) == 0
    harness.step(scheduler)  # flush the finished ids
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 63


def test_a_call_without_identity_is_its_own_program_and_session_id_is_a_fallback(harness):
    scheduler = harness.scheduler()
    scheduler.add_request(harness.request("anon"))
    scheduler.add_request(harness.request("sess", session_id="conversation-7"))
    ids = {p["program_id"] for p in scheduler.autellix_snapshot()["programs"]}
    assert ids == {ALONE_PREFIX + "anon", "conversation-7"}
    harness.run_until_idle(scheduler)
    snapshot = scheduler.autellix_snapshot()
    # The program of the call alone leaves with its only call; the session stays.
    assert [p["program_id"] for p in snapshot["programs"]] == ["conversation-7"]
    assert snapshot["calls_without_identity"] == 1


def test_kv_pressure_preempts_a_lower_level_call_for_a_better_waiter(harness):
    # 10 blocks of 16 tokens (9 usable); seats are plentiful, KV is not.
    scheduler = harness.scheduler(max_num_seqs=4, num_blocks=10, **SMALL_LEVELS, **PAPER_ORDER)
    hog = harness.request("hog", program="hog", prompt_len=100, max_tokens=30)
    scheduler.add_request(hog)
    for _ in range(8):
        harness.step(scheduler)
    assert scheduler.calls["hog"].level == 2
    scheduler.add_request(harness.request("small", program="small", prompt_len=60, max_tokens=2))
    output = harness.step(scheduler)
    assert output.preempted_req_ids == {"hog"}
    assert admitted(output) == ["small"]
    assert scheduler.autellix_snapshot()["waiter_preemptions"]["kv_blocks"] == 1
    harness.run_until_idle(scheduler)
    assert hog.num_output_tokens == 30
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 9


def test_kv_pressure_does_not_preempt_an_equal_level_call(harness):
    scheduler = harness.scheduler(max_num_seqs=4, num_blocks=10)
    scheduler.add_request(harness.request("hog", program="hog", prompt_len=100, max_tokens=30))
    for _ in range(4):
        harness.step(scheduler)
    scheduler.add_request(harness.request("small", program="small", prompt_len=60, max_tokens=2))
    assert not harness.step(scheduler).preempted_req_ids


def test_prior_service_is_a_floor_on_the_programs_service(harness):
    scheduler = harness.scheduler(**SMALL_LEVELS, **KEYED)
    scheduler.add_request(harness.request("a", program="P", prior_service=6.0))
    assert scheduler.calls["a"].level == 1
    harness.run_until_idle(scheduler)
    own = program(scheduler, "P")["attained_service"]
    # A router reporting less than the engine counted does not lower it...
    scheduler.add_request(harness.request("b", program="P", prior_service=1.0, max_tokens=1))
    assert program(scheduler, "P")["attained_service"] == own
    # ...and a larger report raises it.
    scheduler.add_request(harness.request("c", program="P", prior_service=500.0, max_tokens=1))
    assert program(scheduler, "P")["attained_service"] == 500.0


def test_a_retry_of_an_aborted_call_is_charged_once(harness):
    scheduler = harness.scheduler()
    scheduler.add_request(harness.request("try-1", program="P", call_id="c1", max_tokens=6))
    for _ in range(3):
        harness.step(scheduler)
    scheduler.finish_requests("try-1", RequestStatus.FINISHED_ABORTED)
    aborted = program(scheduler, "P")["attained_service"]
    assert aborted > 0  # the prefill and decode it got are charged
    scheduler.add_request(harness.request("try-2", program="P", call_id="c1", max_tokens=6))
    harness.run_until_idle(scheduler)
    entry = program(scheduler, "P")
    # The retry recomputed what the first attempt did: the id is charged once.
    assert entry["attained_service"] == pytest.approx(6 + 7 * 0.0625)
    assert (entry["calls_aborted"], entry["calls_completed"]) == (1, 1)


def test_a_call_id_reused_after_completing_or_while_live_is_charged_in_full(harness):
    scheduler = harness.scheduler()
    one_call = 32 + 7 * 0.0625
    for n in range(10):  # sequential reuse
        scheduler.add_request(harness.request(f"seq-{n}", program="S", call_id="c", max_tokens=32))
        harness.run_until_idle(scheduler)
    assert program(scheduler, "S")["attained_service"] == pytest.approx(10 * one_call)
    for n in range(3):  # concurrent duplicates
        scheduler.add_request(harness.request(f"dup-{n}", program="D", call_id="c", max_tokens=32))
    assert program(scheduler, "D")["active_calls"] == 3
    harness.run_until_idle(scheduler)
    assert program(scheduler, "D")["attained_service"] == pytest.approx(3 * one_call)


def test_ended_and_idle_programs_leave_the_table(harness):
    scheduler = harness.scheduler(AUTELLIX_IDLE_TTL_S="0.2")
    scheduler.add_request(harness.request("a", program="ended"))
    scheduler.add_request(harness.request("b", program="idle"))
    assert scheduler.autellix_end_program("ended")  # in flight: leaves when it completes
    assert not scheduler.autellix_end_program("nobody")
    assert program(scheduler, "ended") is not None
    harness.run_until_idle(scheduler)
    assert program(scheduler, "ended") is None
    assert program(scheduler, "idle") is not None
    time.sleep(0.25)
    assert scheduler.autellix_snapshot()["programs"] == []


def test_time_service_unit_charges_seconds(harness):
    scheduler = harness.scheduler(AUTELLIX_SERVICE_UNIT="time")
    scheduler.add_request(harness.request("a", program="P", max_tokens=4))
    harness.run_until_idle(scheduler)
    snapshot = scheduler.autellix_snapshot()
    assert snapshot["service_unit"] == "time"
    assert 0 < program(scheduler, "P")["attained_service"] < 1.0


def test_the_policy_comes_from_autellix_policy(harness):
    scheduler = harness.scheduler(max_num_seqs=1, AUTELLIX_POLICY="fcfs", **SMALL_LEVELS, **KEYED)
    assert scheduler.autellix_snapshot()["policy"] == "fcfs"
    # FCFS: arrival order, whatever the programs' service.
    scheduler.add_request(harness.request("old-1", program="old", prior_service=100))
    scheduler.add_request(harness.request("new-1", program="new"))
    order = []
    while scheduler.has_requests():
        order += admitted(harness.step(scheduler))
    assert order == ["old-1", "new-1"]


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("AUTELLIX_POLICY", "srpt", "only the simulator can run it"),
        ("AUTELLIX_POLICY", "lottery", "unknown policy"),
        ("AUTELLIX_BETA", "-1", "must be positive"),
        ("AUTELLIX_LEVELS", "0,x", "comma-separated numbers"),
    ],
)
def test_a_bad_variable_stops_the_scheduler_with_one_error_naming_it(
    harness, variable, value, problem
):
    from autellix_vllm.engine.settings import SettingError

    with pytest.raises(SettingError, match=f"^{variable}='{value}': .*{problem}"):
        harness.scheduler(**{variable: value})


def test_table_snapshot_shows_calls_threads_and_queue_depth(harness):
    scheduler = harness.scheduler(max_num_seqs=1, **SMALL_LEVELS, **KEYED)
    scheduler.add_request(harness.request("a", program="P", thread="main", call_id="c-a"))
    scheduler.add_request(harness.request("b", program="P", thread="t1", parent="main"))
    scheduler.add_request(harness.request("c", program="Q", prior_service=9))
    harness.step(scheduler)
    snapshot = scheduler.autellix_snapshot()
    assert snapshot["enabled"] is True and snapshot["running"] == 1
    assert snapshot["queue_depth"] == [1, 0, 1]
    p = program(scheduler, "P")
    assert p["threads"] == 2 and p["active_calls"] == 2
    states = {c["call_id"]: (c["state"], c["thread_id"]) for c in p["calls"]}
    assert states == {"c-a": ("running", "main"), "b": ("waiting", "t1")}


class FakeRequest:
    def __init__(self, request_id):
        self.request_id = request_id


def queue_with_calls(*ids):
    from autellix_vllm.engine.scheduler import ProgramRequestQueue, core_from_env

    core = core_from_env({})
    calls = {}
    for request_id in ids:
        calls[request_id] = core.add_call(
            CallIdentity("P", call_id=request_id), now_s=0.0, payload=FakeRequest(request_id)
        )
    return core, calls, ProgramRequestQueue(core, calls)


def test_a_popped_then_skipped_request_keeps_its_waiting_time():
    core, calls, queue = queue_with_calls("a", "b")
    queue.add_request(calls["a"].payload)
    queue.add_request(calls["b"].payload)
    core.advance(0.0, steps=3)
    skipped = queue.pop_request()  # vLLM pops, cannot admit it yet, puts it back
    assert skipped.request_id == "a" and len(queue) == 1
    queue.prepend_requests([skipped])
    core.advance(0.0, steps=2)
    assert len(queue) == 2
    assert core.wait_of(calls["a"]) == 5
    assert [r.request_id for r in queue] == ["a", "b"]


def test_removing_a_request_that_was_already_freed_is_harmless():
    core, calls, queue = queue_with_calls("a")
    queue.add_request(calls["a"].payload)
    finished = calls.pop("a")
    core.finish(finished, 1.0)
    queue.remove_requests([finished.payload])
    assert len(queue) == 0 and not queue


# ---- prior service: honoured only on an engine with a key --------------------------


def test_an_engine_without_a_key_ignores_prior_service(harness):
    scheduler = harness.scheduler(**SMALL_LEVELS)
    scheduler.add_request(harness.request("v", program="victim", prior_service=1e308))
    assert program(scheduler, "victim")["attained_service"] == 0
    assert scheduler.calls["v"].level == 0
    assert scheduler.autellix_snapshot()["prior_service_trusted"] is False


def test_an_engine_with_a_key_clamps_prior_service(harness):
    from autellix_vllm.policy import DEFAULT_LIMITS

    scheduler = harness.scheduler(**KEYED)
    scheduler.add_request(harness.request("v", program="P", prior_service=1e308))
    assert program(scheduler, "P")["attained_service"] == DEFAULT_LIMITS.max_prior_service


# ---- limits and failures: the engine goes on ----------------------------------------


def test_the_issue_chain_of_1101_threads_leaves_the_engine_scheduling(harness):
    scheduler = harness.scheduler(max_num_seqs=64, num_blocks=4000)
    for k in range(1101):
        parent = f"t{k - 1}" if k else None
        scheduler.add_request(
            harness.request(f"c{k}", program="chain", thread=f"t{k}", parent=parent, max_tokens=1)
        )
        harness.run_until_idle(scheduler)
    scheduler.add_request(harness.request("join", program="chain", thread="t0", max_tokens=1))
    assert scheduler.calls["join"].program.program_id == "chain"
    harness.run_until_idle(scheduler)
    snapshot = scheduler.autellix_snapshot()
    entry = program(scheduler, "chain")
    assert entry["calls_completed"] + snapshot["calls_over_limit"]["max_fork_depth"] == 1102
    assert snapshot["hook_failures"] == {}


def test_live_calls_past_the_limit_run_alone_and_are_counted(harness):
    scheduler = harness.scheduler(AUTELLIX_MAX_LIVE_CALLS="2")
    for n in range(3):
        scheduler.add_request(harness.request(f"r{n}", program="P"))
    assert scheduler.calls["r2"].program.program_id == ALONE_PREFIX + "r2"
    assert program(scheduler, "P")["active_calls"] == 2
    assert scheduler.autellix_snapshot()["calls_over_limit"] == {"max_live_calls": 1}
    harness.run_until_idle(scheduler)
    assert program(scheduler, ALONE_PREFIX + "r2") is None


class BaseFailsFor:
    """Wraps a policy: ``base`` raises for one program id."""

    def __init__(self, policy, program_id):
        self.policy = policy
        self.program_id = program_id

    def base(self, call):
        if call.program.program_id == self.program_id:
            raise RuntimeError(f"no base for {self.program_id}")
        return self.policy.base(call)

    def __getattr__(self, name):
        return getattr(self.policy, name)


def test_a_policy_failing_for_one_program_runs_its_calls_alone(harness, caplog):
    import logging

    scheduler = harness.scheduler(max_num_seqs=2)
    scheduler.core.policy = BaseFailsFor(scheduler.core.policy, "doomed")
    with caplog.at_level(logging.ERROR):
        for n in range(5):
            scheduler.add_request(harness.request(f"d{n}", program="doomed", max_tokens=3))
        scheduler.add_request(harness.request("ok", program="healthy", max_tokens=3))
        harness.run_until_idle(scheduler)
    snapshot = scheduler.autellix_snapshot()
    assert snapshot["hook_failures"] == {"base": 5}
    assert snapshot["calls_finished"] == 6 and snapshot["calls_aborted"] == 0
    assert program(scheduler, "healthy")["calls_completed"] == 1
    assert sum("no base for doomed" in r.getMessage() for r in caplog.records) == 1


def test_failing_step_hooks_are_counted_and_the_calls_still_complete(harness, monkeypatch):
    from autellix_vllm.engine import _vllm_adapter as adapter

    scheduler = harness.scheduler(max_num_seqs=1, **SMALL_LEVELS)
    scheduler.add_request(harness.request("long", program="long", max_tokens=20))
    for _ in range(10):
        harness.step(scheduler)
    core = scheduler.core

    def broken(*args, **kwargs):
        raise RuntimeError("broken hook")

    # The preemption pass (a better-level waiter arrives), charging, the clock.
    monkeypatch.setattr(adapter, "preempt_running", broken)
    monkeypatch.setattr(core, "charge", broken)
    monkeypatch.setattr(core, "advance", broken)
    scheduler.add_request(harness.request("short", program="short", max_tokens=3))
    harness.step(scheduler)
    monkeypatch.undo()
    monkeypatch.setattr(core, "finish", broken)
    harness.run_until_idle(scheduler)
    failures = scheduler.autellix_snapshot()["hook_failures"]
    assert set(failures) == {"preemption", "charge", "advance", "finish"}
    assert scheduler.calls == {} and not scheduler.has_requests()
    # The programs' idle contexts are held until they end: then nothing is left.
    assert scheduler.autellix_end_program("long") and scheduler.autellix_end_program("short")
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 999


def test_a_failing_registration_runs_the_call_alone(harness, monkeypatch):
    from autellix_vllm.engine import _vllm_adapter as adapter

    scheduler = harness.scheduler()

    def broken(request):
        raise RuntimeError("cannot read the identity")

    monkeypatch.setattr(adapter, "call_identity", broken)
    scheduler.add_request(harness.request("r", program="P", max_tokens=2))
    assert scheduler.calls["r"].program.program_id == ALONE_PREFIX + "r"
    harness.run_until_idle(scheduler)
    assert scheduler.autellix_snapshot()["hook_failures"] == {"add_request": 1}


def test_the_table_gives_the_batch_size_the_routers_gate_counts(harness):
    assert harness.scheduler(max_num_seqs=3).autellix_snapshot()["seats"] == 3
