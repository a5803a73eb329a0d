"""Hints cannot buy more than a fair share: holds past an owner's share of the
hold budget last no longer than the engine's own estimate while other owners wait."""

from dataclasses import replace

from autellix_vllm.policy import Autellix, PolicyConfig, Program, ProgramScheduler
from autellix_vllm.policy.config import ResidencyConfig
from autellix_vllm.policy.queue import WaitQueue
from autellix_vllm.policy.residency import Residency
from autellix_vllm.protocol.identity import ANONYMOUS_OWNER, CallIdentity

# Budget 50 of 100 blocks, headroom 10; the engine's own hold: 4 gaps of 2 s = 8 s.
CONFIG = ResidencyConfig(hold_share=0.5, headroom=0.1, prior_gap_s=2.0, prior_weight=2.0,
                         ttl_gaps=4.0, min_ttl_s=1.0, max_ttl_s=60.0)  # fmt: skip
OWN_S = 8.0


def program(name: str, owner: str) -> Program:
    return Program(name, owner=owner)


def residency(waiting: set[str], config: ResidencyConfig = CONFIG) -> Residency:
    return Residency(config, 100, level_of=lambda p: 0, waiting_owners=lambda: waiting)


def test_the_share_divides_the_budget_among_owners_holding_or_waiting():
    waiting: set[str] = set()
    r = residency(waiting)
    assert r.fair_share("a") == 50
    r.hold("a1", program("a1", "a"), 10, now=0.0)
    waiting.update({"b", "c"})
    assert r.fair_share("a") == 50 // 3


def test_past_its_share_while_others_wait_a_claim_lasts_the_engines_own_estimate():
    waiting: set[str] = set()
    r = residency(waiting)
    r.hold("g1", program("g1", "greedy"), 20, now=0.0, hint_s=60.0)  # nobody waits: claimed
    waiting.add("other")  # share now 25 blocks each
    r.hold("g2", program("g2", "greedy"), 20, now=0.0, hint_s=60.0)  # 40 > 25: cut
    r.hold("o1", program("o1", "other"), 10, now=0.0, hint_s=60.0)  # within its share
    assert r.expired(OWN_S) == ["g2"]
    assert set(r.holds) == {"g1", "o1"}
    assert r.counters()["holds_cut"] == 1


def test_a_hint_may_always_shorten_a_hold():
    r = residency({"other"})
    r.hold("g1", program("g1", "greedy"), 40, now=0.0, hint_s=2.0)
    assert r.expired(1.9) == [] and r.expired(2.0) == ["g1"]
    assert r.counters()["holds_cut"] == 0


def test_a_call_waiting_for_kv_cuts_other_owners_claims_past_their_share():
    waiting: set[str] = set()
    r = residency(waiting)
    for name in ("g1", "g2", "g3"):  # 45 of 50 blocks, each claimed for 60 s
        r.hold(name, program(name, "greedy"), 15, now=0.0, hint_s=60.0)
    waiting.add("other")  # share 25: greedy is 20 past it
    # A call that would wait all the same (60 blocks) cuts nothing.
    assert r.cut_for("other", 1.0, context_blocks=60, reclaimable_blocks=30) == 0
    # One that two cut holds let in (30 + 30 - 10 headroom >= 40) cuts those two.
    assert r.cut_for("other", 1.0, context_blocks=40, reclaimable_blocks=30) == 2
    assert sorted(r.expired(OWN_S)) == ["g1", "g2"]  # equal claims: the oldest first
    assert set(r.holds) == {"g3"}


def test_holds_by_the_engines_own_estimate_are_never_cut():
    """Only what a hint buys is shared: no hint, nothing to cut."""
    waiting: set[str] = set()
    r = residency(waiting)
    r.hold("h1", program("h1", "honest"), 45, now=0.0)
    waiting.add("other")
    assert r.cut_for("other", 1.0, context_blocks=40, reclaimable_blocks=30) == 0


def test_a_hold_whose_call_waits_is_not_cut():
    waiting: set[str] = set()
    r = residency(waiting)
    r.hold("g1", program("g1", "greedy"), 45, now=0.0, hint_s=60.0)
    r.waiting("g1", "g1", 45)
    waiting.add("other")
    assert r.cut_for("other", 1.0, context_blocks=40, reclaimable_blocks=30) == 0


def test_without_the_fair_share_claims_hold_by_rank_alone():
    r = residency({"other"}, replace(CONFIG, fair_share=False))
    r.hold("g1", program("g1", "greedy"), 45, now=0.0, hint_s=60.0)
    assert r.cut_for("other", 1.0, context_blocks=40, reclaimable_blocks=30) == 0
    assert r.expired(OWN_S) == []


def test_one_owner_alone_uses_what_is_free():
    r = residency({"greedy"})  # only its own calls wait
    r.hold("g1", program("g1", "greedy"), 45, now=0.0, hint_s=60.0)
    assert r.expired(59.0) == [] and r.expired(60.0) == ["g1"]


def test_a_hint_never_raises_a_rank():
    def rank(hint_s: float | None) -> tuple[float, ...]:
        core = ProgramScheduler(Autellix(), PolicyConfig())
        core.add_call(CallIdentity("first", call_id="c1", owner="a"), 0.0)
        call = core.add_call(
            CallIdentity("p", call_id="c1", owner="b", retention_ttl_s=hint_s), 1.0
        )
        return core.rank(call)

    assert rank(60.0) == rank(None) == rank(0.0)


def test_the_program_belongs_to_its_first_calls_owner_or_the_anonymous_one():
    core = ProgramScheduler(Autellix(), PolicyConfig())
    assert core.add_call(CallIdentity("p", call_id="c1", owner="a"), 0.0).program.owner == "a"
    assert core.add_call(CallIdentity("q", call_id="c1"), 0.0).program.owner == ANONYMOUS_OWNER


def test_the_wait_queue_counts_its_owners():
    core = ProgramScheduler(Autellix(), PolicyConfig())
    queue = WaitQueue()
    a1, a2, b1 = (
        core.add_call(CallIdentity(pid, call_id="c", owner=owner), 0.0)
        for pid, owner in (("a1", "a"), ("a2", "a"), ("b1", "b"))
    )
    for call in (a1, a2, b1):
        queue.push(call, core.rank(call))
    assert set(queue.owners()) == {"a", "b"}
    queue.remove(b1)
    queue.pop()
    assert set(queue.owners()) == {"a"}
    queue.pop()
    assert not queue.owners()
