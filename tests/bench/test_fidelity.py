"""`autellix bench fidelity` without an engine: the comparison of the engine's
results with the simulator's, and the command's checks before anything starts."""

import subprocess
import sys

import pytest
from autellix_vllm.bench.fidelity import FidelitySettings, compare, run_fidelity, time_scale
from autellix_vllm.bench.replay import BenchSettings, ProgramResult, build_workload, probe_program
from autellix_vllm.policy import Levels, PolicyConfig
from autellix_vllm.sim.presets import get_preset
from autellix_vllm.sim.run import simulate


def test_the_comparison_reports_median_errors_and_both_ratios():
    bench = BenchSettings(programs=6, model="tiny", max_num_seqs=2, rate=2.0)
    settings = FidelitySettings.for_bench(bench)
    assert settings.preset == "cpu-tiny" and settings.bench.schedulers == ("fcfs", "autellix")
    programs = build_workload(settings.bench)
    config = PolicyConfig(levels=Levels.parse("0,16,64,256,1024,4096"))
    # An "engine" 25% slower than the simulator under FCFS and 20% faster under Autellix.
    factors = {"fcfs": ("vllm-opt", 1.25), "autellix": ("autellix", 0.8)}
    engine, simulated_avg = {}, {}
    for scheduler, (policy, factor) in factors.items():
        per_token = simulate(
            programs, policy, preset="cpu-tiny", max_num_seqs=2, config=config
        ).latency_per_token
        simulated_avg[scheduler] = sum(per_token.values()) / len(per_token)
        engine[scheduler] = [
            ProgramResult(p.program_id, len(p.calls), p.decode_tokens,
                          per_token[p.program_id] * p.decode_tokens * factor)
            for p in programs
        ]  # fmt: skip

    result = compare(programs, engine, settings)

    assert result["median_rel_error"] == pytest.approx({"fcfs": 0.2, "autellix": 0.25})
    sim_ratio = simulated_avg["fcfs"] / simulated_avg["autellix"]
    assert result["ratio"] == pytest.approx({"engine": sim_ratio * 1.25 / 0.8, "sim": sim_ratio})
    assert result["avg_latency_per_token_s"]["sim"] == pytest.approx(simulated_avg)
    assert set(result["counts"]["sim"]) == {"fcfs", "autellix"}
    assert 0 <= result["counts"]["sim"]["fcfs"]["prefix_cache_hit_rate"] <= 1
    first = result["program_latency_s"][programs[0].program_id]
    assert first["fcfs"]["engine"] == pytest.approx(first["fcfs"]["sim"] * 1.25, abs=0.002)


def test_the_preset_is_scaled_to_the_speed_the_engine_probed():
    """An engine whose probe ran at half the simulated speed is modelled twice as slow."""
    settings = FidelitySettings.for_bench(BenchSettings(model="tiny", max_num_seqs=2))
    probe = probe_program(settings.bench)
    seconds = simulate([probe], "vllm-opt", preset="cpu-tiny", max_num_seqs=2).metrics["makespan"]
    simulated_speed = probe.decode_tokens / seconds
    assert time_scale(settings, simulated_speed) == pytest.approx(1.0)
    assert time_scale(settings, simulated_speed / 2) == pytest.approx(2.0)
    tiny = get_preset("cpu-tiny")
    assert tiny.slowed(2.0).step_time(3, 100, 50) == pytest.approx(2 * tiny.step_time(3, 100, 50))
    with pytest.raises(ValueError):
        tiny.slowed(0.0)


def test_the_simulator_runs_the_engines_policy_on_the_engines_kv(monkeypatch):
    monkeypatch.delenv("AUTELLIX_POLICY", raising=False)
    plain = FidelitySettings.for_bench(BenchSettings(model="tiny"))
    assert plain.sim_policies == {"fcfs": "vllm-opt", "autellix": "autellix"}  # the default
    assert plain.engine_preset() == get_preset("cpu-tiny")
    capped = FidelitySettings.for_bench(
        BenchSettings(model="smollm2", kv_blocks=96, policy="plas-atlas")
    )
    assert capped.sim_policies == {"fcfs": "vllm-opt", "autellix": "plas-atlas"}
    assert capped.engine_preset().kv_blocks == 96
    assert capped.engine_preset(2.0).per_prefill == 2 * get_preset("cpu-smollm2").per_prefill
    # Without --policy the engine runs $AUTELLIX_POLICY's, and so does the simulator.
    monkeypatch.setenv("AUTELLIX_POLICY", "plas-atlas")
    assert FidelitySettings.for_bench(BenchSettings()).policy == "plas-atlas"


def test_a_preset_is_needed_and_must_exist():
    assert FidelitySettings.for_bench(BenchSettings()).preset == "cpu-smollm2"
    with pytest.raises(ValueError, match="no preset is calibrated for /my/model"):
        FidelitySettings.for_bench(BenchSettings(model="/my/model"))
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        FidelitySettings.for_bench(BenchSettings(), "nope")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["fidelity", "--preset", "nope"], "unknown preset 'nope'"),
        (["engine", "--trace", "/no/such/trace.jsonl"], "cannot read trace"),
        (["engine", "--token-scale", "0"], "--token-scale must be positive"),
    ],
)
def test_bad_input_is_refused_before_any_engine_starts(options, message):
    out = subprocess.run(
        [sys.executable, "-m", "autellix_vllm", "bench", *options, "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stdout == "" and message in out.stderr and len(out.stderr.splitlines()) == 1


@pytest.mark.engine
def test_a_small_run_compares_the_engine_with_its_own_policy_and_kv():
    """Two tiny engines, one after the other, on a KV cap: the simulator runs the
    engine's policy on the engine's blocks, and both sides' counts are reported."""
    bench = BenchSettings(programs=3, model="tiny", workload="agent", max_num_seqs=2,
                          kv_blocks=24, policy="autellix")  # fmt: skip
    result = run_fidelity(FidelitySettings.for_bench(bench))
    assert result["settings"]["kv_blocks"] == 24
    assert result["settings"]["sim_policies"] == {"fcfs": "vllm-opt", "autellix": "autellix"}
    for side in ("engine", "sim"):
        for scheduler in ("fcfs", "autellix"):
            counts = result["counts"][side][scheduler]
            assert counts["preemptions"] >= 0 and 0 <= counts["prefix_cache_hit_rate"] <= 1
    assert set(result["median_rel_error"]) == {"fcfs", "autellix"}
    assert len(result["program_latency_s"]) == 3
