"""The agent workload: long-context coding-agent sessions shaped on 2026 traffic."""

import statistics

import pytest
from autellix_vllm.sim import generate, simulate
from autellix_vllm.workloads import AGENT_MAX_CONTEXT, WORKLOAD_SPECS, load_trace, write_trace

SESSIONS = generate("agent", 1000, rate=1.0, seed=0)


def _main(program):
    return [c for c in program.calls if c.thread == "main"]


def test_sessions_follow_the_published_figures():
    turns = [len(_main(p)) for p in SESSIONS]
    assert 39 <= statistics.median(turns) <= 45  # median 43, less what the context cap cuts
    # Heavy-tailed; the model's context cuts the tail. With room, some pass 180k.
    roomy = [_main(p) for p in generate("agent", 300, rate=1.0, max_context=262_144)]
    assert max(len(m) for m in roomy) > 2.5 * statistics.median(turns)
    assert 0.05 < sum(m[-1].prompt_tokens > 180_000 for m in roomy) / len(roomy) < 0.4
    at_turn_30 = [_main(p)[30].prompt_tokens for p in SESSIONS if len(_main(p)) > 30]
    assert 65_000 < statistics.median(at_turn_30) < 95_000  # ~80k by turn 30
    calls = [c for p in SESSIONS for c in p.calls]
    ratio = sum(c.prompt_tokens for c in calls) / sum(c.decode_tokens for c in calls)
    assert 115 < ratio < 150  # input:output about 131:1
    growth = [b.prompt_tokens - a.prompt_tokens for p in SESSIONS
              for a, b in zip(_main(p), _main(p)[1:], strict=False)]  # fmt: skip
    deciles = statistics.quantiles(growth, n=10)
    assert deciles[0] > 200 and deciles[-1] < 8000  # a few hundred to a few thousand
    gaps = [c.tool_gap for c in calls if c.after]
    assert 0.83 < sum(g < 1 for g in gaps) / len(gaps) < 0.89  # 86% within 1 s
    assert 0.93 < sum(g < 10 for g in gaps) / len(gaps) < 0.97  # 95% within 10 s
    with_subagents = sum(any(c.thread != "main" for c in p.calls) for p in SESSIONS)
    assert 0.40 < with_subagents / len(SESSIONS) < 0.48  # 44%


def test_contexts_grow_to_the_model_maximum_and_no_further():
    calls = [c for p in SESSIONS for c in p.calls]
    assert max(c.prompt_tokens + c.decode_tokens for c in calls) <= AGENT_MAX_CONTEXT
    assert max(c.prompt_tokens for c in calls) > 0.95 * AGENT_MAX_CONTEXT
    small = generate("agent", 50, rate=1.0, seed=0, max_context=16_000)
    assert max(c.prompt_tokens + c.decode_tokens for p in small for c in p.calls) <= 16_000
    assert WORKLOAD_SPECS["agent"].max_context == AGENT_MAX_CONTEXT
    with pytest.raises(ValueError, match="workload sharegpt has no context limit"):
        generate("sharegpt", 5, 1.0, max_context=4096)


def test_subagents_run_on_their_own_thread_and_context_and_join_back():
    program = next(p for p in SESSIONS if any(c.thread != "main" for c in p.calls))
    by_id = {c.id: c for c in program.calls}
    subagents = {c.thread for c in program.calls if c.thread != "main"}
    for thread in subagents:
        calls = [c for c in program.calls if c.thread == thread]
        assert all(c.parent_thread == "main" and c.context == thread for c in calls)
        assert by_id[calls[0].after[0]].thread == "main"  # forked by a main-thread call
        # The main thread's next call waits for the subagent's last one.
        assert any(calls[-1].id in c.after for c in _main(program))
        assert calls[0].prompt_tokens < 20_000  # a fresh context, not the parent's
    assert all(c.context is None for c in _main(program))


def test_sessions_are_seeded_and_survive_a_trace_file(tmp_path):
    again = generate("agent", 20, rate=3.0, seed=0)
    assert [p.calls for p in again] == [p.calls for p in SESSIONS[:20]]
    assert generate("agent", 5, 1.0, seed=1)[0].calls != SESSIONS[0].calls
    path = tmp_path / "agent.jsonl"
    write_trace(SESSIONS[:5], path)
    assert load_trace(path) == SESSIONS[:5]


def test_the_prefix_cache_holds_while_sessions_fit_in_kv():
    """Sessions far apart: the cache hit rate is the published 94-96%."""
    metrics = simulate(generate("agent", 10, rate=0.001), "vllm-opt", preset="a100-llama8b-kv")
    assert 0.94 < metrics.metrics["prefix_hit_rate"] < 0.97
    assert metrics.metrics["preemptions"] == 0
