"""Engine fidelity: decode and prefill cost that grow with context, macro steps that
stay exact when they do, and the host-memory KV tier."""

import math
import random
from dataclasses import replace

import pytest
from autellix_vllm.policy import Levels, PolicyConfig, ServiceMeter
from autellix_vllm.sim import CallSpec, ProgramSpec, generate, simulate
from autellix_vllm.sim import presets as sim_presets
from autellix_vllm.sim.engine_model import SimEngine, steps_to_reach
from autellix_vllm.sim.presets import PRESETS

A100 = PRESETS["a100-llama8b"]
A100_KV = PRESETS["a100-llama8b-kv"]


def test_the_kv_preset_is_a100_llama8b_with_the_context_terms_on():
    off = {"per_context_token": 0.0, "per_prefill_pair": 0.0, "exact_macro_steps": False}
    assert replace(A100_KV, name=A100.name, **off) == A100
    assert A100.per_context_token == A100.per_prefill_pair == 0.0
    # 128 KiB per token at 2 TB/s; 0.52 MFLOP per pair at 180 TFLOP/s.
    assert A100_KV.per_context_token == pytest.approx(65.5e-9, rel=1e-3)
    assert A100_KV.per_prefill_pair == pytest.approx(2.91e-9, rel=1e-3)
    # The host tier: GiB into blocks of 16 tokens x 128 KiB; PCIe 4.0 x16.
    assert A100.with_kv_offload_gib(2.0).host_blocks == 2 * 2**30 // (16 * 2**17)
    assert A100.host_seconds_per_token == pytest.approx(2**17 / 25e9)


def test_decode_steps_grow_by_the_context_they_add():
    """One call alone: a prefill step, then decode steps that each read one token more."""
    prompt, decode = 1000, 300
    preset = A100_KV
    program = ProgramSpec("A", 0.0, (CallSpec("a", decode, prompt),))
    metrics = simulate([program], "vllm-opt", preset="a100-llama8b-kv").metrics

    prefill = preset.step_time(0, prompt, 0, prompt * (prompt + 1) // 2)
    # Decode step i (1..decode-1) attends over the prompt and i tokens.
    decodes = sum(preset.step_time(1, 0, prompt + i) for i in range(1, decode))
    assert metrics["makespan"] == pytest.approx(prefill + decodes, rel=1e-12)
    assert metrics["engine_steps"] == decode


@pytest.mark.parametrize(
    ("first", "growth"), [(0.01, 0.0), (0.008, 1e-5), (2.5, 0.3), (1.0, 1e-12), (0.02, 0.02)]
)
def test_steps_to_reach_is_the_fewest_steps_whose_sum_reaches_the_amount(first, growth):
    rng = random.Random(5)
    for _ in range(300):
        amount = rng.uniform(0, 400 * first)
        n = steps_to_reach(amount, first, growth)
        total = first * n + growth * n * (n - 1) / 2
        before = first * (n - 1) + growth * (n - 1) * (n - 2) / 2
        slack = 1e-9 * first
        assert total >= amount - slack
        assert n == 0 or before < amount + slack


def _single_steps(monkeypatch):
    monkeypatch.setattr(SimEngine, "_steady_steps", lambda self, plan, duration, growth, now: 1)


@pytest.mark.parametrize(
    ("policy", "unit", "host_gib"),
    [("vllm-opt", "tokens", None), ("plas-atlas", "tokens", None), ("vllm-opt", "tokens", 4.0),
     ("plas-atlas", "tokens", 4.0), ("plas-atlas", "time", 4.0), ("autellix", "tokens", None),
     ("autellix", "tokens", 4.0)],
)  # fmt: skip
def test_macro_steps_give_the_results_of_single_steps(monkeypatch, policy, unit, host_gib):
    """With decode cost growing every step, a macro step of k steps (cut short by
    arrivals, finished loads, demotions and promotions) ends where k single steps would."""
    preset = _tight(monkeypatch, kv_blocks=2000)
    programs = generate("agent", 8, rate=0.2, seed=2, max_context=16_000)
    levels = Levels.parse("0,0.05,0.5") if unit == "time" else Levels()
    config = PolicyConfig(levels=levels, meter=ServiceMeter(unit), beta=2.0)
    run = dict(preset=preset, max_num_seqs=4, config=config, kv_offload_gib=host_gib)
    macro = simulate(programs, policy, **run).metrics
    _single_steps(monkeypatch)
    single = simulate(programs, policy, **run).metrics
    counts = ("engine_steps", "calls_completed", "preemptions", "demotions", "promotions",
              "recomputed_tokens")  # fmt: skip
    for key in counts:
        assert macro[key] == single[key], key
    for key in ("avg_latency_per_token", "makespan", "total_wait"):
        assert macro[key] == pytest.approx(single[key], rel=1e-9), key
    # KV runs short: calls are preempted, or under the default new programs' first
    # calls take worse-ranked programs' held blocks instead.
    assert macro["preemptions"] > 0 or macro["holds_broken"] > 0
    assert macro.get("holds_broken") == single.get("holds_broken")
    assert macro.get("reloaded_tokens", 0) == single.get("reloaded_tokens", 0)
    # Holds keep autellix-kv's contexts on the GPU here: nothing needs reloading.
    assert macro.get("reloaded_tokens", 0) > 0 or host_gib is None or policy == "autellix"
    assert macro["demotions"] > 0 or policy == "vllm-opt"
    assert macro["promotions"] > 0 or unit == "tokens"


def _tight(monkeypatch, kv_blocks: int) -> str:
    """A preset whose KV holds ``kv_blocks`` blocks of 16 tokens; returns its name."""
    tight = replace(A100_KV, name="tight", kv_blocks=kv_blocks)
    monkeypatch.setitem(sim_presets.PRESETS, "tight", tight)
    return "tight"


def test_an_evicted_prefix_is_reloaded_from_the_host_tier(monkeypatch):
    """A's context is evicted from the GPU by B; A's next call loads it back over PCIe
    (after the link's transfer time) instead of prefilling it again."""
    preset = _tight(monkeypatch, kv_blocks=200)  # 3,200 tokens
    a = ProgramSpec("A", 0.0, (
        CallSpec("a1", 1, 1000), CallSpec("a2", 1, 1500, after=("a1",), tool_gap=5.0),
    ))  # fmt: skip
    b = ProgramSpec("B", 1.0, (CallSpec("b1", 1, 3000),))
    without = simulate([a, b], "vllm-opt", preset=preset).metrics
    tiered = simulate([a, b], "vllm-opt", preset=preset, kv_offload_gib=1.0).metrics

    assert "reloaded_tokens" not in without
    assert tiered["reloaded_tokens"] == 992  # a1's 1,000 tokens in full blocks of 16
    # a2 prefills 508 tokens instead of 1,500; the load (992 x 128 KiB at 25 GB/s) is
    # shorter than the prefill it saves.
    prefill_saved = A100_KV.step_time(0, 1500, 0, 1500 * 1501 // 2) - A100_KV.step_time(
        0, 508, 0, 508 * 992 + 508 * 509 // 2
    )
    load = 992 * A100_KV.host_seconds_per_token
    assert without["makespan"] - tiered["makespan"] == pytest.approx(prefill_saved - load)


def test_preempted_kv_in_the_host_tier_is_reloaded_not_recomputed(monkeypatch):
    preset = _tight(monkeypatch, kv_blocks=700)
    programs = generate("sharegpt", 20, rate=100.0, seed=3)
    without = simulate(programs, "vllm-opt", preset=preset, max_num_seqs=8).metrics
    tiered = simulate(programs, "vllm-opt", preset=preset, max_num_seqs=8, kv_offload_gib=4.0)
    tiered = tiered.metrics
    assert without["preemptions"] > 0 and tiered["preemptions"] > 0
    assert tiered["reloaded_tokens"] > 0
    assert tiered["recomputed_tokens"] < without["recomputed_tokens"] / 4
    assert tiered["calls_completed"] == without["calls_completed"]
    assert tiered["makespan"] < without["makespan"]


def test_the_stock_baseline_without_a_prefix_cache_has_no_host_tier():
    programs = generate("sharegpt", 5, rate=1.0, seed=1)
    metrics = simulate(programs, "vllm", kv_offload_gib=10.0).metrics
    assert "reloaded_tokens" not in metrics


def test_a_subagent_context_does_not_hit_its_parents_cache():
    def run(context):
        calls = (CallSpec("m", 1, 4800), CallSpec("s", 1, 3200, after=("m",), context=context))
        return simulate([ProgramSpec("A", 0.0, calls)], "vllm-opt").metrics["prefix_hit_rate"]

    assert run(None) == pytest.approx(3184 / 8000)  # the subagent reuses 199 blocks
    assert run("sub") == 0.0


def test_a_host_tier_needs_a_kv_size_per_token():
    with pytest.raises(ValueError, match="preset unit has no KV size per token"):
        simulate(generate("sharegpt", 1, 1.0), "vllm-opt", preset="unit", kv_offload_gib=1.0)
    with pytest.raises(ValueError, match="cannot be negative"):
        A100.with_kv_offload_gib(-1.0)
    assert math.isclose(A100.with_kv_offload_gib(None).kv_offload_gib, 0.0)


@pytest.mark.parametrize("host_gib", [None, 0.05], ids=["no-tier", "host-tier"])
def test_a_context_the_host_tier_keeps_is_held_as_long_as_any(host_gib):
    """A 20 s tool, while R keeps the engine stepping: A's context is held for 24
    expected gaps of the 2 s prior (48 s) and its next call takes the hold, with
    a tier that the live contexts outgrow (409 tokens for 1,016) as without (the
    tier may drop the context before A is back)."""
    a = ProgramSpec("A", 0.0, (
        CallSpec("a1", 1, 1000), CallSpec("a2", 1, 1500, after=("a1",), tool_gap=20.0),
    ))  # fmt: skip
    r = ProgramSpec("R", 0.0, (CallSpec("r1", 3000, 16),))  # decodes for ~27 s
    run = dict(preset="a100-llama8b-kv", kv_offload_gib=host_gib)
    metrics = simulate([a, r], "autellix", **run).metrics
    assert (metrics["holds_taken"], metrics["holds_expired"]) == (1, 0)
    # A tier that keeps both contexts: the rules step aside, nothing is held.
    kept = simulate([a, r], "autellix", preset="a100-llama8b-kv", kv_offload_gib=1.0).metrics
    assert kept["holds_granted"] == 0 and kept["calls_completed"] == 3
