"""How well the simulator predicts the engine: ``autellix bench fidelity``.

One workload is replayed on the real engine (:mod:`autellix_vllm.bench.replay`,
stock vLLM then the Autellix scheduler, one after the other) and in the
simulator, on exactly what the engine saw: the same programs (token counts as
replayed, tool gaps) and arrival times, the engine's seats, level boundaries,
KV cap (``kv_blocks``) and policy, and the preset calibrated for the model
(``cpu-smollm2``, ``cpu-tiny``), its step costs scaled to the machine's speed
during the run: the engine's probe (a full batch of answers, before its
replay) is simulated too, and the preset is slowed or sped up by the ratio of
the two times (``time_scale``), since on a shared machine the same engine runs
2-3x slower or faster with other jobs' load. Both sides' preemptions and
prefix-cache hit rates are reported (``counts``; the engine's are vLLM's own).
Two numbers say how close they are:

* ``median_rel_error``: per scheduler, the median over programs of
  |simulated latency - engine latency| / engine latency;
* ``ratio``: FCFS's average program latency per token over Autellix's, on the
  engine and in the simulator: the scheduler's effect, which is what the
  simulator's results are read for.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, replace
from typing import Any

from autellix_vllm.bench.replay import (
    BenchSettings,
    ProgramResult,
    probe_program,
    run_schedulers,
    scaled_levels,
    settings_summary,
)
from autellix_vllm.engine.settings import SchedulerSettings
from autellix_vllm.policy import DEFAULT_POLICY, Levels, PolicyConfig
from autellix_vllm.sim.presets import EnginePreset, get_preset
from autellix_vllm.sim.run import simulate
from autellix_vllm.workloads.trace import ProgramSpec

# The simulator's preset for each built-in model's CPU engine.
PRESET_OF_MODEL = {"smollm2": "cpu-smollm2", "tiny": "cpu-tiny"}
# Stock vLLM's order in the simulator: FCFS with vLLM's prefix cache.
FCFS_SIM_POLICY = "vllm-opt"
# What both the engine and the simulator count, compared side by side.
COUNTED = ("preemptions", "prefix_cache_hit_rate")


@dataclass(frozen=True)
class FidelitySettings:
    bench: BenchSettings  # the workload and the engine's settings
    preset: str
    # The Autellix scheduler's policy, simulated under its own name.
    policy: str = DEFAULT_POLICY

    @classmethod
    def for_bench(cls, bench: BenchSettings, preset: str | None = None) -> FidelitySettings:
        """Both schedulers on ``bench``'s workload; ``preset`` defaults to the model's
        (ValueError for an unknown preset, or a model without one). The policy is
        the one the engine will run: ``bench.policy``, else ``$AUTELLIX_POLICY``'s."""
        if preset is None:
            if bench.model not in PRESET_OF_MODEL:
                raise ValueError(f"no preset is calibrated for {bench.model}: pass --preset")
            preset = PRESET_OF_MODEL[bench.model]
        get_preset(preset)
        policy = bench.policy or SchedulerSettings.from_env(os.environ).policy
        return cls(replace(bench, schedulers=("fcfs", "autellix")), preset, policy)

    @property
    def sim_policies(self) -> dict[str, str]:
        """Engine scheduler -> the simulator's policy of the same order."""
        return {"fcfs": FCFS_SIM_POLICY, "autellix": self.policy}

    def engine_preset(self, time_scale: float = 1.0) -> EnginePreset:
        """The preset as the engine ran: its KV capped as the engine's was
        (``bench.kv_blocks``), its step costs times ``time_scale``."""
        preset = get_preset(self.preset).slowed(time_scale)
        kv_blocks = self.bench.kv_blocks
        return preset if kv_blocks is None else replace(preset, kv_blocks=kv_blocks)


def run_fidelity(settings: FidelitySettings) -> dict[str, Any]:
    """Replay on the engine under both schedulers, then in the simulator; compare."""
    speed, programs, runs = run_schedulers(settings.bench)
    engine = {run.summary["scheduler"]: run.results for run in runs}
    scale = time_scale(settings, speed)
    result = compare(programs, engine, settings, settings.engine_preset(scale))
    result["counts"]["engine"] = {
        run.summary["scheduler"]: {name: run.summary["vllm"][name] for name in COUNTED}
        for run in runs
    }
    result["settings"] = {
        **settings_summary(settings.bench, speed, programs),
        "preset": settings.preset,
        "time_scale": round(scale, 3),
        "sim_policies": settings.sim_policies,
    }
    return result


def time_scale(settings: FidelitySettings, probed_tokens_per_s: float) -> float:
    """How much slower the engine ran than its preset models: the probe's simulated
    decode speed over the speed the engine's probe measured."""
    probe = probe_program(settings.bench)
    simulated = simulate(
        [probe],
        FCFS_SIM_POLICY,
        preset=settings.engine_preset(),
        max_num_seqs=settings.bench.max_num_seqs,
    ).metrics["makespan"]
    return (probe.decode_tokens / simulated) / probed_tokens_per_s


def compare(
    programs: list[ProgramSpec],
    engine: dict[str, list[ProgramResult]],
    settings: FidelitySettings,
    preset: EnginePreset | None = None,
) -> dict[str, Any]:
    """Simulate ``programs`` under each scheduler's policy (on ``preset``, default
    the engine's preset at time scale 1) and compare with the engine's results
    (``engine``: scheduler -> its programs' results)."""
    bench = settings.bench
    config = PolicyConfig(levels=Levels.parse(scaled_levels(bench)))
    decode = {p.program_id: p.decode_tokens for p in programs}
    errors: dict[str, float] = {}
    averages: dict[str, dict[str, float]] = {"engine": {}, "sim": {}}
    latencies: dict[str, dict[str, dict[str, float]]] = {pid: {} for pid in decode}
    counts: dict[str, dict[str, Any]] = {"sim": {}}
    for scheduler, policy in settings.sim_policies.items():
        run = simulate(
            programs,
            policy,
            preset=preset or settings.engine_preset(),
            max_num_seqs=bench.max_num_seqs,
            config=config,
        )
        simulated = run.latency_per_token
        counts["sim"][scheduler] = {
            "preemptions": run.metrics["preemptions"],
            "prefix_cache_hit_rate": round(run.metrics["prefix_hit_rate"], 4),
        }
        measured = {r.program_id: r.latency_per_token for r in engine[scheduler]}
        errors[scheduler] = statistics.median(
            abs(simulated[pid] - measured[pid]) / measured[pid] for pid in measured
        )
        averages["engine"][scheduler] = statistics.fmean(measured.values())
        averages["sim"][scheduler] = statistics.fmean(simulated[pid] for pid in measured)
        for pid in measured:
            latencies[pid][scheduler] = {
                "engine": round(measured[pid] * decode[pid], 3),
                "sim": round(simulated[pid] * decode[pid], 3),
            }
    return {
        "median_rel_error": errors,
        "ratio": {where: avg["fcfs"] / avg["autellix"] for where, avg in averages.items()},
        "avg_latency_per_token_s": averages,
        # Each program's latency in seconds, per scheduler, on the engine and simulated.
        "program_latency_s": latencies,
        # Preemptions and prefix-cache hit rate per scheduler (run_fidelity adds
        # the engine's, vLLM's own counts over its replay).
        "counts": counts,
    }
