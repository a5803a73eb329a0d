"""Replay programs on simulated engines under one policy and load balancer.

Discrete events: a call *arrives* (its program started, or the calls it waits
for completed and its tool gap elapsed), is routed to an engine by the
balancer, and waits there; an engine *starts* a step when it has work and
*ends* it after the step's simulated duration. The router's view is emulated
too: each call carries its program's service summed over all engines as prior
service, as the real router passes it in ``X-Autellix-Prior-Service``.

A sweep only needs to know whether a run's average latency per token exceeds
its SLO. With ``stop_above`` the run ends as soon as that is certain (see
:class:`LatencyBound`), which spares most of the time of overloaded runs.
"""

from __future__ import annotations

import heapq
import itertools
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

from ..policy import (
    POLICY_NAMES,
    EngineLoad,
    PolicyConfig,
    ProgramScheduler,
    make_balancer,
    make_policy,
)
from ..workloads.trace import ProgramSpec
from .engine import Job, ProgramRun, SimEngine
from .presets import get_preset

# Simulator policy name -> (policy core name, prefix caching on?). `vllm` and
# `vllm-opt` are stock vLLM (the core's fcfs) without and with prefix caching;
# every other core policy runs under its own name, with prefix caching.
SIM_POLICIES: dict[str, tuple[str, bool]] = {
    "vllm": ("fcfs", False),
    "vllm-opt": ("fcfs", True),
    **{name: (name, True) for name in POLICY_NAMES if name != "fcfs"},
}

_ARRIVE, _START, _END = 0, 1, 2  # same-time order: arrivals first, then steps


_CHECK_EVERY = 512  # events between two looks at the latency bound


@dataclass
class SimResult:
    metrics: dict[str, Any]
    latency_per_token: dict[str, float]  # program id -> seconds per token


class LatencyBound:
    """A lower bound on the run's final average latency per token, kept as it runs.

    At simulated time t a finished program's latency per token is known, and
    one that arrived but is unfinished already has at least
    (t - arrival) / decode_tokens (its end lies after t); one yet to arrive has
    at least 0. The sum over programs is kept incrementally as
    finished + t * sum(1 / D) - sum(arrival / D) over arrived, unfinished programs.
    """

    def __init__(self, runs: list[ProgramRun]) -> None:
        self._by_arrival = sorted(runs, key=lambda r: r.arrival)
        self._arrived = 0  # programs of _by_arrival already counted as arrived
        self._counted: set[str] = set()  # arrived and unfinished
        self._finished = 0.0
        self._inverse_decodes = 0.0
        self._arrivals_over_decodes = 0.0

    def finished(self, run: ProgramRun) -> None:
        self._finished += (run.end - run.arrival) / run.decode_total
        if run.program_id in self._counted:
            self._counted.discard(run.program_id)
            self._inverse_decodes -= 1 / run.decode_total
            self._arrivals_over_decodes -= run.arrival / run.decode_total

    def at(self, now: float) -> float:
        """The bound on the average latency per token at simulated time `now`."""
        while self._arrived < len(self._by_arrival):
            run = self._by_arrival[self._arrived]
            if run.arrival > now:
                break
            self._arrived += 1
            if run.calls_left:
                self._counted.add(run.program_id)
                self._inverse_decodes += 1 / run.decode_total
                self._arrivals_over_decodes += run.arrival / run.decode_total
        waiting = now * self._inverse_decodes - self._arrivals_over_decodes
        return (self._finished + max(waiting, 0.0)) / len(self._by_arrival)


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[i]


def simulate(
    programs: list[ProgramSpec],
    policy: str = "autellix",
    *,
    engines: int = 1,
    lb: str = "round-robin",
    preset: str = "a100-llama8b",
    max_num_seqs: int | None = None,
    config: PolicyConfig | None = None,
    locality_threshold: int = 2048,
    stop_above: float | None = None,
) -> SimResult:
    """Run ``programs`` to completion and report the paper's metrics.

    With ``stop_above``, stop as soon as the average latency per token is sure
    to exceed it; the metrics then hold ``stopped_early: True`` and, as
    ``avg_latency_per_token``, the lower bound that crossed the line.
    """
    if policy not in SIM_POLICIES:
        raise ValueError(f"unknown policy {policy!r} (choose from {', '.join(SIM_POLICIES)})")
    if engines < 1:
        raise ValueError("need at least one engine")
    spec = get_preset(preset).with_max_num_seqs(max_num_seqs)
    core_policy, prefix_caching = SIM_POLICIES[policy]
    config = config or PolicyConfig()
    balancer = make_balancer(lb, locality_threshold)
    started = time.perf_counter()

    runs: dict[str, ProgramRun] = {}
    events: list[tuple[float, int, int, Any]] = []
    seq = itertools.count()
    global_service: dict[str, float] = {}
    dependents: dict[tuple[str, str], list[Any]] = {}
    waiting_on: dict[tuple[str, str], int] = {}
    jobs: list[Job] = []

    def post(t: float, kind: int, obj: Any) -> None:
        heapq.heappush(events, (t, kind, next(seq), obj))

    def on_complete(job: Job, now: float) -> None:
        run = job.program
        pid = run.program_id
        if job.spec.id in run.done:
            raise RuntimeError(f"call {job.spec.id} of {pid} completed twice")
        run.done.add(job.spec.id)
        run.calls_left -= 1
        global_service[pid] = global_service.get(pid, 0.0) + job.call.service
        for dep in dependents.get((pid, job.spec.id), ()):
            key = (pid, dep.id)
            waiting_on[key] -= 1
            if waiting_on[key] == 0:
                post(now + dep.tool_gap, _ARRIVE, Job(dep, run))
        if run.calls_left == 0:
            run.end = now
            balancer.forget(pid)
            if bound is not None:
                bound.finished(run)

    def remaining(program: Any) -> float:
        return runs[program.program_id].remaining_work

    sims = [
        SimEngine(
            f"engine-{i}",
            spec,
            ProgramScheduler(
                make_policy(core_policy, config.atlas_variant, remaining),
                config,
                seats=spec.max_num_seqs,
            ),
            prefix_caching,
            on_complete,
        )
        for i in range(engines)
    ]
    by_name = {e.name: e for e in sims}

    kv_tokens = spec.kv_blocks * spec.block_size
    for p in programs:
        for c in p.calls:
            if c.prompt_tokens + c.decode_tokens > kv_tokens:
                raise ValueError(
                    f"call {c.id} of program {p.program_id} needs "
                    f"{c.prompt_tokens + c.decode_tokens} tokens of KV; "
                    f"an engine of preset {preset} holds {kv_tokens}"
                )
        runs[p.program_id] = ProgramRun(
            p.program_id, p.arrival, p.kind, len(p.calls), p.decode_tokens,
            float(p.decode_tokens),
        )
        for c in p.calls:
            waiting_on[(p.program_id, c.id)] = len(c.after)
            for dep in c.after:
                dependents.setdefault((p.program_id, dep), []).append(c)
            if not c.after:
                t = p.arrival + c.tool_gap
                post(t, _ARRIVE, Job(c, runs[p.program_id]))

    step_version: dict[str, int] = {e.name: 0 for e in sims}
    bound = LatencyBound(list(runs.values())) if stop_above is not None else None
    line = math.inf if stop_above is None else stop_above
    events_handled = 0

    def schedule_end(engine: SimEngine) -> None:
        step_version[engine.name] += 1
        post(engine.step_end, _END, (engine.name, step_version[engine.name]))

    while events:
        t, kind, _, obj = heapq.heappop(events)
        events_handled += 1
        if bound is not None and events_handled % _CHECK_EVERY == 0:
            lowest = bound.at(t)
            if lowest > line:
                return SimResult(_stopped_metrics(runs, lowest, t, started), {})
        if kind == _ARRIVE:
            job: Job = obj
            jobs.append(job)
            route = balancer.choose(
                job.program.program_id,
                job.spec.prompt_tokens,
                [EngineLoad(e.name, e.load) for e in sims],
            )
            engine = sims[route.index]
            engine.submit(job, t, global_service.get(job.program.program_id, 0.0))
            if engine.step is None:
                if not engine.starting:  # start once all arrivals at this instant are in
                    engine.starting = True
                    post(t, _START, engine.name)
            elif engine.truncate(t):
                schedule_end(engine)
        elif kind == _START:
            engine = by_name[obj]
            engine.starting = False
            if engine.begin_step(t) is not None:
                schedule_end(engine)
        else:
            name, version = obj
            if version != step_version[name]:
                continue
            engine = by_name[name]
            # Calls that this step's completions release (zero tool gap) arrive at
            # the same instant; the next step starts after them, as in a real engine.
            engine.starting = True
            post(engine.finish_step(), _START, name)

    return SimResult(*_metrics(runs, jobs, sims, started))


def _stopped_metrics(
    runs: dict[str, ProgramRun], lowest: float, now: float, started: float
) -> dict[str, Any]:
    return {
        "programs": len(runs),
        "stopped_early": True,
        "stopped_at": now,
        "avg_latency_per_token": lowest,
        "programs_finished": sum(1 for r in runs.values() if not r.calls_left),
        "sim_seconds": time.perf_counter() - started,
    }


def _metrics(
    runs: dict[str, ProgramRun], jobs: list[Job], sims: list[SimEngine], started: float
) -> tuple[dict[str, Any], dict[str, float]]:
    unfinished = [r.program_id for r in runs.values() if r.calls_left]
    if unfinished:
        raise RuntimeError(f"{len(unfinished)} programs did not finish, e.g. {unfinished[0]}")
    lpt = {r.program_id: (r.end - r.arrival) / r.decode_total for r in runs.values()}
    values = sorted(lpt.values())
    counters = [e.core.counters for e in sims]
    prompt = sum(e.kv.prompt_tokens for e in sims)
    metrics = {
        "programs": len(runs),
        "stopped_early": False,
        "calls": len(jobs),
        "calls_completed": sum(len(r.done) for r in runs.values()),
        "avg_latency_per_token": statistics.fmean(values),
        "p50_latency_per_token": _percentile(values, 50),
        "p95_latency_per_token": _percentile(values, 95),
        "p99_latency_per_token": _percentile(values, 99),
        "makespan": max(r.end for r in runs.values()),
        "total_wait": sum(j.wait_s for j in jobs),
        "preemptions": sum(e.preemptions for e in sims),
        "promotions": sum(c.promotions for c in counters),
        "demotions": sum(c.demotions for c in counters),
        "recomputed_tokens": sum(e.recomputed_tokens for e in sims),
        "prefix_hit_rate": sum(e.kv.hit_tokens for e in sims) / prompt if prompt else 0.0,
        "engine_steps": sum(e.steps for e in sims),
        "sim_seconds": time.perf_counter() - started,
    }
    return metrics, lpt
