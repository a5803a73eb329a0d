"""KV residency (autellix-kv) inside vLLM's real Scheduler, without a model.

vLLM's own block pool and prefix cache run here: a hold is a real reference on
real cached blocks, and a hit is vLLM's own prefix-cache lookup.
"""

import dataclasses

import pytest

pytest.importorskip("vllm")

from autellix_vllm.engine import _vllm_adapter as adapter  # noqa: E402
from autellix_vllm.engine import model_free  # noqa: E402

BLOCK_SIZE = 16  # as the harness (tests/engine/conftest.py)

KV_AWARE = {"AUTELLIX_POLICY": "autellix"}


def request(request_id, program, prompt, max_tokens):
    return model_free.new_request(
        request_id, prompt, max_tokens, {"autellix_program_id": program},
        arrival_time=0.0, block_size=BLOCK_SIZE,
    )  # fmt: skip


def step_until_finished(harness, scheduler, request_id, limit=200):
    for _ in range(limit):
        if request_id not in scheduler.requests:
            return
        harness.step(scheduler)
    raise AssertionError(f"{request_id} did not finish")


def new_requests(output):
    return {r.req_id: r for r in output.scheduled_new_reqs}


def scenario(harness, policy_env, tier_blocks=0):
    """L decodes for a while; A's first call (6 full blocks) finishes; B, which needs
    23 of the 29 usable blocks, arrives; then A's second call, extending A's prompt.
    ``tier_blocks``: a host tier of that many blocks (what ``host_tier_blocks``
    reads off vLLM's offloading config, a GPU feature).
    Returns (scheduler, whether B was admitted at once, A2's prefix hit in tokens)."""
    scheduler = harness.scheduler(max_num_seqs=4, num_blocks=30, **policy_env)
    if tier_blocks:
        scheduler.residency.rules.tier_blocks = tier_blocks
    a_prompt = [21] * 96
    scheduler.add_request(request("L", "L", [31] * 32, max_tokens=60))
    scheduler.add_request(request("A1", "A", a_prompt, max_tokens=1))
    step_until_finished(harness, scheduler, "A1")
    scheduler.add_request(request("B1", "B", [41] * 352, max_tokens=2))
    b_admitted = "B1" in new_requests(harness.step(scheduler))
    scheduler.add_request(request("A2", "A", a_prompt + [11] + [22] * 15, max_tokens=2))
    hit = None
    while hit is None:
        admitted = new_requests(harness.step(scheduler))
        if "A2" in admitted:
            hit = admitted["A2"].num_computed_tokens
    harness.run_until_idle(scheduler)
    return scheduler, b_admitted, hit


def test_a_held_context_is_not_evicted_and_its_next_call_hits_it(harness):
    scheduler, b_admitted, hit = scenario(harness, KV_AWARE)
    assert not b_admitted  # outside the working set while L runs and A is held
    assert hit == 96  # A's six full blocks, kept by the hold
    residency = scheduler.autellix_snapshot()["residency"]
    assert residency["holds_granted"] >= 2 and residency["holds_taken"] >= 1
    # Every block is either free or held by an idle program: none leaked.
    free = adapter.free_kv_blocks(scheduler)
    assert free + residency["held_blocks"] == adapter.total_kv_blocks(scheduler) - 1


@pytest.mark.parametrize(("tier_blocks", "aside"), [(1000, True), (8, False)])
def test_the_rules_step_aside_while_a_host_tier_keeps_every_live_context(
    harness, tier_blocks, aside
):
    """L's and A's contexts take 10 blocks: a tier of 1,000 keeps them (B goes in at
    once, nothing is held), one of 8 does not (the rules apply as without a tier)."""
    scheduler, b_admitted, hit = scenario(harness, KV_AWARE, tier_blocks)
    residency = scheduler.autellix_snapshot()["residency"]
    assert b_admitted == aside
    assert (residency["holds_granted"] == 0) == aside
    assert (hit == 96) != aside


def test_without_residency_the_big_call_evicts_the_idle_context(harness):
    scheduler, b_admitted, hit = scenario(harness, {"AUTELLIX_POLICY": "plas-atlas"})
    assert b_admitted
    assert hit < 96
    assert "residency" not in scheduler.autellix_snapshot()


@pytest.mark.parametrize("policy", ["lru-priority", "mori", "thunderagent"])
def test_a_soft_peer_hold_gives_way_to_the_big_call(harness, policy):
    """The peers that keep an idle context only as an eviction order: B takes A's
    held blocks at once, and A's next call recomputes what B evicted."""
    scheduler, b_admitted, hit = scenario(harness, {"AUTELLIX_POLICY": policy})
    residency = scheduler.autellix_snapshot()["residency"]
    assert b_admitted and hit < 96
    assert residency["holds_granted"] >= 1 and residency["holds_broken"] >= 1


def test_a_continuum_pin_keeps_the_big_call_out_until_it_expires(harness):
    scheduler, b_admitted, hit = scenario(harness, {"AUTELLIX_POLICY": "continuum"})
    assert not b_admitted  # A's context is pinned for its TTL; new calls wait
    assert hit == 96


def test_ending_a_program_or_its_hold_expiring_frees_its_blocks(harness):
    scheduler = harness.scheduler(max_num_seqs=4, num_blocks=30, **KV_AWARE)
    usable = adapter.total_kv_blocks(scheduler) - 1
    scheduler.add_request(request("A1", "A", [21] * 96, max_tokens=1))
    step_until_finished(harness, scheduler, "A1")
    assert adapter.free_kv_blocks(scheduler) == usable - 6
    assert scheduler.autellix_end_program("A")
    assert adapter.free_kv_blocks(scheduler) == usable
    # A hold of no time at all expires before the next step.
    rules = scheduler.residency.rules
    rules.config = dataclasses.replace(rules.config, min_ttl_s=0.0, max_ttl_s=0.0)
    scheduler.add_request(request("C1", "C", [23] * 64, max_tokens=1))
    step_until_finished(harness, scheduler, "C1")
    assert scheduler.autellix_snapshot()["residency"]["held_programs"] == 1
    harness.step(scheduler)
    assert scheduler.autellix_snapshot()["residency"]["holds_expired"] == 1
    assert adapter.free_kv_blocks(scheduler) == usable


def test_a_failing_residency_hook_costs_only_the_hold(harness, monkeypatch):
    scheduler = harness.scheduler(max_num_seqs=4, num_blocks=30, **KV_AWARE)

    def broken(*args):
        raise RuntimeError("block pool moved")

    monkeypatch.setattr(adapter, "cached_blocks", broken)
    scheduler.add_request(request("A1", "A", [21] * 96, max_tokens=3))
    step_until_finished(harness, scheduler, "A1")
    snapshot = scheduler.autellix_snapshot()
    assert snapshot["calls_finished"] == 1
    assert snapshot["residency"]["held_programs"] == 0
    assert snapshot["hook_failures"]["residency finishing"] == 1


class Clock:
    """Stands in for the ``time`` module of engine/block_holds.py: the holds' clock."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.mark.parametrize("hint_s", [None, 58.0], ids=["estimate", "client-hint"])
def test_a_retention_hint_longer_than_the_estimate_keeps_the_hold(harness, monkeypatch, hint_s):
    """The client's TTL (``autellix_retention_ttl_s``, what the middleware writes from
    ``X-Autellix-Retention-Ttl``) replaces the estimate: 52 s into a tool call the
    estimated hold (24 expected gaps of the 2 s prior: 48 s) has expired, the
    hinted one (58 s) still holds the context, and the next call hits all of it."""
    from autellix_vllm.engine import block_holds

    clock = Clock(1000.0)
    monkeypatch.setattr(block_holds, "time", clock)
    scheduler = harness.scheduler(max_num_seqs=4, num_blocks=30, **KV_AWARE)
    core = scheduler.residency.rules.config
    assert core.ttl_gaps * core.prior_gap_s < 52 < 58 <= core.max_ttl_s
    xargs = {"autellix_program_id": "A"}
    if hint_s is not None:
        xargs["autellix_retention_ttl_s"] = hint_s
    prompt = [21] * 96
    first = model_free.new_request("A1", prompt, 1, xargs, arrival_time=0.0, block_size=BLOCK_SIZE)
    scheduler.add_request(first)
    step_until_finished(harness, scheduler, "A1")
    assert scheduler.autellix_snapshot()["residency"]["held_programs"] == 1

    clock.now += 52  # the tool call
    harness.step(scheduler)
    residency = scheduler.autellix_snapshot()["residency"]
    assert residency["holds_expired"] == (0 if hint_s else 1)
    assert residency["held_programs"] == (1 if hint_s else 0)

    if hint_s:  # the next call finds its context held, whatever arrived meanwhile
        scheduler.add_request(request("B1", "B", [41] * 256, max_tokens=1))
        step_until_finished(harness, scheduler, "B1")
        scheduler.add_request(request("A2", "A", prompt + [11] * 16, max_tokens=1))
        admitted = {}
        while "A2" not in admitted:
            admitted = new_requests(harness.step(scheduler))
        assert admitted["A2"].num_computed_tokens == 96
        clock.now += hint_s  # and a hold past the hint expires as any other
        harness.run_until_idle(scheduler)
        harness.step(scheduler)
        assert scheduler.autellix_snapshot()["residency"]["held_programs"] == 0


@pytest.mark.parametrize(
    ("policy", "victim"),
    [("autellix", "short"), ("plas-atlas", "long")],
)
def test_kv_pressure_preempts_the_cheapest_call_of_the_worst_level(harness, policy, victim):
    """Two running calls of one level run out of KV blocks: vLLM's own victim is the
    core's under autellix (the short context: fewest tokens to recompute), and
    the latest arrival of the worst level under plas-atlas (here the long context)."""
    scheduler = harness.scheduler(
        max_num_seqs=4, num_blocks=10, AUTELLIX_LEVELS="0,4,8", AUTELLIX_POLICY=policy
    )
    scheduler.add_request(harness.request("short", program="S", prompt_len=24, max_tokens=40))
    scheduler.add_request(harness.request("long", program="L", prompt_len=100, max_tokens=40))
    for _ in range(20):
        calls = dict(scheduler.calls)
        output = harness.step(scheduler)
        if output.preempted_req_ids:
            break
    assert output.preempted_req_ids == {victim}
    assert scheduler.autellix_snapshot()["kv_preemptions"] == 1  # vLLM's own
    short, long = scheduler.requests["short"], scheduler.requests["long"]
    assert calls["short"].level == calls["long"].level == 2  # the same, worst level
    assert short.arrival_time < long.arrival_time
    assert adapter.computed_tokens(scheduler.requests[victim]) == 0  # recomputes on resume
    harness.run_until_idle(scheduler)
    assert short.num_output_tokens == long.num_output_tokens == 40


def test_a_held_program_s_next_call_does_not_preempt_for_blocks_it_holds(harness):
    """A's context is held (referenced, so not free); A's next call, a better level
    than the running R, needs all its blocks in the worst case but only two beyond
    the six it hits. Four are free: it is admitted beside R, which keeps running."""
    scheduler = harness.scheduler(
        max_num_seqs=4, num_blocks=30, AUTELLIX_LEVELS="0,16,32", **KV_AWARE
    )
    a_prompt = [21] * 96
    scheduler.add_request(request("A1", "A", a_prompt, max_tokens=1))
    step_until_finished(harness, scheduler, "A1")
    scheduler.add_request(request("R", "R", [31] * 280, max_tokens=60))
    for _ in range(12):
        harness.step(scheduler)
    a2 = request("A2", "A", a_prompt + [11] + [22] * 15, max_tokens=2)
    scheduler.add_request(a2)
    assert scheduler.calls["A2"].level < scheduler.calls["R"].level
    free = adapter.free_kv_blocks(scheduler)
    need = adapter.kv_blocks_needed(scheduler, a2)
    assert need - 6 <= free < need  # blocked only if its held blocks were new ones
    output = harness.step(scheduler)
    assert not output.preempted_req_ids
    assert new_requests(output)["A2"].num_computed_tokens == 96
    assert scheduler.autellix_snapshot()["waiter_preemptions"]["kv_blocks"] == 0
    harness.run_until_idle(scheduler)
    assert scheduler.autellix_snapshot()["preemptions"] == 0


def test_kv_pressure_breaks_a_hold_of_the_running_call_s_own_level_before_preempting(harness):
    """H's idle context is held at the worst level; R, of that level too, grows until
    the blocks run out. The hold gives way: R is not preempted (it would be
    recomputed in full, while H's next call may never come within the hold)."""
    scheduler = harness.scheduler(
        max_num_seqs=4, num_blocks=10, AUTELLIX_LEVELS="0,4,8", **KV_AWARE
    )
    scheduler.add_request(request("H1", "H", [21] * 48, max_tokens=10))
    step_until_finished(harness, scheduler, "H1")
    assert scheduler.autellix_snapshot()["residency"]["held_programs"] == 1
    scheduler.add_request(request("R", "R", [31] * 40, max_tokens=80))
    preempted = set()
    for _ in range(200):
        if "R" not in scheduler.requests:
            break
        calls = dict(scheduler.calls)
        preempted |= harness.step(scheduler).preempted_req_ids
    assert calls["R"].level == 2
    assert scheduler.core.program_level(calls["R"].program) == 2
    assert not preempted
    assert scheduler.autellix_snapshot()["residency"]["holds_broken"] == 1


def test_a_hold_ranks_with_the_service_of_the_call_that_just_finished(harness):
    """H's only call (48 prompt tokens, 10 out) takes H to the worst level; its hold
    is of that level, not of the level H had before the call was charged."""
    scheduler = harness.scheduler(
        max_num_seqs=4, num_blocks=30, AUTELLIX_LEVELS="0,4,8", **KV_AWARE
    )
    scheduler.add_request(request("H1", "H", [21] * 48, max_tokens=10))
    step_until_finished(harness, scheduler, "H1")
    (hold,) = scheduler.residency.rules.holds.values()
    assert hold.level == scheduler.core.program_level(hold.program) == 2


def test_with_a_host_kv_tier_an_idle_context_is_held_as_long_as_without(harness, monkeypatch):
    """vLLM's host tier may drop a context before its program is back, so the hold
    lasts ttl_gaps expected gaps (48 s for the 2 s prior) with the tier too, as in
    the simulator; only a preempted call's undo cost is a reload's."""
    from autellix_vllm.engine import block_holds

    clock = Clock(1000.0)
    monkeypatch.setattr(block_holds, "time", clock)
    scheduler = harness.scheduler(max_num_seqs=4, num_blocks=30, **KV_AWARE)
    config = scheduler.residency.rules.config
    assert config.ttl_gaps * config.prior_gap_s == 48.0
    assert not scheduler.residency.reloadable  # the harness's engine has no host tier
    scheduler.residency.reloadable = True
    scheduler.add_request(request("A1", "A", [21] * 96, max_tokens=1))
    step_until_finished(harness, scheduler, "A1")
    for seconds, expired in ((47, 0), (2, 1)):
        clock.now += seconds
        harness.step(scheduler)
        assert scheduler.autellix_snapshot()["residency"]["holds_expired"] == expired
