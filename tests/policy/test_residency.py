"""KV residency: holds of idle contexts by rank, the working-set rule, victim cost."""

import pytest
from autellix_vllm.policy import Autellix, PlasAtlas, PolicyConfig, Program, ProgramScheduler
from autellix_vllm.policy.config import ResidencyConfig, TableBounds
from autellix_vllm.policy.residency import RELOAD_SPEEDUP, Residency, undo_cost
from autellix_vllm.policy.table import Call, ProcessTable
from autellix_vllm.protocol.identity import CallIdentity

CONFIG = ResidencyConfig(hold_share=0.5, headroom=0.1, prior_gap_s=2.0, prior_weight=2.0,
                         ttl_gaps=4.0, min_ttl_s=1.0, max_ttl_s=60.0)  # fmt: skip


def program(name: str, level: int = 0, gaps: tuple[float, ...] = ()) -> Program:
    p = Program(name)
    p.attained_service = float(level)  # the residency below ranks by this
    p.gaps, p.gap_total_s = len(gaps), sum(gaps)
    return p


def residency(capacity: int = 100) -> Residency:
    return Residency(CONFIG, capacity, level_of=lambda p: int(p.attained_service))


def test_a_hold_lasts_a_few_expected_gaps_pulled_towards_the_prior():
    assert CONFIG.expected_gap_s(program("new")) == 2.0
    # Two gaps of 0.5 s against a prior worth two gaps of 2 s: 1.25 s expected.
    seen = program("seen", gaps=(0.5, 0.5))
    assert CONFIG.expected_gap_s(seen) == 1.25
    assert CONFIG.ttl_s(seen) == 5.0
    assert CONFIG.ttl_s(program("slow", gaps=(1000.0,) * 8)) == 60.0  # capped
    assert CONFIG.ttl_s(seen, hint_s=0.1) == 1.0  # a client's hint, within the bounds
    assert CONFIG.ttl_s(seen, hint_s=30.0) == 30.0
    # A tool of no time still gets the shortest hold: its next call is on its way.
    assert CONFIG.ttl_s(seen, hint_s=0.0) == 1.0


def test_by_default_a_hold_outlasts_most_tool_gaps():
    """The default estimate holds 24 expected gaps (48 s for a program without
    history)."""
    assert ResidencyConfig().ttl_s(program("new")) == 48.0


def test_holds_expire_unless_their_program_is_back():
    r = residency()
    r.hold("a", program("a"), 10, now=0.0)
    r.hold("b", program("b"), 10, now=0.0)
    assert "a" in r and r.held_blocks == 20
    r.waiting("b", "b", 10)  # b's next call arrived: held until it is admitted
    assert r.next_expiry() == 8.0
    assert r.expired(7.9) == [] and r.expired(8.0) == ["a"]
    assert r.next_expiry() is None and r.held_blocks == 10
    assert r.take("b") and not r.take("b") and r.held_blocks == 0


def test_the_budget_goes_to_better_ranked_programs():
    r = residency(capacity=100)  # 50 blocks for holds
    r.hold("low", program("low", level=3), 30, now=0.0)
    r.hold("mid", program("mid", level=2), 20, now=0.0)
    # A better-ranked context displaces the worst-ranked hold, not the others.
    assert r.hold("top", program("top", level=0), 25, now=0.0) == ["low"]
    assert set(r.holds) == {"mid", "top"} and r.held_blocks == 45
    # A worse-ranked one cannot displace better ones: refused.
    assert r.hold("worse", program("worse", level=4), 10, now=0.0) == []
    assert "worse" not in r and r.refused == 1
    assert r.breakable(1) == ["mid"] and r.breakable(0) == ["mid"]
    assert r.breakable(2) == []


def test_an_ended_program_is_not_held():
    ended = program("done")
    ended.ended = True
    r = residency()
    assert r.hold("done", ended, 10, now=0.0) == [] and "done" not in r


def test_the_rules_apply_once_the_live_contexts_outgrow_the_host_tier():
    table = ProcessTable(TableBounds(idle_ttl_s=60.0))
    table.open("c", now_s=0.0)
    table.open("a", now_s=10.0)
    table.open("b", now_s=10.0)
    without_tier = residency()
    assert without_tier.engaged(table)
    r = Residency(CONFIG, 100, level_of=lambda p: 0, tier_blocks=30)
    r.live.seen("a", "a", 10)
    r.live.seen("a", "a/sub", 8)  # a subagent's own context
    r.live.seen("b", "b", 6)
    r.live.seen("b", "b", 4)  # a shorter call shares the longest one's prefix
    assert r.live.total == 24 and not r.engaged(table)
    r.live.seen("c", "c", 7)
    assert r.engaged(table)
    # Programs the process table no longer knows (their clients never said they
    # ended: here c went idle past the table's TTL) are forgotten once the rules
    # would apply.
    assert table.evict_idle(now_s=65.0) == ["c"] and table.departures == 1
    assert not r.engaged(table)
    assert r.live.total == 24
    r.hold("a", program("a"), 10, now=0.0)
    assert r.release_program("a") == ["a"] and r.live.total == 6
    r.hold("b", program("b"), 6, now=0.0)
    assert r.release_all() == ["b"] and r.held_blocks == 0


def test_the_working_set_rule_keeps_a_headroom():
    r = residency(capacity=100)  # headroom 10 blocks
    assert r.fits(40, reclaimable_blocks=50)
    assert not r.fits(41, reclaimable_blocks=50)


def test_the_reserve_grows_with_the_largest_resident_context():
    """By default no fixed headroom: half the largest resident context is kept free."""
    r = Residency(ResidencyConfig(), 1000, level_of=lambda p: 0)
    assert r.fits(50, reclaimable_blocks=50)
    assert r.fits(30, reclaimable_blocks=50, largest_resident=40)
    assert not r.fits(31, reclaimable_blocks=50, largest_resident=40)


def _call(name: str, level: int, seq: int) -> Call:
    p = program(name)
    c = Call(name, p, p.thread(None), 0.0)
    c.level, c.seq = level, seq
    return c


def test_the_victim_is_the_cheapest_to_undo_in_the_worst_level():
    calls = [_call("a", 2, 1), _call("b", 2, 2), _call("c", 1, 3)]
    cost = {"a": 100.0, "b": 5000.0, "c": 0.0}
    victim = Residency.victim(calls, lambda c: (c.level, c.seq), lambda c: cost[c.call_id])
    assert victim.call_id == "a"  # not c (better level), not b (dearer to undo)
    cost["a"] = cost["b"]
    victim = Residency.victim(calls, lambda c: (c.level, c.seq), lambda c: cost[c.call_id])
    assert victim.call_id == "b"  # a tie: the worst rank


def test_undoing_a_preemption_costs_its_recompute_less_what_a_host_tier_reloads():
    assert undo_cost(1000) == 1000
    assert undo_cost(1000, reloadable_tokens=600) == 400 + 600 / RELOAD_SPEEDUP
    assert undo_cost(100, reloadable_tokens=600) == 100 / RELOAD_SPEEDUP


def test_the_core_counts_tool_gaps_and_ranks_idle_programs():
    core = ProgramScheduler(Autellix(), PolicyConfig())
    first = core.add_call(CallIdentity("p", call_id="c1"), now_s=0.0)
    core.enqueue(first)
    core.start(first)
    core.charge(first, decode_tokens=200)
    core.finish(first, now_s=1.0)
    program = core.table.get("p")
    assert program.gaps == 0
    assert core.program_level(program) == core.levels.level_of(200.0)
    second = core.add_call(CallIdentity("p", call_id="c2"), now_s=4.5)
    assert (program.gaps, program.gap_total_s) == (1, 3.5)
    core.add_call(
        CallIdentity("p", call_id="c3"), now_s=5.0
    )  # a second call while one is in flight: no gap
    assert program.gaps == 1
    assert second.level == core.levels.level_of(200.0)


def test_only_the_kv_aware_policy_asks_for_residency():
    assert Autellix.kv_aware and not PlasAtlas.kv_aware
    assert Autellix().rank is not None


@pytest.mark.parametrize(
    "bad",
    [dict(hold_share=1.5), dict(headroom=1.0), dict(prior_gap_s=0.0), dict(ttl_gaps=-1.0),
     dict(prior_weight=0.0), dict(min_ttl_s=5.0, max_ttl_s=1.0)],
)  # fmt: skip
def test_residency_config_rejects_nonsense(bad):
    with pytest.raises(ValueError):
        ResidencyConfig(**bad)


def test_a_waiting_context_never_expires():
    r = residency()
    r.hold("a", program("a"), 10, now=0.0)
    r.waiting("a", "a", 10)
    assert r.expired(1e12) == [] and "a" in r


def test_only_a_new_programs_first_call_is_overdue_past_the_bound():
    core = ProgramScheduler(Autellix(), PolicyConfig())
    r = Residency(ResidencyConfig(first_call_bound_s=5.0), 100, level_of=lambda p: 0)
    first = core.add_call(CallIdentity("new", call_id="1"), now_s=10.0)
    assert not r.overdue(first, now=14.9) and r.overdue(first, now=15.0)
    core.enqueue(first)
    core.start(core.peek())
    core.finish(first, now_s=16.0)
    second = core.add_call(CallIdentity("new", call_id="2"), now_s=20.0)
    assert not r.overdue(second, now=1e6)  # its program is no longer new
    # By default a first call never waits behind a worse-ranked hold.
    assert ResidencyConfig().first_call_bound_s == 0.0
