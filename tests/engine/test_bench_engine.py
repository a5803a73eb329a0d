"""The engine benchmark's workload and replayer (the full FCFS-vs-Autellix run is
`autellix bench engine`, too slow for the test suite)."""

import pytest
from autellix_vllm.bench.engine import (
    BenchSettings,
    ProgramResult,
    build_workload,
    replay,
    scaled_levels,
    spread,
    summarize,
    transcript,
)
from autellix_vllm.workloads.trace import CallSpec, ProgramSpec


def test_workload_is_seeded_and_fits_the_model():
    settings = BenchSettings.quick()
    programs = build_workload(settings)
    assert programs == build_workload(settings)
    assert programs != build_workload(BenchSettings.quick(seed=1))
    assert len(programs) == 16
    for program in programs:
        for call in program.calls:
            assert settings.min_decode <= call.decode_tokens <= settings.max_decode
            assert call.prompt_tokens + call.decode_tokens <= settings.max_model_len - 8
            if call.after:
                assert call.tool_gap > 0
    # The mix has multi-threaded programs (fan-out) and single-threaded ones.
    assert {p.threads > 1 for p in programs} == {True, False}


def test_spread_sets_the_arrival_window_from_the_probed_speed():
    programs = build_workload(BenchSettings.quick())
    tokens = sum(p.decode_tokens for p in programs)
    spread_out = spread(programs, window=0.5, tokens_per_s=100.0)
    assert max(p.arrival for p in spread_out) == pytest.approx(0.5 * tokens / 100.0)
    assert [p.calls for p in spread_out] == [p.calls for p in programs]


def test_levels_scale_with_the_tokens():
    assert scaled_levels(BenchSettings(token_scale=0.125)) == "0,16,64,256,1024,4096"


def test_summary_is_latency_per_decoded_token():
    results = [ProgramResult(f"p{i}", 1, decode_tokens=10, latency_s=i + 1) for i in range(20)]
    summary = summarize(results, wall_s=20.0)
    assert summary["avg_latency_per_token_s"] == pytest.approx(1.05)
    assert summary["p95_latency_per_token_s"] == pytest.approx(1.9)
    assert summary["p99_latency_per_token_s"] == pytest.approx(2.0)
    assert summary["throughput_tokens_per_s"] == 10.0


@pytest.mark.engine
async def test_replay_runs_dependent_and_parallel_calls_on_a_real_engine(engine):
    program = ProgramSpec(
        "bench-replay",
        0.0,
        (
            CallSpec("root", 5, 20),
            CallSpec("left", 3, 30, thread="l", parent_thread="main", after=("root",)),
            CallSpec("right", 4, 30, thread="r", parent_thread="main", after=("root",)),
            CallSpec("join", 2, 40, after=("left", "right"), tool_gap=0.05),
        ),
    )
    (result,) = await replay(engine.base_url, engine.served_model_name, [program], BenchSettings())
    assert result.calls == 4 and result.decode_tokens == 14
    assert result.latency_s > 0.05
    assert transcript("bench-replay", 40).startswith(transcript("bench-replay", 20))
