"""Priority bands with aging, and the fair share of service between owners."""

import pytest
from autellix_vllm.policy import (
    Autellix,
    Levels,
    PolicyConfig,
    ProgramScheduler,
    TenantConfig,
)
from autellix_vllm.protocol.identity import (
    CallIdentity,
    IdentityError,
    read_identity,
)
from autellix_vllm.protocol.trust import accepted

LEVELS = Levels(boundaries=(0.0, 10.0, 100.0, 1000.0))


def make(**tenants):
    config = PolicyConfig(levels=LEVELS, tenants=TenantConfig(**tenants))
    return ProgramScheduler(Autellix(), config, seats=1)


def arrive(core, program, call_id, now=0.0, owner=None, priority=None, router_wait_s=None):
    identity = CallIdentity(
        program, call_id=call_id, owner=owner, priority=priority, router_wait_s=router_wait_s
    )
    call = core.add_call(identity, now_s=now)
    core.enqueue(call)
    return call


def serve(core, call, tokens, now=0.0):
    """Run an arrived (waiting) call for ``tokens`` decode steps and complete it."""
    core.start(call)
    core.charge(call, decode_tokens=tokens)
    core.finish(call, now_s=now)


def order(core):
    return [call.call_id for call in core.waiting]


def test_a_better_band_goes_first_whatever_the_service():
    core = make()
    long_program = arrive(core, "long", "l0")
    serve(core, long_program, 500)
    batch = arrive(core, "fresh-batch", "b1", priority=1)  # no service at all
    interactive = arrive(core, "long", "l1")  # a level behind it
    assert interactive.level > batch.level
    assert order(core) == ["l1", "b1"]
    assert core.peek() is interactive
    assert core.rank(interactive) < core.rank(batch)


def test_a_better_band_preempts_a_worse_one_and_never_the_reverse():
    core = make()
    batch = arrive(core, "batch", "b1", priority=1)
    core.start(batch)
    core.charge(batch, decode_tokens=5)  # pays for its (empty) prompt: displaceable
    interactive = arrive(core, "chat", "i1")
    assert core.outranks(interactive, batch)
    assert core.victims([batch], free_seats=0) == [batch]
    assert not core.outranks(batch, interactive)


def test_a_worse_bands_call_ranks_as_band_zero_after_the_aging_bound():
    core = make(band_aging_s=30.0)
    batch = arrive(core, "batch", "b1", now=0.0, priority=1)
    core.advance(now_s=29.0)
    arrive(core, "chat", "i1", now=29.0)
    assert order(core) == ["i1", "b1"]
    assert core.next_band_aging() == 30.0
    core.advance(now_s=30.0)
    assert batch.band == 0
    assert core.next_band_aging() is None
    # Now in band 0 it ranks as any band-0 call: the same level, and it came first.
    assert order(core) == ["b1", "i1"]


def test_a_wait_at_the_routers_gate_counts_towards_the_aging_bound():
    """The router held the call 20 s (it states so): the engine ages it 10 s
    after it arrived here, 30 s after it reached the router."""
    core = make(band_aging_s=30.0)
    held = arrive(core, "batch", "b1", now=100.0, priority=1, router_wait_s=20.0)
    assert held.band == 1 and held.ages_at == 110.0
    assert core.next_band_aging() == 110.0
    core.advance(now_s=109.0)
    arrive(core, "chat", "i1", now=109.0)
    assert order(core) == ["i1", "b1"]
    core.advance(now_s=110.0)
    assert held.band == 0
    assert order(core) == ["b1", "i1"]


def test_a_router_wait_past_the_bound_ages_the_call_on_arrival_never_before():
    core = make(band_aging_s=30.0)
    for call_id, wait in [("b1", 30.0), ("b2", 45.0), ("b3", 1e300)]:
        call = arrive(core, "batch-" + call_id, call_id, now=100.0, priority=1, router_wait_s=wait)
        assert (call.band, call.ages_at) == (0, 100.0)
    arrive(core, "chat", "i1", now=100.0)
    assert order(core) == ["b1", "b2", "b3", "i1"]  # band 0 at once, in arrival order
    assert core.next_band_aging() is None


def test_a_router_wait_leaves_band_zero_and_unheld_calls_as_they_were():
    core = make(band_aging_s=30.0)
    interactive = arrive(core, "chat", "i1", now=5.0, router_wait_s=20.0)
    assert (interactive.band, interactive.ages_at) == (0, None)
    not_held = arrive(core, "batch", "b1", now=5.0, priority=1)
    assert not_held.ages_at == 35.0
    assert core.next_band_aging() == 35.0


def test_the_aging_rule_counts_from_the_router():
    tenants = TenantConfig(band_aging_s=120.0)
    assert tenants.band_aged_at(10.0) == 130.0
    assert tenants.band_aged_at(10.0, 0.0) == 130.0
    assert tenants.band_aged_at(10.0, 50.0) == 80.0
    assert tenants.band_aged_at(10.0, 500.0) == 10.0  # never before it arrived


def test_the_router_wait_travels_as_a_header_and_is_router_stated():
    assert read_identity([("X-Autellix-Router-Wait", "2.5")]).router_wait_s == 2.5
    assert read_identity(xargs={"autellix_router_wait_s": 3}).router_wait_s == 3.0
    assert CallIdentity(router_wait_s=1.5).as_headers() == {"X-Autellix-Router-Wait": "1.5"}
    assert CallIdentity(router_wait_s=1.5).as_xargs() == {"autellix_router_wait_s": 1.5}
    for bad in ("-1", "nan", "inf", "1e999", "slow", ""):
        with pytest.raises(IdentityError) as error:
            read_identity([("X-Autellix-Router-Wait", bad)])
        assert error.value.param == "X-Autellix-Router-Wait"
    for bad_body in (-1, True, "soon", [1]):
        with pytest.raises(IdentityError) as error:
            read_identity(xargs={"autellix_router_wait_s": bad_body})
        assert error.value.param == "vllm_xargs.autellix_router_wait_s"
    assert accepted(CallIdentity("p", router_wait_s=9.0), may_state=False).router_wait_s is None


def test_owners_take_turns_by_attained_service_inside_a_band():
    core = make()
    serve(core, arrive(core, "b-prog", "b0", owner="b"), 10)
    serve(core, arrive(core, "a-prog", "a1", owner="a"), 50)
    arrive(core, "b-prog", "b1", owner="b")
    arrive(core, "a-prog", "a2", owner="a")
    assert order(core) == ["b1", "a2"]
    serve(core, core.pop(), 100)  # b is ahead now: a's waiting call goes first
    arrive(core, "b-prog", "b2", owner="b")
    assert order(core) == ["a2", "b2"]


def test_an_owner_splitting_its_agent_into_programs_gains_nothing():
    """Owner b sends every call as a new program (each at level 0, no program
    service); owner a's one program has attained more, but b has attained more
    in all: a goes first."""
    core = make()
    for i in range(6):
        serve(core, arrive(core, f"b-{i}", f"b{i}", owner="b"), 10)
    serve(core, arrive(core, "a-agent", "a0", owner="a"), 40)
    agent_call = arrive(core, "a-agent", "a1", owner="a")
    split_call = arrive(core, "b-new", "b-new", owner="b")
    assert split_call.level < agent_call.level
    assert order(core) == ["a1", "b-new"]


def test_weights_scale_an_owners_share():
    core = make(weights={"a": 4.0})
    serve(core, arrive(core, "a-prog", "a0", owner="a"), 40)  # share 10
    serve(core, arrive(core, "b-prog", "b0", owner="b"), 20)  # share 20
    arrive(core, "a-prog", "a1", owner="a")
    arrive(core, "b-prog", "b1", owner="b")
    assert order(core) == ["a1", "b1"]
    with pytest.raises(ValueError):
        TenantConfig(weights={"a": 0.0})
    with pytest.raises(ValueError):
        TenantConfig(band_aging_s=0.0)


def test_a_stated_weight_scales_an_owners_share_over_the_configured_one():
    """The router states each key's weight with its calls (``CallIdentity.weight``)."""
    core = make(weights={"a": 0.5})
    heavy = core.add_call(CallIdentity("a-prog", call_id="a0", owner="a", weight=4.0), now_s=0)
    core.enqueue(heavy)
    serve(core, heavy, 40)  # share 10, by the stated weight
    serve(core, arrive(core, "b-prog", "b0", owner="b"), 20)  # share 20
    arrive(core, "a-prog", "a1", owner="a")  # states none: the last stated one holds
    arrive(core, "b-prog", "b1", owner="b")
    assert order(core) == ["a1", "b1"]
    assert core.shares.snapshot() == {
        "a": {"share": 10.0, "weight": 4.0},
        "b": {"share": 20.0, "weight": 1.0},
    }
    assert core.snapshot(now_s=0)["owners"] == core.shares.snapshot()


def test_the_weight_travels_as_a_header_and_is_router_stated():
    assert read_identity([("X-Autellix-Weight", "2.5")]).weight == 2.5
    assert read_identity(xargs={"autellix_weight": 3}).weight == 3.0
    assert CallIdentity(weight=2.0).as_headers() == {"X-Autellix-Weight": "2.0"}
    for bad in ("0", "-1", "inf", "heavy"):
        with pytest.raises(IdentityError) as error:
            read_identity([("X-Autellix-Weight", bad)])
        assert error.value.param == "X-Autellix-Weight"
    assert accepted(CallIdentity("p", weight=9.0), may_state=False).weight is None


def test_an_owner_returning_from_idle_gets_no_credit_for_its_absence():
    core = make()
    running = arrive(core, "b-prog", "b0", owner="b")
    core.start(running)
    core.charge(running, decode_tokens=1000)
    arrive(core, "a-prog", "a0", owner="a")  # a has no service; b is in flight
    assert core.shares.share("a") == core.shares.share("b") == 1000


def test_one_owner_and_one_band_keep_the_policys_order():
    """The same arrivals on a plain core and on one whose calls all name one
    owner and band 0: the same order at every step."""
    plain = ProgramScheduler(Autellix(), PolicyConfig(levels=LEVELS), seats=1)
    owned = make()
    for core, owner in ((plain, None), (owned, "only")):
        for i, tokens in enumerate((50, 5, 500, 20)):
            serve(core, arrive(core, f"p{i % 3}", f"warm{i}", owner=owner), tokens)
        for i in range(8):
            arrive(core, f"p{i % 4}", f"c{i}", owner=owner, priority=0 if owner else None)
    assert order(plain) == order(owned)
    assert [c.call_id for c in plain.waiting.best(5)] == [c.call_id for c in owned.waiting.best(5)]


def test_the_band_travels_as_a_header_or_a_class_name_and_is_router_stated():
    identity = read_identity([("X-Autellix-Priority", "batch")])
    assert identity.priority == 1
    assert read_identity(xargs={"autellix_priority": 3}).priority == 3
    assert read_identity([("X-Autellix-Priority", "interactive")]).priority == 0
    assert CallIdentity(priority=2).as_headers() == {"X-Autellix-Priority": "2"}
    for bad in ("urgent", "-1", "10", "1.5"):
        with pytest.raises(IdentityError) as error:
            read_identity([("X-Autellix-Priority", bad)])
        assert error.value.param == "X-Autellix-Priority"
    # A client cannot state its band: a hop that may not state router fields drops it.
    assert accepted(CallIdentity("p", priority=0), may_state=False).priority is None
    assert accepted(CallIdentity("p", priority=1), may_state=True).priority == 1


def test_a_program_stands_in_its_latest_calls_band():
    core = make()
    serve(core, arrive(core, "agent", "a0", owner="a"), 5)
    assert arrive(core, "agent", "a1", owner="a", priority=1).band == 1
    assert core.table.get("agent").band == 1
    assert core.snapshot(now_s=0, program_ids=["agent"])["programs"][0]["band"] == 1


def test_an_owner_may_have_a_band_of_its_own_that_a_stated_band_overrides():
    core = make(bands={"nightly": 1})
    assert arrive(core, "n1", "n1", owner="nightly").band == 1
    assert arrive(core, "n2", "n2", owner="nightly", priority=0).band == 0
    assert arrive(core, "o1", "o1", owner="other").band == 0
    with pytest.raises(ValueError):
        TenantConfig(bands={"nightly": -1})


def test_a_better_band_displaces_a_worse_bands_call_before_it_paid_for_its_prompt():
    core = make()
    batch = core.add_call(
        CallIdentity("batch", call_id="b1", priority=1), now_s=0.0, prompt_tokens=900
    )
    core.enqueue(batch)
    core.start(batch)
    core.charge(batch, decode_tokens=1)  # far from paying for its 900-token prompt
    same_band = arrive(core, "other-batch", "b2", priority=1)
    assert core.victims([batch], free_seats=0) == []  # one band: the policy's rules
    core.remove(same_band)
    arrive(core, "chat", "i1")
    assert core.victims([batch], free_seats=0) == [batch]


def test_a_worse_bands_program_stands_behind_every_level_of_a_better_band():
    """Holds of idle contexts and vLLM's own priority compare standings."""
    core = make()
    serve(core, arrive(core, "long", "l0"), 5000)  # the last level
    batch = arrive(core, "batch", "b0", priority=1)  # no service: level 0
    long_program = core.table.get("long")
    assert core.program_level(long_program) == len(LEVELS) - 1
    assert core.program_level(batch.program) == len(LEVELS)
    assert core.standing(batch) == len(LEVELS) + batch.level
    interactive = arrive(core, "long", "l1")
    assert core.standing(interactive) == interactive.level  # one band: the level
