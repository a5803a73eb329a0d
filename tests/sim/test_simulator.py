"""The simulator: the paper's Figure 2, determinism, conservation, bad input."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from autellix_vllm.policy import POLICY_NAMES, Levels, PolicyConfig, ServiceMeter
from autellix_vllm.policy.routing import DEFAULT_LOCALITY_THRESHOLD
from autellix_vllm.sim import SIM_POLICIES, CallSpec, ProgramSpec, generate, simulate
from autellix_vllm.sim.sweep import SweepSetup, run_at
from autellix_vllm.workloads import WORKLOAD_SPECS, WORKLOADS, WorkloadSpec
from autellix_vllm.workloads.trace import TraceError, load_trace, write_trace


def chain(pid: str, steps: list[int]) -> ProgramSpec:
    calls = tuple(
        CallSpec(f"{pid}{i}", d, after=(f"{pid}{i - 1}",) if i else ())
        for i, d in enumerate(steps)
    )
    return ProgramSpec(pid, 0.0, calls)


FIGURE_2 = [chain("A", [4, 3, 1, 1]), chain("B", [3, 3, 4]), chain("C", [1, 2]), chain("D", [4])]
# Priority = program's completed service + the call's own service so far, re-evaluated
# every step: levels one unit wide; no prefill, no anti-starvation in the toy example.
TOY = PolicyConfig(levels=Levels.unit(64), beta=1e9, meter=ServiceMeter(prefill_weight=0))


@pytest.mark.parametrize(("policy", "total_wait"), [("vllm", 18), ("plas", 12)])
def test_figure_2_total_waiting(policy, total_wait):
    result = simulate(FIGURE_2, policy, preset="unit", max_num_seqs=2, config=TOY)
    assert result.metrics["total_wait"] == total_wait
    assert result.metrics["makespan"] == 14  # 23 steps of work on 2 seats, either way


def test_figure_2_through_a_trace_file(tmp_path):
    path = tmp_path / "figure2.jsonl"
    write_trace(FIGURE_2, path)
    assert load_trace(path) == FIGURE_2
    out = subprocess.run(
        [sys.executable, "-m", "autellix_vllm", "simulate", "run", "--trace", str(path),
         "--policy", "plas", "--preset", "unit", "--max-num-seqs", "2", "--levels",
         ",".join(str(i) for i in range(64)), "--beta", "1e9", "--prefill-weight", "0", "--json"],
        capture_output=True, text=True, check=True,
    )
    assert json.loads(out.stdout)["total_wait"] == 12


@pytest.mark.parametrize("workload", ["sharegpt", "bfcl", "lats", "mixed"])
def test_same_seed_same_result(workload):
    programs = generate(workload, 12, rate=2.0, seed=7)
    first = simulate(programs, "autellix", max_num_seqs=16).metrics
    again = simulate(generate(workload, 12, rate=2.0, seed=7), "autellix", max_num_seqs=16)
    first.pop("sim_seconds")
    again.metrics.pop("sim_seconds")
    assert first == again.metrics
    other = simulate(generate(workload, 12, rate=2.0, seed=8), "autellix", max_num_seqs=16)
    assert other.metrics["avg_latency_per_token"] != first["avg_latency_per_token"]


@pytest.mark.parametrize("policy", sorted(SIM_POLICIES))
def test_every_call_completes_exactly_once(policy):
    # A small engine (8 seats, little KV) under overload: preemptions happen.
    programs = generate("mixed", 9, rate=50.0, seed=1)
    result = simulate(programs, policy, max_num_seqs=8, engines=2, lb="locality")
    total = sum(len(p.calls) for p in programs)
    assert result.metrics["calls"] == total
    assert result.metrics["calls_completed"] == total
    assert set(result.latency_per_token) == {p.program_id for p in programs}
    if policy in ("plas", "plas-atlas"):
        assert result.metrics["preemptions"] > 0


def test_the_locality_threshold_decides_which_calls_stick():
    # A tree search's calls are short: above a threshold of 0 each sticks to its
    # program's engine, which caches the tree's prefix; below a huge one they
    # spread by load, and another engine prefills the prefix again. The sweep's
    # setup carries the threshold to every run.
    setup = SweepSetup("lats", 3, 2, "a100-llama8b", 16, PolicyConfig(), 1.5,
                       locality_threshold=0)  # fmt: skip
    wide = replace(setup, locality_threshold=10**9)
    assert run_at(setup, "vllm-opt", "locality", 4.0)["prefix_hit_rate"] > run_at(
        wide, "vllm-opt", "locality", 4.0
    )["prefix_hit_rate"]


def test_kv_pressure_preempts_and_recomputes():
    from autellix_vllm.sim import presets

    tight = presets.EnginePreset("tight", 0.01, 0.0, 0.0, 8, 2048, kv_blocks=700)
    presets.PRESETS["tight"] = tight
    try:
        programs = generate("sharegpt", 20, rate=100.0, seed=3)
        metrics = simulate(programs, "vllm-opt", preset="tight").metrics
    finally:
        del presets.PRESETS["tight"]
    assert metrics["preemptions"] > 0 and metrics["recomputed_tokens"] > 0
    assert metrics["calls_completed"] == sum(len(p.calls) for p in programs)


def test_workloads_match_the_papers_statistics():
    for workload, calls, decode in (("sharegpt", 6.66, 276.81), ("bfcl", 10.75, 34.14)):
        programs = generate(workload, 2000, 1.0)
        n_calls = [len(p.calls) for p in programs]
        all_calls = [c for p in programs for c in p.calls]
        assert abs(sum(n_calls) / len(programs) - calls) / calls < 0.1
        assert abs(sum(c.decode_tokens for c in all_calls) / len(all_calls) - decode) / decode < 0.1
        assert max(n_calls) <= (80 if workload == "sharegpt" else 70)
    lats = generate("lats", 200, 1.0)
    assert 130 < sum(len(p.calls) for p in lats) / 200 < 190
    assert all(p.threads > 1 for p in lats)


def test_sim_policies_are_the_core_policies_and_two_vllm_baselines():
    assert list(SIM_POLICIES) == [
        "vllm", "vllm-opt", "mlfq", "plas", "atlas", "plas-atlas", "autellix",
        "continuum", "thunderagent", "mori", "lru-priority", "srpt",
    ]  # fmt: skip
    assert {core for core, _ in SIM_POLICIES.values()} == set(POLICY_NAMES)
    assert SIM_POLICIES["vllm"] == ("fcfs", False) and SIM_POLICIES["vllm-opt"] == ("fcfs", True)
    with pytest.raises(ValueError, match="unknown policy 'fcfs' \\(choose from vllm, vllm-opt"):
        simulate(FIGURE_2, "fcfs")


def test_mixed_holds_one_program_of_each_workload_per_shuffled_block():
    kinds = [p.kind for p in generate("mixed", 12, 1.0, seed=3)]
    blocks = [kinds[i : i + 3] for i in range(0, 12, 3)]
    assert all(sorted(block) == ["bfcl", "lats", "sharegpt"] for block in blocks)
    assert len({tuple(block) for block in blocks}) > 1
    names = ("sharegpt", "bfcl", "lats", "mixed", "agent", "chat")
    assert WORKLOADS == tuple(WORKLOAD_SPECS) == names


def test_a_workload_spec_is_a_generator_or_a_mix_of_them():
    with pytest.raises(ValueError, match="either a program generator or a mix"):
        WorkloadSpec("nothing", "no programs", programs=1, sweep_seconds=1.0)
    with pytest.raises(ValueError, match="cannot hold another mix"):
        WorkloadSpec("nested", "a mix of mixes", 1, 1.0, mix=(WORKLOAD_SPECS["mixed"],))
    with pytest.raises(ValueError, match="unknown workload 'nope' \\(choose from sharegpt"):
        generate("nope", 1, 1.0)


def test_a_new_workload_is_one_spec(monkeypatch, capsys):
    from autellix_vllm.cli import main

    def pair(rng, pid):
        first = CallSpec(f"{pid}.a", rng.randint(1, 9))
        return (first, CallSpec(f"{pid}.b", 2, after=(first.id,)))

    pairs = WorkloadSpec("pairs", "two calls", programs=5, sweep_seconds=10.0, program=pair)
    chats = WORKLOAD_SPECS["sharegpt"]
    monkeypatch.setitem(WORKLOAD_SPECS, "pairs", pairs)
    monkeypatch.setitem(
        WORKLOAD_SPECS, "pairs+chats",
        WorkloadSpec("pairs+chats", "a mix", programs=4, sweep_seconds=10.0, mix=(pairs, chats)),
    )  # fmt: skip
    programs = generate("pairs", 3, 1.0)
    assert [(p.kind, len(p.calls)) for p in programs] == [("pairs", 2)] * 3
    assert sorted(p.kind for p in generate("pairs+chats", 2, 1.0)) == ["pairs", "sharegpt"]
    # The CLI's choices and defaults come from the spec.
    assert main(["simulate", "run", "--workload", "pairs", "--preset", "unit", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calls_completed"] == 5 * 2


def test_a_call_larger_than_the_engine_is_refused():
    too_big = ProgramSpec("A", 0.0, (CallSpec("a", 10, prompt_tokens=10**9),))
    with pytest.raises(ValueError, match="needs 1000000010 tokens of KV"):
        simulate([too_big], "autellix")


def test_longer_traces_extend_shorter_ones():
    short, long = generate("mixed", 10, 1.0, seed=4), generate("mixed", 30, 3.0, seed=4)
    assert [p.calls for p in short] == [p.calls for p in long[:10]]
    assert long[5].arrival == pytest.approx(short[5].arrival / 3)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("not json", "not valid JSON"),
        ('{"arrival": 0, "calls": []}', "missing key 'program_id'"),
        ('{"program_id": "A", "arrival": -1, "calls": [{"id": 1, "decode_tokens": 1}]}',
         "arrival must be >= 0"),
        ('{"program_id": "A", "arrival": 0, "calls": [{"id": "a", "decode_tokens": 0}]}',
         "decode_tokens must be >= 1"),
        ('{"program_id": "A", "arrival": 0, "calls": [{"id": "a", "decode_tokens": 2, '
         '"after": ["b"]}]}', "not an earlier call"),
    ],
)
def test_malformed_trace_lines_are_named(tmp_path, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"program_id": "ok", "arrival": 0, "calls": [{"id": "x", "decode_tokens": 1}]}'
                    "\n" + line + "\n")
    with pytest.raises(TraceError, match=problem) as err:
        load_trace(path)
    assert "bad.jsonl:2" in str(err.value)


def test_trace_extra_keys_are_ignored(tmp_path):
    path = tmp_path / "extra.jsonl"
    path.write_text('{"program_id": "A", "arrival": 0, "note": "x", "calls": '
                    '[{"id": "a", "decode_tokens": 2, "model": "m"}]}\n')
    assert load_trace(path)[0].calls[0].decode_tokens == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--workload", "nope"], "invalid choice: 'nope'"),
        (["run", "--rate", "-2"], "must be positive"),
        (["run", "--locality-threshold", "-1"], "must be >= 0"),
        (["run", "--trace", "/no/such/file.jsonl"], "cannot read trace"),
        (["sweep", "--policies", "vllm,magic"], "unknown magic"),
        (["run", "--levels", "5,10"], "must start at 0"),
        (["run", "--preset", "unit", "--kv-offload-gib", "1"], "has no KV size per token"),
        (["run", "--max-context", "4096"], "workload sharegpt has no context limit"),
        (["sweep", "--workload", "bfcl", "--max-context", "4096"], "has no context limit"),
    ],
)
def test_cli_rejects_bad_input_with_one_line(args, message):
    out = subprocess.run(
        [sys.executable, "-m", "autellix_vllm", "simulate", *args],
        capture_output=True, text=True,
    )
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_cli_bench_policy_prints_the_median():
    out = subprocess.run(
        [sys.executable, "-m", "autellix_vllm", "simulate", "bench-policy", "--steps", "50",
         "--json"], capture_output=True, text=True, check=True,
    )
    result = json.loads(out.stdout)
    assert result["median_ms_per_step"] > 0 and result["waiting"] == 1000


def test_sweep_finds_a_max_rate_and_plots(tmp_path):
    from autellix_vllm.sim.sweep import plot, sweep

    result, curves = sweep(
        "bfcl", ["vllm-opt", "autellix"], duration=20, max_num_seqs=8, workers=1
    )
    assert set(result["max_rate"]) == {"vllm-opt", "autellix"}
    assert result["ratio"]["vllm-opt"] == 1.0
    assert result["locality_threshold"] == DEFAULT_LOCALITY_THRESHOLD  # says how it routed
    for curve in curves:
        passing = [r for r, m in curve.points if m["avg_latency_per_token"] <= result["slo"]]
        assert curve.max_rate == max(passing)
    plot(result, curves, "test", str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").stat().st_size > 1000


def test_a_sweep_takes_a_preset_that_is_not_registered():
    """A variant made with ``replace`` is swept as it is, in the pool's workers too:
    a slower engine has a lower highest rate, and the result names it."""
    from autellix_vllm.sim.presets import PRESETS, get_preset
    from autellix_vllm.sim.sweep import sweep

    base = get_preset("a100-llama8b")
    slow = replace(base, name="a100-llama8b-slow", step_base=4 * base.step_base)
    assert get_preset(slow) is slow and slow.name not in PRESETS
    rates = {}
    for preset in (base, slow):
        result, _ = sweep("bfcl", ["vllm-opt"], preset=preset, duration=20, max_num_seqs=8)
        assert result["preset"] == preset.name
        rates[preset.name] = result["max_rate"]["vllm-opt"]
    assert rates[slow.name] < rates[base.name]


def test_a_step_whose_preemptions_leave_it_empty_admits_at_once():
    """vLLM admits only in a step that preempted nothing, but a step its preemptions
    left empty takes no time and the next one admits. Here (found by a sweep) the
    one running call runs out of blocks under holds of its own level and is
    preempted: an engine that then went idle waited for an event that never came,
    and 70 programs never finished."""
    programs = generate("agent", 120, 0.02, 1)
    metrics = simulate(programs, "autellix", preset="a100-llama8b-kv", retention_hints=True)
    assert metrics.metrics["calls_completed"] == metrics.metrics["calls"]
