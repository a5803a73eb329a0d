"""Replay programs on simulated engines under one policy and load balancer.

Discrete events: a call *arrives* (its program started, or the calls it waits
for completed and its tool gap elapsed), is routed to an engine by the
balancer, and waits there; an engine *starts* a step when it has work and
*ends* it after the step's simulated duration; an engine *wakes* when a call's
KV has loaded from its host tier. The router's view is emulated
too: each call carries its program's service summed over all engines as prior
service, as the real router passes it in ``X-Autellix-Prior-Service``, from a
table that is always fresh or, as the Ray Serve directory's, a report batch
behind (:class:`~.directory.ServiceTable`).

A sweep only needs to know whether a run's average latency per token exceeds
its SLO. With ``stop_above`` the run ends as soon as that is certain (see
:class:`LatencyBound`), which spares most of the time of overloaded runs.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import statistics
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from ..policy import (
    DEFAULT_POLICY,
    POLICY_NAMES,
    EngineLoad,
    PolicyConfig,
    ProgramScheduler,
    make_balancer,
    make_policy,
    policy_name,
)
from ..policy.flow_control import FlowControl, FlowControlConfig
from ..policy.routing import DEFAULT_LOCALITY_THRESHOLD
from ..registry import lookup
from ..router.timeline import CallSpan
from ..router.usage import CallReport
from ..stats import percentile, tails
from ..workloads.trace import CallSpec, ProgramSpec
from .directory import ServiceTable
from .engine_model import SimEngine
from .jobs import Job, ProgramRun
from .presets import EnginePreset, get_preset

# Simulator policy name -> (policy core name, prefix caching on?). `vllm` and
# `vllm-opt` are stock vLLM (the core's fcfs) without and with prefix caching;
# every other core policy runs under its own name, with prefix caching.
SIM_POLICIES: dict[str, tuple[str, bool]] = {
    "vllm": ("fcfs", False),
    "vllm-opt": ("fcfs", True),
    **{name: (name, True) for name in POLICY_NAMES if name != "fcfs"},
}

# Same-time order: arrivals first, then a look at the router's gate (calls a
# completion or the starvation bound lets go), then finished loads, then steps.
_ARRIVE, _GATE, _WAKE, _START, _END = 0, 1, 2, 3, 4


_CHECK_EVERY = 512  # events between two looks at the latency bound


@dataclass
class SimResult:
    metrics: dict[str, Any]
    latency_per_token: dict[str, float]  # program id -> seconds per token
    # Program id -> seconds from its arrival to its last call's completion.
    program_latency: dict[str, float] = field(default_factory=dict)
    # The calls of the program the run was asked to keep (``timeline_of``), in the
    # router's timeline type, so that ``autellix ps``'s views draw them.
    call_spans: list[CallSpan] = field(default_factory=list)


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


class Simulation:
    """One run: every call of ``programs`` routed to engines and served until done.

    Events are ``(time, kind, sequence, subject)``: at the same time, arrivals
    come before step starts and ends, and otherwise they keep the order in
    which they were posted.
    """

    def __init__(
        self,
        programs: list[ProgramSpec],
        policy: str,
        *,
        engines: int,
        lb: str,
        preset: str | EnginePreset,
        max_num_seqs: int | None,
        config: PolicyConfig | None,
        locality_threshold: int,
        stop_above: float | None,
        kv_offload_gib: float | None = None,
        end_programs: bool = True,
        retention_hints: bool = False,
        greedy_owners: Collection[str] = (),
        splitting_programs: Collection[str] = (),
        table_sync_s: float | None = None,
        timeline_of: str | None = None,
        flow_control: FlowControlConfig | None = None,
    ) -> None:
        core_policy, prefix_caching = lookup(SIM_POLICIES, policy_name(policy), "policy")
        if engines < 1:
            raise ValueError("need at least one engine")
        base = get_preset(preset)
        spec = base.with_max_num_seqs(max_num_seqs)
        spec = spec.with_kv_offload_gib(kv_offload_gib)
        config = config or PolicyConfig()
        self.balancer = make_balancer(lb, locality_threshold)
        # Clients end their programs after the last call, as the SDK does.
        self.end_programs = end_programs
        self.retention_hints = retention_hints
        self.greedy_owners = frozenset(greedy_owners)
        self.splitting_programs = frozenset(splitting_programs)
        self.timeline_of = timeline_of
        self.longest_hold_s = config.residency.max_ttl_s
        self.started = time.perf_counter()

        self.runs: dict[str, ProgramRun] = {}
        self.jobs: list[Job] = []  # every call that has arrived
        self.events: list[tuple[float, int, int, Any]] = []
        self._sequence = itertools.count()
        # The router's view: each program's service summed over all engines.
        self.table = ServiceTable(table_sync_s)
        self.dependents: dict[tuple[str, str], list[CallSpec]] = {}
        self.waiting_on: dict[tuple[str, str], int] = {}  # calls a call still waits for
        self.hints: dict[tuple[str, str], float | None] = {}  # (program, call) -> its hint
        self.first_arrival: dict[str, float] = {}  # program -> when its first call arrived

        self.engines = [
            SimEngine(
                f"engine-{i}",
                spec,
                ProgramScheduler(
                    make_policy(core_policy, config.atlas_variant, self._remaining_work),
                    config,
                    seats=spec.max_num_seqs,
                ),
                prefix_caching,
                functools.partial(self._complete, i),
                self._post_wake,
            )
            for i in range(engines)
        ]
        # A truncated macro step leaves a stale end event behind: only the latest counts.
        self.step_versions = {engine: 0 for engine in self.engines}
        self.start_posted: set[SimEngine] = set()  # engines with a step start pending
        # The router's gate (policy.flow_control), over the pool's seats; None: off.
        self.tenants = config.tenants
        self.gate: FlowControl[Job] | None = None
        self.calls_held = 0
        self._gate_look: float | None = None  # when a look at the gate is posted
        if flow_control is not None:
            seats = spec.max_num_seqs * engines
            self.gate = FlowControl(flow_control, config.tenants, seats)

        for program in programs:
            self._add_program(program, spec)
        self.bound = LatencyBound(list(self.runs.values())) if stop_above is not None else None
        self.stop_above = math.inf if stop_above is None else stop_above

    def _add_program(self, program: ProgramSpec, spec: EnginePreset) -> None:
        """Record the program's calls and what each waits for; post the calls that wait
        for nothing."""
        kv_tokens = spec.kv_blocks * spec.block_size
        for c in program.calls:
            if c.prompt_tokens + c.decode_tokens > kv_tokens:
                raise ValueError(
                    f"call {c.id} of program {program.program_id} needs "
                    f"{c.prompt_tokens + c.decode_tokens} tokens of KV; "
                    f"an engine of preset {spec.name} holds {kv_tokens}"
                )
        run = ProgramRun(
            program.program_id,
            program.arrival,
            len(program.calls),
            program.decode_tokens,
            float(program.decode_tokens),
            owner=program.owner,
            priority=program.priority,
        )
        self.runs[program.program_id] = run
        if program.owner in self.greedy_owners:
            for c in program.calls:  # the longest hold, whatever the program does
                self.hints[(program.program_id, c.id)] = self.longest_hold_s
        elif self.retention_hints:
            for call_id, hint_s in retention_hints_of(program).items():
                self.hints[(program.program_id, call_id)] = hint_s
        for c in program.calls:
            self.waiting_on[(program.program_id, c.id)] = len(c.after)
            for dep in c.after:
                self.dependents.setdefault((program.program_id, dep), []).append(c)
            if not c.after:
                self._post(program.arrival + c.tool_gap, _ARRIVE, self._job(c, run))

    def _job(self, spec: CallSpec, run: ProgramRun) -> Job:
        """A call of ``run``, with the client's retention hint if clients give them,
        sent as a program of its own if its client splits the program."""
        splits = run.program_id in self.splitting_programs
        return Job(
            spec,
            run,
            retention_hint_s=self.hints.get((run.program_id, spec.id)),
            sent_as=f"{run.program_id}/{spec.id}" if splits else "",
        )

    def _post(self, t: float, kind: int, subject: Any) -> None:
        heapq.heappush(self.events, (t, kind, next(self._sequence), subject))

    def _remaining_work(self, program: Any) -> float:
        """The SRPT oracle's view of a program."""
        return self.runs[program.program_id].remaining_work

    # ---- the event loop ------------------------------------------------------------

    def run(self) -> SimResult:
        handled = 0
        while self.events:
            t, kind, _, subject = heapq.heappop(self.events)
            handled += 1
            if handled % _CHECK_EVERY == 0 and (stopped := self._stopped_early(t)):
                return stopped
            if kind == _ARRIVE:
                self._arrive(subject, t)
            elif kind == _WAKE:
                self._wake(subject, t)
            elif kind == _GATE:
                self._release_held(t)
            elif kind == _START:
                self._start_step(subject, t)
            else:
                self._end_step(*subject)
        return self._metrics()

    def _arrive(self, job: Job, now: float) -> None:
        """The router got the call: hold it at the gate, or route it at once."""
        self.jobs.append(job)
        job.arrived_at = now
        self.first_arrival.setdefault(job.program.program_id, now)  # events come in time order
        if self.gate is not None:
            run = job.program
            band = self.tenants.band(run.owner, run.priority)
            job.band = band
            if self.gate.arrive(job, band, run.owner or "", now) is not None:
                self.calls_held += 1
                self._look_at_gate(now)
                return
        self._route(job, now)

    def _release_held(self, now: float) -> None:
        """Send the calls the gate lets go now (an aged one as band 0, any other
        with how long it was held, as the router states it)."""
        assert self.gate is not None
        self._gate_look = None
        for held in self.gate.release(now):
            held.item.band = held.band
            if not held.aged:
                held.item.router_wait_s = held.waited_s
            self._route(held.item, now)
        self._look_at_gate(now)

    def _look_at_gate(self, now: float) -> None:
        """Post a look at the gate for when it may let a held call go unasked."""
        assert self.gate is not None
        t = self.gate.next_look(now)
        if t is not None and (self._gate_look is None or t < self._gate_look):
            self._gate_look = t
            self._post(t, _GATE, None)

    def _route(self, job: Job, now: float) -> None:
        """Route the call and queue it on its engine."""
        program_id = job.sent_as
        route = self.balancer.choose(
            program_id, job.spec.prompt_tokens, [EngineLoad(e.name, e.load) for e in self.engines]
        )
        engine = self.engines[route.index]
        if engine.preset.exact_macro_steps and engine.catch_up(now):
            self._post_end(engine)
        engine.submit(job, now, self.table.service(program_id, now))
        self._wake(engine, now)

    def _wake(self, engine: SimEngine, now: float) -> None:
        """``engine`` has new work at ``now``: an idle one starts a step once every event
        at this instant is in; a busy one cuts its macro step short."""
        if engine.step is None:
            self._post_start(engine, now)
        elif engine.truncate(now):
            self._post_end(engine)

    def _post_wake(self, engine: SimEngine, t: float) -> None:
        self._post(t, _WAKE, engine)

    def _start_step(self, engine: SimEngine, now: float) -> None:
        self.start_posted.discard(engine)
        if engine.begin_step(now) is not None:
            self._post_end(engine)

    def _end_step(self, engine: SimEngine, version: int) -> None:
        if version != self.step_versions[engine]:
            return
        now = engine.finish_step()
        # Calls that this step's completions release (zero tool gap) arrive at the
        # same instant; the next step starts after them, as in a real engine.
        self._post_start(engine, now)

    def _post_start(self, engine: SimEngine, now: float) -> None:
        if engine not in self.start_posted:
            self.start_posted.add(engine)
            self._post(now, _START, engine)

    def _post_end(self, engine: SimEngine) -> None:
        self.step_versions[engine] += 1
        self._post(engine.step_end, _END, (engine, self.step_versions[engine]))

    def _complete(self, engine_index: int, job: Job, now: float) -> None:
        """A call completed on engine ``engine_index``: credit its program and release
        the calls waiting for it."""
        run = job.program
        pid = run.program_id
        if job.spec.id in run.done:
            raise RuntimeError(f"call {job.spec.id} of {pid} completed twice")
        run.done.add(job.spec.id)
        run.calls_left -= 1
        job.finished_at, job.engine = now, self.engines[engine_index].name
        if self.gate is not None:
            self.gate.ended(job.band, now)
            if self.gate.holding():
                self._post(now, _GATE, None)
        self.table.call_ended(job.sent_as, job.call.service, engine_index, now)
        for dep in self.dependents.get((pid, job.spec.id), ()):
            key = (pid, dep.id)
            self.waiting_on[key] -= 1
            if self.waiting_on[key] == 0:
                self._post(now + dep.tool_gap, _ARRIVE, self._job(dep, run))
        if job.sent_as != pid:  # a program of one call, which its client ends
            self._end(job.sent_as)
        if run.calls_left == 0:
            run.end = now
            self._end(pid)
            if self.bound is not None:
                self.bound.finished(run)

    def _end(self, program_id: str) -> None:
        """The program's last call completed: the router forgets it and, if clients
        end their programs, so do the engines."""
        self.balancer.forget(program_id)
        if self.end_programs:
            for engine in self.engines:
                engine.end_program(program_id)

    # ---- results ---------------------------------------------------------------------

    def _stopped_early(self, now: float) -> SimResult | None:
        """The result so far, if the average latency per token is sure to exceed the line."""
        if self.bound is None:
            return None
        lowest = self.bound.at(now)
        if lowest <= self.stop_above:
            return None
        metrics = {
            "programs": len(self.runs),
            "stopped_early": True,
            "stopped_at": now,
            "avg_latency_per_token": lowest,
            "programs_finished": sum(1 for r in self.runs.values() if not r.calls_left),
            "sim_seconds": time.perf_counter() - self.started,
        }
        return SimResult(metrics, {})

    def _metrics(self) -> SimResult:
        runs, jobs, sims = self.runs, self.jobs, self.engines
        unfinished = [r.program_id for r in runs.values() if r.calls_left]
        if unfinished:
            raise RuntimeError(f"{len(unfinished)} programs did not finish, e.g. {unfinished[0]}")
        lpt = {r.program_id: (r.end - r.arrival) / r.decode_total for r in runs.values()}
        values = sorted(lpt.values())
        latency = {r.program_id: r.end - r.arrival for r in runs.values()}
        first_token: dict[str, float] = {}  # program -> when any of its calls sampled one
        for job in jobs:
            if job.first_token_at is not None:
                pid = job.program.program_id
                first_token[pid] = min(first_token.get(pid, math.inf), job.first_token_at)
        first_waits = [first_token[p] - self.first_arrival[p] for p in runs]
        counters = [e.core.counters for e in sims]
        prompt = sum(e.kv.prompt_tokens for e in sims)
        metrics: dict[str, Any] = {
            "programs": len(runs),
            "stopped_early": False,
            "calls": len(jobs),
            "calls_completed": sum(len(r.done) for r in runs.values()),
            "avg_latency_per_token": statistics.fmean(values),
            "p50_latency_per_token": percentile(values, 50),
            "p95_latency_per_token": percentile(values, 95),
            "p99_latency_per_token": percentile(values, 99),
            **tails(latency.values(), first_waits),
            "makespan": max(r.end for r in runs.values()),
            "total_wait": sum(j.wait_s for j in jobs),
            "preemptions": sum(e.preemptions for e in sims),
            "promotions": sum(c.promotions for c in counters),
            "demotions": sum(c.demotions for c in counters),
            "recomputed_tokens": sum(e.recomputed_tokens for e in sims),
            "prefix_hit_rate": sum(e.kv.hit_tokens for e in sims) / prompt if prompt else 0.0,
            "engine_steps": sum(e.steps for e in sims),
            "sim_seconds": time.perf_counter() - self.started,
        }
        hosts = [e.host for e in sims if e.host is not None]
        if hosts:
            metrics["reloaded_tokens"] = sum(h.reloaded_tokens for h in hosts)
        holds = [e.rules.counters() for e in sims if e.rules is not None]
        for key in holds[0] if holds else ():
            metrics[key] = sum(counters[key] for counters in holds)
        shares = held_shares(sims)
        if shares:
            metrics["held_share_while_others_wait"] = shares
        if self.gate is not None:
            metrics["calls_held"] = self.calls_held
        if self.table.sync_s is not None:
            metrics["table_sync_s"] = self.table.sync_s
            metrics.update(self.table.traffic(metrics["makespan"]))
        spans = [call_span(job) for job in jobs if job.program.program_id == self.timeline_of]
        return SimResult(metrics, lpt, latency, spans)


def call_span(job: Job) -> CallSpan:
    """A finished call as the router's timeline records one, its parts as vLLM's
    per-request metrics define them: queue until first scheduled, prefill until
    the first token, decode until the last (a preemption's wait and recompute
    fall in the part it interrupted)."""
    assert job.scheduled_at is not None and job.first_token_at is not None
    assert job.finished_at is not None
    report = CallReport(
        prompt_tokens=job.spec.prompt_tokens,
        cached_tokens=job.cached_tokens,
        completion_tokens=job.spec.decode_tokens,
        queue_s=job.scheduled_at - job.arrived_at,
        prefill_s=job.first_token_at - job.scheduled_at,
        decode_s=job.finished_at - job.first_token_at,
    )
    return CallSpan(
        job.spec.id, job.spec.thread, job.engine, job.arrived_at, job.finished_at, True, report
    )


def held_shares(engines: list[SimEngine]) -> dict[str, float]:
    """Per owner, the share of the engines' hold budget it held, on average over
    the time another owner's calls waited (``HoldShares``); empty with one owner."""
    kept = [
        (e.rules.budget_blocks, e.hold_shares)
        for e in engines
        if e.rules is not None and e.hold_shares.seconds
    ]
    out: dict[str, float] = {}
    for owner in sorted({owner for _, shares in kept for owner in shares.seconds}):
        held = sum(shares.block_seconds.get(owner, 0.0) for _, shares in kept)
        budget = sum(blocks * shares.seconds.get(owner, 0.0) for blocks, shares in kept)
        out[owner] = held / budget if budget else 0.0
    return out


def retention_hints_of(program: ProgramSpec) -> dict[str, float | None]:
    """The retention hint a client sends with each call of ``program`` (call id ->
    seconds, or None for no hint), modelling a client that knows how long its own
    tools take, as one that wraps its calls in ``autellix.expect_tool`` does:

    * the call's context continues directly after it: the ``tool_gap`` of the next
      call of that context (the shortest, if several follow), exactly, with no slack
      (the engine clamps it to ``ResidencyConfig.min_ttl_s`` .. ``max_ttl_s``);
    * the context is done (every other call of it is one this call waited for, so
      the program or subagent ends): 0, which the engine, like the real one, clamps
      to ``min_ttl_s``;
    * the context continues only after calls of other contexts (a main thread that
      waits for its subagents), or may continue in a thread that runs alongside:
      None, no hint; the client cannot know how long those take, and the engine's
      estimate from the program's tool gaps applies.
    """
    calls = program.calls
    index = {c.id: i for i, c in enumerate(calls)}
    # Bit i of ancestors[j]: call j waits, directly or not, for call i (a trace names
    # only earlier calls in ``after``, so one pass in order finds them all).
    ancestors: list[int] = []
    of_context: dict[str | None, int] = {}  # context -> bits of its calls
    next_gap: dict[str, float] = {}  # call id -> tool gap of its context's next call
    for i, c in enumerate(calls):
        mask = 0
        for dep in c.after:
            j = index[dep]
            mask |= ancestors[j] | 1 << j
            if calls[j].context == c.context:
                next_gap[dep] = min(next_gap.get(dep, math.inf), c.tool_gap)
        ancestors.append(mask)
        of_context[c.context] = of_context.get(c.context, 0) | 1 << i
    hints: dict[str, float | None] = {}
    for i, c in enumerate(calls):
        if c.id in next_gap:
            hints[c.id] = next_gap[c.id]
        elif (of_context[c.context] & ~ancestors[i]) == 1 << i:  # nothing of it can follow
            hints[c.id] = 0.0
        else:
            hints[c.id] = None
    return hints


def simulate(
    programs: list[ProgramSpec],
    policy: str = DEFAULT_POLICY,
    *,
    engines: int = 1,
    lb: str = "round-robin",
    preset: str | EnginePreset = "a100-llama8b",
    max_num_seqs: int | None = None,
    config: PolicyConfig | None = None,
    locality_threshold: int = DEFAULT_LOCALITY_THRESHOLD,
    stop_above: float | None = None,
    kv_offload_gib: float | None = None,
    end_programs: bool = True,
    retention_hints: bool = False,
    greedy_owners: Collection[str] = (),
    splitting_programs: Collection[str] = (),
    table_sync_s: float | None = None,
    timeline_of: str | None = None,
    flow_control: FlowControlConfig | None = None,
) -> SimResult:
    """Run ``programs`` to completion and report the paper's metrics.

    With ``stop_above``, stop as soon as the average latency per token is sure
    to exceed it; the metrics then hold ``stopped_early: True`` and, as
    ``avg_latency_per_token``, the lower bound that crossed the line.
    ``kv_offload_gib`` gives every engine a host-memory KV tier of that size
    (None: the preset's); the metrics then count ``reloaded_tokens``.
    ``end_programs``: clients end each program after its last call, as the SDK
    does (False: agents that never say, so a KV-aware engine holds their last
    context until its hold expires).
    ``retention_hints``: clients send a retention hint with every call, as
    ``autellix.expect_tool`` does (see :func:`retention_hints_of`); a KV-aware
    engine holds the context for the hint instead of its own estimate. Under a
    KV-aware policy the metrics count the holds (``holds_granted`` and so on).
    ``greedy_owners``: the clients of these owners (``ProgramSpec.owner``) claim
    the longest hold (``ResidencyConfig.max_ttl_s``) with every call, whatever
    their programs do. With programs of two owners or more, the metrics give each
    owner's ``held_share_while_others_wait`` (see :func:`held_shares`).
    ``splitting_programs``: the clients of these programs send every call as a
    program of its own (a new program id, ended when the call returns), still waiting for
    the calls it follows and its tool gap as their agent does: the scheduler and
    the router's table see each call as a new program; the prefix cache (by
    content, as vLLM's) still finds what the agent's earlier calls left cached,
    but no hold keeps it for the next call.
    ``table_sync_s``: calls see their program's service over all engines as the
    Ray Serve directory has it, with report batches every ``table_sync_s``
    seconds (:class:`~.directory.ServiceTable`; None: one always fresh table); the
    metrics then give the directory's traffic (``directory_admissions_per_s``,
    ``directory_reports_per_s``).
    ``timeline_of``: a program id whose calls the result keeps, as the router's
    timeline has them (``SimResult.call_spans``).
    ``flow_control``: the router holds calls of worse bands while the pool is
    saturated (:mod:`~autellix_vllm.policy.flow_control`; None: it sends every
    call at once); the metrics then count ``calls_held``.
    """
    return Simulation(
        programs,
        policy,
        engines=engines,
        lb=lb,
        preset=preset,
        max_num_seqs=max_num_seqs,
        config=config,
        locality_threshold=locality_threshold,
        stop_above=stop_above,
        kv_offload_gib=kv_offload_gib,
        end_programs=end_programs,
        retention_hints=retention_hints,
        greedy_owners=greedy_owners,
        splitting_programs=splitting_programs,
        table_sync_s=table_sync_s,
        timeline_of=timeline_of,
        flow_control=flow_control,
    ).run()
