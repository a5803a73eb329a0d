"""The peers as policies: each one's defining behaviour (policy.retention, policy.policies)."""

import math

import pytest
from autellix_vllm.policy import PolicyConfig, Program, ProgramScheduler, make_policy
from autellix_vllm.policy.config import ResidencyConfig
from autellix_vllm.policy.policies import PEER_POLICIES, POLICIES
from autellix_vllm.policy.residency import Residency
from autellix_vllm.policy.retention import ContinuumTTL, ThunderAgentPause
from autellix_vllm.protocol.identity import CallIdentity

CONFIG = ResidencyConfig(prior_gap_s=2.0, prior_weight=2.0, max_ttl_s=60.0)


def program(name: str, gaps: tuple[float, ...] = ()) -> Program:
    p = Program(name)
    p.gaps, p.gap_total_s = len(gaps), sum(gaps)
    return p


def residency(policy: str, capacity: int = 100, **kwargs) -> Residency:
    retention = make_policy(policy).make_retention()
    return Residency(CONFIG, capacity, level_of=lambda p: 0, retention=retention, **kwargs)


def test_every_peer_is_a_kv_aware_fcfs_ordered_policy_without_preemption_for_waiters():
    assert PEER_POLICIES == ("continuum", "thunderagent", "mori", "lru-priority")
    for name in PEER_POLICIES:
        policy = POLICIES[name]()
        assert policy.kv_aware and not policy.uses_levels
        retention = policy.make_retention()
        # Only the default keeps calls outside the working set waiting, steps aside
        # for a host tier and picks its own preemption victims.
        assert not retention.working_set and not retention.steps_aside_for_tier
        assert not retention.cheap_victims
    default = make_policy("autellix").make_retention()
    assert default.working_set and default.steps_aside_for_tier and default.cheap_victims


def test_continuum_ranks_a_programs_calls_by_its_first_arrival():
    core = ProgramScheduler(make_policy("continuum"), PolicyConfig())
    first = core.add_call(CallIdentity("early", call_id="e1"), now_s=0.0)
    core.enqueue(first)
    late = core.add_call(CallIdentity("late", call_id="l1"), now_s=1.0)
    core.enqueue(late)
    core.start(core.peek())
    core.finish(first, now_s=2.0)
    # The early program's second call arrives after the late program's first, yet
    # goes first: program-level FCFS.
    again = core.add_call(CallIdentity("early", call_id="e2"), now_s=3.0)
    core.enqueue(again)
    assert core.peek() is again
    assert not core.policy.outranks(again, late)


def test_continuum_pins_for_the_ttl_its_cost_model_gives_and_not_when_a_tool_outlasts_a_refill():
    r = residency("continuum", kv_fill_s=32.0)
    fast = program("fast", gaps=(2.0, 2.0))  # expected gap 2 s
    # ttl = gap * ln(kv_fill_s / gap) = 2 * ln(16)
    assert ContinuumTTL().ttl_s(r, fast, 10, None) == pytest.approx(2 * math.log(16))
    r.hold("fast", fast, 10, now=0.0)
    assert r.next_expiry() == pytest.approx(2 * math.log(16))
    slow = program("slow", gaps=(40.0,) * 8)  # a tool expected to outlast a refill
    r.hold("slow", slow, 10, now=0.0)
    assert "slow" not in r and r.refused == 1


def test_continuum_pins_keep_new_calls_out_but_give_way_to_running_calls():
    r = residency("continuum", kv_fill_s=32.0)
    r.hold("a", program("a"), 10, now=0.0)
    r.hold("b", program("b"), 10, now=1.0)
    assert r.breakable(0) == []  # a call being admitted waits for the TTL
    assert r.breakable(-1) == ["a", "b"]  # a running call short of blocks: oldest first
    # No budget: pins may take the whole KV, and a new one never displaces another.
    assert r.budget_blocks == 100


def test_soft_retention_is_an_eviction_order_not_a_reservation():
    r = residency("lru-priority")
    r.hold("old", program("old"), 30, now=0.0)
    r.hold("new", program("new"), 30, now=1.0)
    # Any call may take a hold's blocks, the oldest first; admission keeps no reserve.
    assert r.breakable(0) == ["old", "new"]
    assert r.fits(40, reclaimable_blocks=40, largest_resident=30)
    # Holds still expire as the engine's estimate (or a hint) says.
    assert r.next_expiry() == CONFIG.ttl_s(program("old"))
    # A new idle context displaces the oldest when the whole KV is held.
    r.hold("third", program("third"), 50, now=2.0)
    assert "old" not in r and {"new", "third"} <= set(r.holds)


def test_mori_keeps_the_busiest_programs_contexts_and_lets_the_most_idle_go_first():
    r = residency("mori", tier_blocks=1000)
    r.hold("idle-longest", program("idle-longest"), 40, now=0.0)
    r.hold("idle-shortest", program("idle-shortest"), 40, now=5.0)
    assert r.next_expiry() is None  # no time-to-live: kept until displaced
    assert r.expired(now=1e6) == []
    assert r.breakable(0) == ["idle-longest", "idle-shortest"]
    # A context going idle now displaces the one idle longest.
    r.hold("just-idle", program("just-idle"), 40, now=6.0)
    assert set(r.holds) == {"idle-shortest", "just-idle"}
    # The rule never steps aside for a host tier that could keep every context.
    from autellix_vllm.policy.table import ProcessTable

    assert r.engaged(ProcessTable())


def thunderagent_with(programs: dict[str, int], capacity: int = 100) -> Residency:
    """A ThunderAgent engine whose programs are all idle in a tool, holding ``programs``'
    contexts (name -> blocks)."""
    r = residency("thunderagent", capacity=capacity)
    for i, (name, blocks) in enumerate(programs.items()):
        r.waiting(name, name, blocks)
        r.hold(name, program(name), blocks, now=float(i) * 0.01)
    return r


def test_thunderagent_pauses_the_largest_idle_programs_past_095_until_080():
    r = thunderagent_with({"small": 20, "mid": 30, "large": 46})  # 96 of 100 blocks
    rule: ThunderAgentPause = r.retention  # type: ignore[assignment]
    released = r.expired(now=5.0)
    # Above 0.95: pause the largest until the working set is at most 0.80 (50 - 46 = 50).
    assert released == ["large"] and set(rule.paused) == {"large"}
    assert not r.admits(program("large")) and r.admits(program("small"))
    assert r.next_expiry() == 10.0  # the next tick, to resume it


def test_thunderagent_resumes_the_smallest_first_once_below_the_hysteresis_line():
    r = thunderagent_with({"a": 30, "b": 30, "c": 36})
    rule: ThunderAgentPause = r.retention  # type: ignore[assignment]
    r.expired(now=5.0)  # 96 > 95: pause c (36), then 60 <= 80
    assert set(rule.paused) == {"c"}
    assert r.expired(now=6.0) == []  # between ticks nothing changes
    r.release_program("a")  # a program ended: 30 live blocks, 55 of room under 0.85
    r.expired(now=10.0)
    assert rule.paused == {} and rule.resumes == 1


def test_thunderagent_resumes_a_program_paused_too_long_whatever_the_memory():
    r = thunderagent_with({"a": 50, "b": 46})
    rule: ThunderAgentPause = r.retention  # type: ignore[assignment]
    r.expired(now=5.0)
    assert set(rule.paused) == {"a"}
    r.waiting("late", "late", 60)  # the working set stays far above the line
    r.expired(now=10.0)
    assert set(rule.paused) == {"a", "b"}
    r.expired(now=5.0 + ThunderAgentPause.FORCE_RESUME_S)
    assert set(rule.paused) == {"b"} and rule.resumes == 1
