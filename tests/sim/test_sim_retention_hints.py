"""Client retention hints in the simulator (``simulate(retention_hints=True)``): what a
client that knows its tools' times sends with each call, and the holds it buys."""

import math
from dataclasses import replace

import pytest
from autellix_vllm.policy import PolicyConfig
from autellix_vllm.policy.config import ResidencyConfig
from autellix_vllm.sim import CallSpec, ProgramSpec, generate, simulate
from autellix_vllm.sim.presets import PRESETS, EnginePreset
from autellix_vllm.sim.run import retention_hints_of


def test_a_hint_is_the_gap_to_the_contexts_next_call_or_zero_when_it_is_done():
    """A main thread that forks a subagent, and two threads that share one context."""
    forked = ProgramSpec("F", 0.0, (
        CallSpec("m0", 1, 100),
        CallSpec("s0", 1, 50, thread="sub", parent_thread="main", after=("m0",), tool_gap=0.5,
                 context="sub"),
        CallSpec("s1", 1, 60, thread="sub", parent_thread="main", after=("s0",), tool_gap=7.0,
                 context="sub"),
        CallSpec("m1", 1, 200, after=("s1",), tool_gap=3.0),
    ))  # fmt: skip
    assert retention_hints_of(forked) == {
        "m0": None,  # main comes back after the subagent, whose time the client cannot know
        "s0": 7.0,  # the subagent's tool, before its next call
        "s1": 0.0,  # the subagent is done
        "m1": 0.0,  # the program is done
    }
    shared = ProgramSpec("S", 0.0, (
        CallSpec("a", 1, 100),
        CallSpec("b", 1, 200, thread="t1", parent_thread="main", after=("a",), tool_gap=5.0),
        CallSpec("c", 1, 200, thread="t2", parent_thread="main", after=("a",), tool_gap=3.0),
    ))  # fmt: skip
    # After a, the context is back at the first of its two next calls; after b or c,
    # the other may still come, so neither is the context's end.
    assert retention_hints_of(shared) == {"a": 3.0, "b": None, "c": None}


def _tight(kv_blocks: int) -> EnginePreset:
    """a100-llama8b-kv with KV for ``kv_blocks`` blocks of 16 tokens."""
    return replace(PRESETS["a100-llama8b-kv"], name="tight", kv_blocks=kv_blocks)


@pytest.mark.parametrize("hints", [False, True], ids=["estimate", "client-hints"])
def test_a_hint_longer_than_the_estimate_keeps_the_context_through_the_tool(hints):
    """A's tool takes 20 s, longer than the estimated hold (set here to 4 gaps of
    the 2 s prior: 8 s). B arrives at 10 s, while R keeps the engine busy, and needs
    A's blocks: with the estimate A's hold has expired and B evicts A's context, so
    A's next call prefills all of it again; with the hint A is still held, B waits
    (the working set), and A's next call hits its 4,000 cached tokens."""
    preset = _tight(kv_blocks=1000)  # 16,000 tokens
    # No starvation promotion, and B's first call does not take A's held blocks as a
    # new program's may (first_call_bound_s): B waits, breaks nothing.
    config = PolicyConfig(
        beta=1e9, residency=ResidencyConfig(ttl_gaps=4.0, first_call_bound_s=math.inf)
    )
    estimate = config.residency.ttl_gaps * config.residency.prior_gap_s
    assert estimate < 10 < 20 <= config.residency.max_ttl_s
    a = ProgramSpec("A", 0.0, (
        CallSpec("a1", 1, 4000), CallSpec("a2", 1, 4100, after=("a1",), tool_gap=20.0),
    ))  # fmt: skip
    r = ProgramSpec("R", 0.0, (CallSpec("r1", 3000, 16),))  # decodes for ~27 s
    b = ProgramSpec("B", 10.0, (CallSpec("b1", 1, 11_000),))
    metrics = simulate(
        [a, r, b], "autellix", preset=preset, config=config, retention_hints=hints
    ).metrics

    hit_tokens = metrics["prefix_hit_rate"] * (4000 + 16 + 11_000 + 4100)
    assert hit_tokens == pytest.approx(4000 if hints else 0)
    assert metrics["holds_taken"] == (1 if hints else 0)  # a2 took a1's hold
    assert metrics["holds_expired"] == (0 if hints else 1)


def test_hints_change_only_kv_aware_runs_and_off_is_the_default():
    """Off (the default) is the run without hints; hints change holds, so only a
    KV-aware policy's results, which they do change on the agent workload."""
    programs = generate("agent", 12, rate=0.05, seed=3, max_context=16_000)
    run = {"preset": _tight(kv_blocks=3000), "max_num_seqs": 8}  # about three sessions

    def metrics(policy: str, **hints: bool) -> dict:
        out = simulate(programs, policy, **run, **hints).metrics
        out.pop("sim_seconds")
        return out

    kv_default = metrics("autellix")
    assert kv_default == metrics("autellix", retention_hints=False)
    assert kv_default != metrics("autellix", retention_hints=True)
    for policy in ("vllm-opt", "plas-atlas"):
        assert metrics(policy) == metrics(policy, retention_hints=True)
