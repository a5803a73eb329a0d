"""PLAS, ATLAS, levels, demotion, anti-starvation and preemption choices."""

import pytest
from autellix_vllm.policy import (
    ATLAS,
    DEFAULT_POLICY,
    FCFS,
    MLFQ,
    PLAS,
    POLICIES,
    POLICY_NAMES,
    SRPT,
    Autellix,
    Levels,
    PlasAtlas,
    Policy,
    PolicyConfig,
    ProgramScheduler,
    ServiceMeter,
    make_policy,
    policies,
    policy_name,
)
from autellix_vllm.protocol.identity import CallIdentity

LEVELS = Levels(boundaries=(0.0, 10.0, 100.0, 1000.0))


def run_call(core, call_id, program, tokens, now=0.0, **ids):
    """Arrive, run ``tokens`` decode steps and complete one call."""
    call = core.add_call(CallIdentity(program, **ids, call_id=call_id), now_s=now)
    finish_call(core, call, tokens, now)
    return call


def finish_call(core, call, tokens, now=0.0):
    """Run ``tokens`` decode steps of an arrived call and complete it."""
    core.enqueue(call)
    core.start(call)
    core.charge(call, decode_tokens=tokens)
    core.finish(call, now_s=now)


def make(policy, **config):
    return ProgramScheduler(policy, PolicyConfig(levels=LEVELS, **config))


def test_levels_defaults_and_validation():
    levels = Levels()
    assert levels.quanta[-1] == float("inf")
    assert [levels.level_of(s) for s in (0, 127, 128, 10**9)] == [0, 0, 1, len(levels) - 1]
    with pytest.raises(ValueError):
        Levels(boundaries=(1.0, 2.0))
    with pytest.raises(ValueError):
        Levels(boundaries=(0.0, 5.0, 5.0))
    assert Levels.geometric(4, 100, 4).boundaries == (0.0, 100.0, 400.0, 1600.0)


def test_plas_starts_a_call_at_its_programs_service():
    core = make(PLAS())
    run_call(core, "a1", "long", 150)
    fresh = core.add_call(CallIdentity("short", call_id="b1"), now_s=0.0)
    old = core.add_call(CallIdentity("long", call_id="a2"), now_s=0.0)
    assert (fresh.level, old.level) == (0, 2)
    core.enqueue(old)
    core.enqueue(fresh)
    assert core.pop() is fresh  # the program with less service goes first


def test_service_unit_counts_weighted_prefill():
    core = make(PLAS(), meter=ServiceMeter(prefill_weight=0.5))
    call = core.add_call(CallIdentity("p", call_id="a"), now_s=0.0)
    core.charge(call, decode_tokens=2, prefill_tokens=10)
    assert call.service == 7.0
    timed = make(PLAS(), meter=ServiceMeter(unit="time"))
    call = timed.add_call(CallIdentity("p", call_id="a"), now_s=0.0)
    timed.charge(call, decode_tokens=2, prefill_tokens=10, seconds=0.25)
    assert call.service == 0.25


def test_demotion_when_quantum_is_spent():
    core = make(PLAS())
    call = core.add_call(CallIdentity("p", call_id="a1"), now_s=0.0)
    core.enqueue(call)
    core.start(call)
    core.charge(call, decode_tokens=9)
    assert call.level == 0
    core.charge(call, decode_tokens=1)
    assert call.level == 1  # 10 units spent the first quantum
    core.charge(call, decode_tokens=200)
    assert call.level == 2
    core.charge(call, decode_tokens=1000)
    assert call.level == 3 and core.counters.demotions == 3
    assert core.next_demotion(call) == float("inf")  # the last level keeps it


def test_victims_only_across_levels():
    core = make(PLAS())
    running = []
    for i in range(2):
        call = core.add_call(CallIdentity(f"run{i}", call_id=f"r{i}"), now_s=0.0)
        core.enqueue(call)
        core.start(call)
        core.charge(call, decode_tokens=5)  # still level 0
        running.append(call)
    waiter = core.add_call(CallIdentity("new", call_id="w"), now_s=0.0)
    core.enqueue(waiter)
    assert core.victims(running, free_seats=0) == []  # same level: no preemption
    assert core.victims(running, free_seats=1) == []  # a seat is free
    core.charge(running[1], decode_tokens=10)  # demoted to level 1
    assert core.victims(running, free_seats=0) == [running[1]]


def test_victims_pair_best_waiters_with_worst_runners():
    core = make(PLAS())
    running = []
    for i, tokens in enumerate((200, 20, 0)):
        call = core.add_call(CallIdentity(f"run{i}", call_id=f"r{i}"), now_s=0.0)
        core.enqueue(call)
        core.start(call)
        core.charge(call, decode_tokens=tokens)
        running.append(call)
    for i in range(3):
        core.enqueue(core.add_call(CallIdentity(f"new{i}", call_id=f"w{i}"), now_s=0.0))
    # Levels of the running calls: 2, 1, 0. Waiters are level 0: they displace the
    # level-2 and level-1 calls, not the level-0 one.
    assert core.victims(running, free_seats=0) == [running[0], running[1]]


def test_a_late_short_programs_call_keeps_its_seat_until_it_pays_for_its_prompt():
    # A late program's only call: its own 1,212-token prompt (75.75 units at the
    # default prefill weight) demotes it during its prefill. A newer program's
    # first call, in the top level, must not take its seat right after the
    # prefill, which it would recompute on return.
    core = make(Autellix())
    late = core.add_call(CallIdentity("late", call_id="l"), now_s=0.0, prompt_tokens=1212)
    core.enqueue(late)
    core.start(core.pop())
    core.charge(late, decode_tokens=1, prefill_tokens=1211)  # the prefill samples a token
    assert late.level == 1
    newer = core.add_call(CallIdentity("newer", call_id="n"), now_s=1.0, prompt_tokens=900)
    core.enqueue(newer)
    assert newer.level == 0 and core.outranks(newer, late)
    assert core.victims([late], free_seats=0) == []
    core.charge(late, decode_tokens=74)  # 75 decoded: its prompt is not paid for yet
    assert core.victims([late], free_seats=0) == []
    core.charge(late, decode_tokens=1)  # 76 >= 75.75
    assert core.victims([late], free_seats=0) == [late]
    # Preempted and admitted again, it pays for its prompt again.
    core.preempt(late)
    core.start(core.pop())  # the newer call runs
    core.start(core.pop())
    assert late.decoded_since_start == 0 and core.displaceable([late]) == []


def test_displaceable_counts_decoded_tokens_under_the_time_unit():
    core = make(Autellix(), meter=ServiceMeter(unit="time"))
    call = core.add_call(CallIdentity("p", call_id="a"), now_s=0.0, prompt_tokens=160)
    core.enqueue(call)
    core.start(core.pop())
    core.charge(call, decode_tokens=1, prefill_tokens=159)  # engines pass tokens, no seconds
    assert call.service == 0.0 and core.displaceable([call]) == []
    core.charge(call, decode_tokens=9, seconds=0.5)  # 10 decoded = 160 x 0.0625
    assert call.service == 0.5 and core.displaceable([call]) == [call]


def test_fcfs_never_preempts_for_a_waiter():
    core = ProgramScheduler(FCFS())
    call = core.add_call(CallIdentity("p", call_id="old"), now_s=0.0)
    core.enqueue(call)
    core.start(call)
    core.charge(call, decode_tokens=10_000)
    core.enqueue(core.add_call(CallIdentity("q", call_id="new"), now_s=1.0))
    assert core.victims([call], free_seats=0) == []


def test_fcfs_keeps_arrival_order_after_preemption():
    core = ProgramScheduler(FCFS())
    first = core.add_call(CallIdentity("p", call_id="a"), now_s=0.0)
    second = core.add_call(CallIdentity("q", call_id="b"), now_s=0.0)
    core.enqueue(first)
    core.enqueue(second)
    core.start(core.pop())
    core.preempt(first)  # goes back ahead of later arrivals, like vLLM's prepend
    assert core.pop() is first


def test_mlfq_is_program_unaware():
    core = make(MLFQ())
    run_call(core, "a1", "long", 500)
    assert core.add_call(CallIdentity("long", call_id="a2"), now_s=0.0).level == 0


def test_atlas_program_variant_takes_the_longest_path():
    core = make(ATLAS("program"))
    # Two concurrent threads: both inherit the scalar (0); completion keeps the max.
    a = core.add_call(
        CallIdentity("p", thread_id="t1", parent_thread_id="main", call_id="a"), now_s=0.0
    )
    b = core.add_call(
        CallIdentity("p", thread_id="t2", parent_thread_id="main", call_id="b"), now_s=0.0
    )
    for call, tokens in ((a, 30), (b, 50)):
        core.enqueue(call)
        core.start(call)
        core.charge(call, decode_tokens=tokens)
    core.finish(a, now_s=1.0)
    core.finish(b, now_s=1.0)
    program = core.table.get("p")
    assert program.critical_path == 50.0  # max(0+30, 0+50), not the sum 80
    assert program.attained_service == 80.0
    assert core.add_call(CallIdentity("p", call_id="c"), now_s=2.0).base == 50.0


def test_atlas_thread_variant_forks_and_joins():
    core = make(ATLAS("thread"))
    run_call(core, "root", "p", 20, thread_id="main")
    # Fork: two children in flight together start at the parent's path, 20.
    left = core.add_call(
        CallIdentity("p", thread_id="left", parent_thread_id="main", call_id="l1"), now_s=0.0
    )
    right = core.add_call(
        CallIdentity("p", thread_id="right", parent_thread_id="main", call_id="r1"), now_s=0.0
    )
    assert (left.base, right.base) == (20.0, 20.0)
    finish_call(core, left, 5)
    finish_call(core, right, 40)
    # The short branch's next call ranks by its own path (25), not the program's (60).
    assert core.add_call(CallIdentity("p", thread_id="left", call_id="l2"), now_s=0.0).base == 25.0
    # Join: the parent's next call continues from the longest joined child (60).
    nested = run_call(core, "g1", "p", 7, thread_id="grand", parent_thread_id="right")
    assert nested.base == 60.0
    joined = core.add_call(CallIdentity("p", thread_id="main", call_id="root2"), now_s=0.0)
    assert joined.base == 67.0  # grandchild's path 60 + 7 counts too


def test_atlas_a_fork_after_a_join_starts_past_the_joined_children():
    """A search that forks rounds of children and never calls itself (MCTS):
    each round starts where the finished rounds ended, not at zero."""
    core = make(ATLAS("thread"))
    a = core.add_call(
        CallIdentity("p", thread_id="round1-a", parent_thread_id="main", call_id="a"), now_s=0.0
    )
    b = core.add_call(
        CallIdentity("p", thread_id="round1-b", parent_thread_id="main", call_id="b"), now_s=0.0
    )
    assert (a.base, b.base) == (0.0, 0.0)
    finish_call(core, a, 30)
    finish_call(core, b, 50)
    second = core.add_call(
        CallIdentity("p", thread_id="round2", parent_thread_id="main", call_id="c"), now_s=0.0
    )
    assert second.base == 50.0
    finish_call(core, second, 10)
    third = core.add_call(
        CallIdentity("p", thread_id="round3", parent_thread_id="main", call_id="d"), now_s=0.0
    )
    assert third.base == 60.0


def test_plas_atlas_is_plas_on_one_thread_and_atlas_on_many():
    core = make(PlasAtlas())
    first = run_call(core, "a1", "p", 30)
    assert first.base == 0.0
    core.add_call(
        CallIdentity("p", prior_service=500.0, call_id="a2"), now_s=0.0
    )  # router saw more elsewhere
    assert core.add_call(CallIdentity("p", call_id="a3"), now_s=0.0).base == 500.0
    multi = make(PlasAtlas())
    x = multi.add_call(
        CallIdentity("q", thread_id="t1", parent_thread_id="main", call_id="x"), now_s=0.0
    )
    y = multi.add_call(
        CallIdentity("q", thread_id="t2", parent_thread_id="main", call_id="y"), now_s=0.0
    )
    finish_call(multi, x, 30)
    finish_call(multi, y, 40)
    assert (
        multi.add_call(CallIdentity("q", call_id="z"), now_s=0.0).base == 40.0
    )  # critical path, not 70


def test_autellix_ranks_fork_join_programs_by_total_service():
    """Under residency a wide program's threads share its seats and KV: it ranks by
    everything its threads attained, not by its critical path as under plas-atlas."""
    ranks = {}
    for name in ("plas-atlas", "autellix"):
        core = make(make_policy(name))
        threads = []  # three threads in flight together
        for i, tokens in enumerate((30, 40, 40)):
            thread = {"thread_id": f"t{i}", "parent_thread_id": "main"}
            call = core.add_call(CallIdentity("q", **thread, call_id=f"c{i}"), now_s=0.0)
            core.enqueue(call)
            core.start(call)
            core.charge(call, decode_tokens=tokens)
            threads.append(call)
        for call in threads:
            core.finish(call, now_s=1.0)
        next_call = core.add_call(CallIdentity("q", call_id="z"), now_s=2.0)
        ranks[name] = (next_call.base, next_call.level, core.program_level(core.table.get("q")))
    assert ranks["plas-atlas"] == (40.0, 1, 1)  # the longest thread
    assert ranks["autellix"] == (110.0, 2, 2)  # all three


def test_autellix_serves_a_level_in_the_order_its_programs_entered_it():
    """A program back from a tool keeps its place in its level under plas-atlas;
    under autellix its call queues behind programs that came later."""
    for name, order in (("plas-atlas", ["b1", "a2"]), ("autellix", ["a2", "b1"])):
        core = make(make_policy(name))
        run_call(core, "a1", "a", 5)  # a enters level 0 first and stays there (5 < 10)
        core.enqueue(core.add_call(CallIdentity("b", call_id="b1"), now_s=1.0))
        core.enqueue(core.add_call(CallIdentity("a", call_id="a2"), now_s=2.0))
        assert [call.call_id for call in core.waiting.best(2)] == order, name


def test_autellix_a_promoted_call_joins_the_tail_of_the_top_level():
    core = make(make_policy("autellix"), beta=2.0)
    run_call(core, "p1", "p", 50)  # p entered level 0 first, and is in level 1 now
    core.enqueue(core.add_call(CallIdentity("q", call_id="q1"), now_s=0.0))
    starving = core.add_call(CallIdentity("p", call_id="p2"), now_s=0.0)
    core.enqueue(starving)
    core.advance(now_s=0.0, steps=100)  # waited 100 = beta * service
    assert starving.level == 0 and starving.promotions == 1
    # Not at p's old place in level 0, ahead of q, but after q: promotion bounds a
    # wait, it does not jump a queue.
    assert [call.call_id for call in core.waiting.best(2)] == ["q1", "p2"]


def test_prior_service_raises_plas_priority():
    core = make(PLAS())
    call = core.add_call(CallIdentity("p", prior_service=150.0, call_id="c"), now_s=0.0)
    assert call.level == 2


def test_anti_starvation_promotes_and_resets_only_the_call():
    core = make(PLAS(), beta=2.0)
    run_call(core, "a1", "long", 50)  # program service 50 -> level 1
    waiter = core.add_call(CallIdentity("long", call_id="a2"), now_s=0.0)
    core.enqueue(waiter)
    assert waiter.level == 1
    core.advance(now_s=0.0, steps=99)  # waited 99 < 2 * 50
    assert waiter.level == 1
    core.advance(now_s=0.0, steps=1)  # waited 100 = beta * service
    assert waiter.level == 0 and waiter.promotions == 1
    assert waiter.starve_wait == 0.0 and core.counters.promotions == 1
    program = core.table.get("long")
    assert program.attained_service == 50.0  # program values are kept
    assert core.next_promotion() is None  # nothing higher to promote it to


def test_program_wait_counts_toward_starvation():
    core = make(PLAS(), beta=2.0)
    first = core.add_call(CallIdentity("p", call_id="a1"), now_s=0.0)
    core.enqueue(first)
    core.advance(now_s=0.0, steps=60)  # first call waits 60 steps in level 0
    core.start(first)
    core.charge(first, decode_tokens=50)
    core.finish(first, now_s=0.0)
    second = core.add_call(CallIdentity("p", call_id="a2"), now_s=0.0)
    core.enqueue(second)
    # W_p = 60 already: promotion after 2 * 50 - 60 = 40 more steps.
    assert core.next_promotion() == core.clock + 40


def test_the_starvation_threshold_grows_with_the_queue_beyond_the_batch():
    def deadline_with(waiting_calls: int, seats: int | None) -> float:
        core = ProgramScheduler(PLAS(), PolicyConfig(levels=LEVELS, beta=2.0), seats=seats)
        run_call(core, "a1", "long", 50)  # program service 50 -> level 1
        for i in range(waiting_calls - 1):
            core.enqueue(core.add_call(CallIdentity(f"other-{i}", call_id=f"q{i}"), now_s=0.0))
        waiter = core.add_call(CallIdentity("long", call_id="a2"), now_s=0.0)
        core.enqueue(waiter)
        return core.next_promotion()

    plain = deadline_with(8, seats=None)
    assert plain == 2.0 * 50  # beta x service, as in the paper
    assert deadline_with(8, seats=16) == plain  # the queue is shorter than the batch
    assert deadline_with(8, seats=2) == 4 * plain  # four batches' worth wait


def test_a_due_deadline_is_checked_again_under_the_load_of_then():
    core = ProgramScheduler(PLAS(), PolicyConfig(levels=LEVELS, beta=2.0), seats=1)
    run_call(core, "a1", "long", 50)
    waiter = core.add_call(CallIdentity("long", call_id="a2"), now_s=0.0)
    core.enqueue(waiter)  # alone in the queue: deadline 100
    for i in range(3):  # then three more calls queue up behind it
        core.enqueue(core.add_call(CallIdentity(f"other-{i}", call_id=f"q{i}"), now_s=0.0))
    core.advance(now_s=0.0, steps=100)
    assert waiter.level == 1  # 4 calls on 1 seat: not starving yet
    core.advance(now_s=0.0, steps=300)
    assert waiter.level == 0 and waiter.promotions == 1


def test_srpt_ranks_by_remaining_work():
    remaining = {"big": 1000.0, "small": 10.0}
    core = ProgramScheduler(SRPT(lambda p: remaining[p.program_id]))
    big = core.add_call(CallIdentity("big", call_id="b"), now_s=0.0)
    small = core.add_call(CallIdentity("small", call_id="s"), now_s=0.0)
    core.enqueue(big)
    core.start(core.pop())
    core.enqueue(small)
    assert core.victims([big], free_seats=0) == [big]


def test_make_policy_names():
    assert make_policy("plas-atlas", "program").variant == "program"
    with pytest.raises(ValueError, match="oracle"):
        make_policy("srpt")
    with pytest.raises(ValueError, match="unknown policy 'lottery' \\(choose from fcfs, mlfq"):
        make_policy("lottery")


def test_the_default_is_the_kv_aware_order_and_its_old_name_still_works():
    assert DEFAULT_POLICY == "autellix" and POLICIES[DEFAULT_POLICY].kv_aware
    with pytest.warns(FutureWarning, match="'autellix-kv' is now called 'autellix'"):
        assert type(make_policy("autellix-kv")) is POLICIES["autellix"]
    assert policy_name("plas-atlas") == "plas-atlas"
    assert policy_name("lottery") == "lottery"  # for the caller's lookup to reject


def test_every_policy_class_is_registered_under_its_name():
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    classes = {cls.name: cls for cls in subclasses(Policy) if cls.__module__ == policies.__name__}
    assert classes == POLICIES
    assert POLICY_NAMES == (
        "fcfs", "mlfq", "plas", "atlas", "plas-atlas", "autellix",
        "continuum", "thunderagent", "mori", "lru-priority", "srpt",
    )  # fmt: skip
    for name, cls in POLICIES.items():
        policy = make_policy(name, "program", remaining=lambda program: 0.0)
        assert type(policy) is cls and policy.name == name
    assert [name for name, cls in POLICIES.items() if cls.clairvoyant] == ["srpt"]


def test_a_new_policy_is_one_class(monkeypatch):
    monkeypatch.setattr(policies, "POLICIES", dict(POLICIES))  # the test's class leaves no trace

    class LastComeFirstServed(Policy):
        name = "lcfs"
        uses_levels = False

        def base(self, call):
            return 0.0

        def rank(self, call):
            return (0, -call.seq)

    core = ProgramScheduler(make_policy("lcfs"))
    for i in range(3):
        core.enqueue(core.add_call(CallIdentity(f"p{i}", call_id=f"c{i}"), now_s=0.0))
    assert isinstance(core.policy, LastComeFirstServed)
    assert [core.pop().call_id for _ in range(3)] == ["c2", "c1", "c0"]
    assert "lcfs" not in POLICIES


def test_levels_parse_and_print_as_comma_separated_boundaries():
    levels = Levels.parse("0,4,8.5,1e6")
    assert levels.boundaries == (0.0, 4.0, 8.5, 1e6)
    assert str(levels) == "0,4,8.5,1000000"
    assert Levels.parse(str(Levels())) == Levels()
    for text, problem in (
        ("0,x", "comma-separated numbers"),
        ("", "comma-separated"),
        ("4,8", "start at 0"),
        ("0,8,4", "increase"),
        ("0,inf", "finite"),
    ):
        with pytest.raises(ValueError, match=problem):
            Levels.parse(text)


def test_snapshot_reports_programs_and_queue():
    core = make(PLAS())
    run_call(core, "a1", "p", 20)
    core.enqueue(
        core.add_call(
            CallIdentity("p", thread_id="t", parent_thread_id="main", call_id="a2"), now_s=1.0
        )
    )
    snap = core.snapshot(now_s=2.0)
    (program,) = snap["programs"]
    assert program["attained_service"] == 20.0 and program["threads"] == 2
    assert program["calls"][0]["state"] == "waiting"
    assert snap["queue_depth"][1] == 1 and snap["waiting"] == 1


def test_requeue_keeps_the_waiting_stretch():
    core = make(PLAS())
    call = core.add_call(CallIdentity("p", call_id="a"), now_s=0.0)
    core.enqueue(call)
    core.advance(now_s=0.0, steps=5)
    assert core.pop() is call
    core.requeue(call)  # popped, not admitted: still waiting since step 0
    core.advance(now_s=0.0, steps=3)
    core.start(call)
    assert call.total_wait == 8
    with pytest.raises(ValueError):
        core.requeue(call)
