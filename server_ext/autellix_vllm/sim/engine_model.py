"""A continuous-batching engine, modelled step by step like vLLM V1's scheduler.

Each engine owns a :class:`~autellix_vllm.policy.ProgramScheduler` and asks it
every ordering question, exactly as the vLLM scheduler subclass does:

1. *seats*: running calls a better waiting call displaces (policy preemption);
2. *running phase*: running calls in rank order get one decode token or a
   prefill chunk within the step's token budget; when KV blocks run out the
   worst-ranked running call is preempted (and recomputed later: V1 has no swap);
3. *waiting phase* (only if step 2 preempted nothing): admit waiting calls in
   rank order while seats, budget and blocks last; stop at the first that does
   not fit (head-of-line blocking, as vLLM does).

KV is counted in blocks, with a prefix cache per context and, optionally, a
host-memory tier (:mod:`.kv_memory`). A call whose prefix left the GPU but not
the host loads it asynchronously, as in vLLM: the call holds its blocks but no
seat while its KV streams in (one transfer at a time per engine), then joins the
batch ahead of the waiting calls.

Under a KV-aware policy (``policy.residency``) the engine also holds an idle
context's blocks after its call ends (pinned like a shared prefix, until the
program's next call is admitted or the hold ends), skips waiting calls outside
the working set, breaks holds of programs in a running call's level or worse
before it preempts, and preempts the running call cheapest to undo within the
worst level.

A step with only decodes repeats until something changes, so the engine runs
such stretches as one *macro step* of k steps (until the first completion,
demotion, starvation promotion, block boundary or hold expiry, or an arrival or
finished load, which truncates it). When decode cost grows with context, each step of it
is longer than the one before by the context it added. This is what makes a
sweep run in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..policy import Call, ProgramScheduler
from ..policy.residency import SKIPPED_WAITERS, Residency, undo_cost
from ..protocol.identity import CallIdentity
from .jobs import Job
from .kv_memory import HostTier, KVPool, ceil_blocks
from .presets import EnginePreset


@dataclass
class HoldShares:
    """What each owner held while another owner's calls waited: the figure the fair
    share of held KV bounds (``policy.residency``), kept once two owners are seen.

    Between two steps the holds and the waiting owners are taken as they were at
    the first (a hold's blocks held over that stretch, if another owner waited).
    """

    owners: set[str] = field(default_factory=set)
    block_seconds: dict[str, float] = field(default_factory=dict)  # owner -> held x time
    seconds: dict[str, float] = field(default_factory=dict)  # owner -> time others waited
    _since: float = 0.0
    _held: dict[str, int] = field(default_factory=dict)
    _waiting: frozenset[str] = frozenset()

    def observe(self, now: float, residency: Residency) -> None:
        """The stretch since the last observation is over; the state from ``now`` on is
        ``residency``'s."""
        if len(self.owners) > 1:
            elapsed = now - self._since
            for owner in self.owners:
                if elapsed > 0 and self._waiting - {owner}:
                    held = self._held.get(owner, 0)
                    self.seconds[owner] = self.seconds.get(owner, 0.0) + elapsed
                    self.block_seconds[owner] = self.block_seconds.get(owner, 0.0) + held * elapsed
            self._held = dict(residency.held_by_owner)
            self._waiting = frozenset(residency.waiting_owners())
        self._since = now


@dataclass
class Step:
    """What one (macro) step runs, how long its steps take and how often it repeats."""

    decodes: list[Job]
    prefills: list[tuple[Job, int]]  # job, prompt tokens computed this step
    duration: float  # of the first step
    repeat: int
    started: float
    # Each further step of a macro step is this much longer: every decode adds a
    # token of context that the next step reads.
    growth: float = 0.0

    def elapsed(self, steps: int) -> float:
        """How long the first ``steps`` steps take."""
        if not self.growth:
            return self.duration * steps
        return self.duration * steps + self.growth * steps * (steps - 1) / 2

    @property
    def end(self) -> float:
        return self.started + self.elapsed(self.repeat)


def steps_to_reach(amount: float, first: float, growth: float) -> int:
    """The fewest steps whose sum reaches ``amount`` when the first step adds ``first``
    and each further one ``growth`` more than the one before (a tolerance of 1e-9 of a
    first step absorbs rounding)."""
    if not growth:
        return math.ceil(amount / first - 1e-9)
    if amount <= 0:
        return 0
    # first * n + growth * n * (n - 1) / 2 = amount, solved for n in a form that
    # stays exact as growth goes to 0.
    b = first - growth / 2
    return math.ceil(2 * amount / (math.sqrt(b * b + 2 * growth * amount) + b) - 1e-9)


@dataclass
class _Batch:
    """The calls chosen for the next step, and the token budget they leave."""

    budget: int
    decodes: list[Job] = field(default_factory=list)
    prefills: list[tuple[Job, int]] = field(default_factory=list)  # job, prompt tokens
    jobs: set[Job] = field(default_factory=set)

    def __contains__(self, job: Job) -> bool:
        return job in self.jobs

    def add(self, job: Job, tokens: int) -> None:
        if job.missing == 1:  # the last sampled token: a decode
            self.decodes.append(job)
        else:
            self.prefills.append((job, tokens))
        self.jobs.add(job)
        self.budget -= tokens


class SimEngine:
    """One engine: the batch, the KV pool, and the scheduler core that orders calls."""

    def __init__(
        self,
        name: str,
        preset: EnginePreset,
        core: ProgramScheduler,
        prefix_caching: bool,
        on_complete: Callable[[Job, float], None],
        wake_at: Callable[[SimEngine, float], None],
    ) -> None:
        self.name = name
        self.preset = preset
        self.core = core
        self.kv = KVPool(preset.kv_blocks, preset.block_size, prefix_caching)
        # vLLM's offloading connector finds host copies by the prefix cache's block hashes.
        self.host = (
            HostTier(preset.host_blocks, preset.block_size, preset.host_seconds_per_token)
            if preset.host_blocks and prefix_caching
            else None
        )
        # KV-aware policies: holds of idle contexts and the working-set rule, which
        # apply (``residency``) unless the host tier can keep every live context.
        self.rules = (
            Residency(
                core.config.residency,
                preset.kv_blocks,
                core.program_level,
                core.waiting.owners,
                tier_blocks=self.host.capacity if self.host else 0,
                retention=core.policy.make_retention(),
                kv_fill_s=preset.kv_blocks * preset.block_size * preset.per_prefill,
            )
            if core.policy.kv_aware and prefix_caching
            else None
        )
        self.residency = self.rules
        self.on_complete = on_complete
        # Asks for a step at a time: a load from the host is done, a hold expires.
        self.wake_at = wake_at
        self.running: list[Job] = []
        self.loading: list[Job] = []  # admitted, KV loading from the host tier: no seat yet
        self.step: Step | None = None
        self.steps = 0
        self.preemptions = 0
        self.recomputed_tokens = 0
        self._hold_wake: float | None = None  # the hold expiry a wake is posted for
        self.hold_shares = HoldShares()

    @property
    def load(self) -> int:
        return len(self.running) + len(self.loading) + len(self.core.waiting)

    # ---- arrival -----------------------------------------------------------------

    def submit(self, job: Job, now: float, prior_service: float) -> None:
        spec = job.spec
        identity = CallIdentity(
            job.sent_as,
            thread_id=spec.thread,
            parent_thread_id=spec.parent_thread,
            call_id=spec.id,
            prior_service=prior_service,
            owner=job.program.owner,
            # A call the router held to the starvation bound goes as band 0.
            priority=0 if job.band == 0 else job.program.priority,
            router_wait_s=job.router_wait_s,
        )
        job.call = self.core.add_call(identity, now, prompt_tokens=spec.prompt_tokens, payload=job)
        self.hold_shares.owners.add(job.call.program.owner)
        job.wait_since = now
        if self.rules is not None:
            blocks = ceil_blocks(job.prompt, self.kv.block_size)
            self.rules.waiting(job.sent_as, job.context, blocks)
        self.core.enqueue(job.call)

    def end_program(self, program_id: str) -> None:
        """The program's client ended it (as the SDK does when a program returns): it
        leaves the table and its idle contexts are no longer held."""
        self.core.end_program(program_id)
        if self.rules is not None:
            for context in self.rules.release_program(program_id):
                self.kv.unpin(context)

    # ---- one (macro) step ----------------------------------------------------------

    def begin_step(self, now: float) -> Step | None:
        """Choose the batch for the next step at ``now``; None when there is nothing to run.

        The phases of vLLM V1's ``Scheduler.schedule()``, in its order: seats,
        running calls, waiting calls (only if no running call was preempted).
        """
        self._engage()
        self._expire_holds(now)
        self._free_seats_for_waiters(now)
        batch = _Batch(self.preset.token_budget)
        preempted = self._schedule_running(batch, now)
        # vLLM admits waiting calls only in a step that preempted nothing; a step its
        # preemptions left empty takes no time, and the next one admits.
        admits = not preempted or not batch.jobs
        if admits:
            self._schedule_waiting(batch, now)
        # A step that skipped admission is not repeated: the next one may admit.
        skipped = not admits and bool(self.core.waiting or self.loading)
        if self.residency is not None:
            self.hold_shares.observe(now, self.residency)
        return self._start(batch, now, steady=not (skipped and self.preset.exact_macro_steps))

    def _free_seats_for_waiters(self, now: float) -> None:
        """Preempt the running calls that better waiting calls displace from a full batch
        (calls whose KV has loaded take their seats first)."""
        free = self._free_seats() - len(self._loaded(now))
        admissible = None if self.residency is None else (lambda c: self._admissible(c.payload))
        for victim in self.core.victims([j.call for j in self.running], free, admissible):
            self._preempt(victim.payload, now)

    def _schedule_running(self, batch: _Batch, now: float) -> bool:
        """Give running calls, best first, their next tokens within the budget. When KV
        blocks run out, a running call not yet in the batch is preempted (the
        worst-ranked, or with residency the cheapest of the worst level); True if any
        was."""
        preempted: set[Job] = set()
        for job in self._running_in_rank_order(batch.budget):
            if job in preempted or batch.budget <= 0:
                continue
            tokens = min(job.missing, batch.budget)
            # An idle context of the call's own level gives way before a running call.
            while not self._grow(job, tokens, self.core.standing(job.call) - 1):
                victim = self._victim([j for j in self.running if j not in batch])
                self._preempt(victim, now)
                preempted.add(victim)
                if victim is job:
                    break
            else:
                batch.add(job, tokens)
        return bool(preempted)

    def _running_in_rank_order(self, budget: int) -> list[Job]:
        """The running calls, sorted by rank only when budget or blocks may not cover
        them all (a batch of decodes needs one token and at most one new block each)."""
        running = self.running
        n = len(running)
        if n > budget or n > self.kv.reclaimable or any(j.missing > 1 for j in running):
            rank = self.core.rank
            return sorted(running, key=lambda j: rank(j.call))
        return list(running)

    def _schedule_waiting(self, batch: _Batch, now: float) -> None:
        """Admit waiting calls in rank order while seats, budget and blocks last; the
        first that does not fit stops admission (head-of-line blocking, as in vLLM).
        Calls whose KV has loaded from the host go first, as vLLM drains them first."""
        if not self._resume_loaded(batch, now):
            return
        core = self.core
        for job in self._admission_order(batch):
            if batch.budget <= 0 or self._free_seats() <= 0:
                break
            if not self._resumed(job):
                continue  # its program is paused (a peer's rule): later calls may go
            # What holds the call may break: worse-ranked programs', or on an idle
            # engine any (nothing would free them sooner).
            level = core.standing(job.call) if self.running or self.loading else -1
            if not self._admissible(job):
                assert self.residency is not None
                # Starving, waited past the admission bound, or nothing runs.
                if job.call.promotions or level < 0 or self.residency.overdue(job.call, now):
                    self._make_room(self._footprint(job), level)
                    if not self._admissible(job):
                        break
                elif not self._cut_for(job, now):
                    continue  # outside the working set: it waits, later calls may go
            hit = self.kv.hit(job)
            reload = self.host.hit(job) - hit if self.host else 0
            self.kv.admit(job, hit)
            if reload > 0:
                if not self._start_load(job, reload * self.kv.block_size, now, level):
                    break
                continue
            tokens = min(job.missing, batch.budget)
            if not self._grow(job, tokens, level):
                self.kv.release(job)  # back out: it waits for blocks
                break
            self._take_hold(job)
            core.start(job.call)
            self._count_prompt(job)
            self._run(job, tokens, batch, now)
        self._wake_for_holds(now)

    def _admission_order(self, batch: _Batch) -> list[Job] | Iterator[Job]:
        """Waiting calls, best first. Without residency, only the head: admission stops
        at the first call that does not fit (head-of-line blocking, as in vLLM). With
        it, calls outside the working set are skipped, so the best few are looked at."""
        core = self.core
        if self.residency is None:
            return (core.peek().payload for _ in iter(lambda: bool(core.waiting), False))
        looked_at = min(self._free_seats(), batch.budget) + SKIPPED_WAITERS
        return [call.payload for call in core.waiting.best(looked_at)]

    def _count_prompt(self, job: Job) -> None:
        """Prefix-cache statistics of an admitted call: its GPU hit and its prompt."""
        self.kv.hit_tokens += job.computed
        self.kv.prompt_tokens += job.computed + job.missing
        if job.cached_tokens is None:  # its first admission: what its timeline shows
            job.cached_tokens = job.computed

    def _run(self, job: Job, tokens: int, batch: _Batch, now: float) -> None:
        job.wait_s += now - job.wait_since
        if job.scheduled_at is None:
            job.scheduled_at = now
        self.running.append(job)
        batch.add(job, tokens)

    def _start_load(self, job: Job, tokens: int, now: float, level: int) -> bool:
        """Admit ``job`` to load ``tokens`` of its prefix from the host tier; False if the
        blocks for them and its first chunk are not there (it keeps waiting)."""
        first_chunk = min(job.missing - tokens, self.preset.token_budget)
        if not self._grow(job, tokens + first_chunk, level):
            self.kv.release(job)
            return False
        assert self.host is not None
        self._take_hold(job)
        self.core.start(job.call)
        self._count_prompt(job)
        job.computed += tokens
        job.ready_at = self.host.load(job.context, tokens, now)
        self.loading.append(job)
        self.wake_at(self, job.ready_at)
        return True

    def _loaded(self, now: float) -> list[Job]:
        """Calls whose KV has loaded, best first."""
        rank = self.core.rank
        return sorted((j for j in self.loading if j.ready_at <= now), key=lambda j: rank(j.call))

    def _resume_loaded(self, batch: _Batch, now: float) -> bool:
        """Seat the calls whose KV has loaded; False if one of them still does not fit."""
        for job in self._loaded(now):
            if batch.budget <= 0 or self._free_seats() <= 0:
                return False
            tokens = min(job.missing, batch.budget)
            if not self._grow(job, tokens, self.core.standing(job.call)):
                return False
            self.loading.remove(job)
            self._run(job, tokens, batch, now)
        return True

    def _start(self, batch: _Batch, now: float, steady: bool) -> Step | None:
        """Time the batch as one step, or (if ``steady``) as a macro step of decode steps."""
        if not batch.decodes and not batch.prefills:
            loading = any(job.ready_at > now for job in self.loading)
            # Holds that will end, or paused programs that will resume, may let calls in.
            holding = self.residency is not None and (
                bool(self.residency.holds) or self.residency.next_expiry() is not None
            )
            if not loading and not holding and (self.running or self.core.waiting or self.loading):
                raise RuntimeError(f"engine {self.name}: a call does not fit in an empty engine")
            self.step = None  # idle, or until a load from the host tier is done
            return None
        preset = self.preset
        prefill_tokens = sum(n for _, n in batch.prefills)
        # Decodes read their whole context's KV; a prefill chunk attends to its
        # prefix and, causally, to itself.
        context = sum(j.computed + 1 for j in batch.decodes) if preset.per_context_token else 0
        pairs = (
            sum(n * job.computed + n * (n + 1) // 2 for job, n in batch.prefills)
            if preset.per_prefill_pair
            else 0
        )
        duration = preset.step_time(len(batch.decodes), prefill_tokens, context, pairs)
        growth = preset.per_context_token * len(batch.decodes)
        steady = steady and not batch.prefills
        repeat = self._steady_steps(batch.decodes, duration, growth, now) if steady else 1
        self.step = Step(batch.decodes, batch.prefills, duration, repeat, now, growth)
        return self.step

    def catch_up(self, now: float) -> bool:
        """Before a call arrives at ``now`` during a macro step: apply the steps that
        ended before ``now`` and start the one in progress, so that the call waits
        from the wait clock of that step, as with single steps. True if the current
        step changed (its end too)."""
        step = self.step
        if step is None or step.repeat == 1:
            return False
        ended = max(1, steps_to_reach(now - step.started, step.duration, step.growth)) - 1
        if ended == 0 or ended >= step.repeat:
            return False
        step.repeat = ended
        self.begin_step(self.finish_step())
        return True

    def truncate(self, now: float) -> bool:
        """An arrival (or a finished load) at ``now``: end the current macro step at the
        next step boundary."""
        step = self.step
        if step is None or step.repeat == 1:
            return False
        done = max(1, steps_to_reach(now - step.started, step.duration, step.growth))
        if done >= step.repeat:
            return False
        step.repeat = done
        return True

    @property
    def step_end(self) -> float:
        assert self.step is not None
        return self.step.end

    def finish_step(self) -> float:
        """Apply the current step's work; returns the time it ended."""
        step = self.step
        assert step is not None
        core, k = self.core, step.repeat
        now = step.end
        # Engine time is split among the calls by their share of the step's tokens.
        per_token = step.elapsed(k) / (len(step.decodes) + sum(n for _, n in step.prefills))
        self.steps += k
        finished = []
        for job, tokens in step.prefills:
            job.computed += tokens
            sampled = int(job.missing == 0)  # the last chunk samples a token
            if sampled and not job.decoded:
                job.first_token_at = now
            job.decoded += sampled
            job.program.remaining_work -= sampled
            core.charge(job.call, sampled, prefill_tokens=tokens, seconds=per_token * tokens)
            if job.decode_left <= 0:
                finished.append(job)
        for job in step.decodes:  # k steps: each computes the last token, samples one more
            if not job.decoded:  # a prompt's last token: the first step samples the first
                job.first_token_at = step.started + step.duration
            job.computed += k
            job.decoded += k
            job.program.remaining_work -= k
            core.charge(job.call, decode_tokens=k, seconds=per_token)
            if job.decode_left <= 0:
                finished.append(job)
        core.advance(now, steps=k)
        for job in finished:
            self.running.remove(job)
            self._release(job)
            core.finish(job.call, now)
            self._hold_idle(job, now)
            self.on_complete(job, now)
        self.step = None
        return now

    # ---- KV residency (KV-aware policies) ---------------------------------------------

    def _engage(self) -> None:
        """The residency's rules apply while the live contexts outgrow the host tier
        (``Residency.engaged``); stepping aside ends their holds."""
        rules = self.rules
        if rules is None:
            return
        if rules.engaged(self.core.table):
            self.residency = rules
        elif self.residency is not None:
            self.residency = None
            for context in rules.release_all():
                self.kv.unpin(context)

    def _resumed(self, job: Job) -> bool:
        """Whether the rule lets ``job``'s program run now (``Residency.admits``)."""
        assert job.call is not None
        return self.residency is None or self.residency.admits(job.call.program)

    def _footprint(self, job: Job) -> int:
        """Blocks ``job``'s whole context takes once admitted."""
        return ceil_blocks(job.prompt + job.decoded + 1, self.kv.block_size)

    def _admissible(self, job: Job) -> bool:
        """The working-set rule: a call whose context is resident (held, or in use by a
        running call) may always be admitted; any other only if it fits."""
        if self.residency is None or job.context in self.kv.pins:
            return True
        if not self.residency.working_set:
            return self._resumed(job)
        return self._fits(self._footprint(job))

    def _fits(self, blocks: int) -> bool:
        assert self.residency is not None
        return self.residency.fits(blocks, self.kv.reclaimable, self.kv.largest_pinned())

    def _grow(self, job: Job, tokens: int, level: int) -> bool:
        """:meth:`KVPool.grow`, breaking holds of programs worse than ``level`` if blocks
        run out."""
        if self.kv.grow(job, tokens):
            return True
        if self.residency is None:
            return False
        for context in self.residency.breakable(level):
            self._break_hold(context)
            if self.kv.grow(job, tokens):
                return True
        return False

    def _make_room(self, blocks: int, level: int) -> None:
        """Break holds of programs worse than ``level`` (-1: any) until ``blocks`` fit
        beside the headroom."""
        assert self.residency is not None
        for context in self.residency.breakable(level):
            if self._fits(blocks):
                return
            self._break_hold(context)

    def _cut_for(self, job: Job, now: float) -> bool:
        """``job`` waits outside the working set: other owners' claims past their fair
        share are cut (``Residency.cut_for``) and those that end now released. True
        if that let ``job`` in."""
        assert self.residency is not None and job.call is not None
        cut = self.residency.cut_for(
            job.call.program.owner, now, self._footprint(job), self.kv.reclaimable,
            self.kv.largest_pinned(),
        )  # fmt: skip
        if cut:
            self._expire_holds(now)
        return bool(cut) and self._admissible(job)

    def _break_hold(self, context: str) -> None:
        assert self.residency is not None
        self.residency.break_hold(context)
        self.kv.unpin(context)

    def _take_hold(self, job: Job) -> None:
        """``job`` was admitted: its context's hold, if any, ends (the call pins it now)."""
        if self.residency is not None and self.residency.take(job.context):
            self.kv.unpin(job.context)

    def _hold_idle(self, job: Job, now: float) -> None:
        """``job`` completed: hold its context if no other call uses it and the
        residency grants it, for the client's hint if the call carried one."""
        residency, context = self.residency, job.context
        if residency is None or context in self.kv.pins or context not in self.kv.cache:
            return
        assert job.call is not None
        blocks = self.kv.context_blocks(context)
        hint_s = job.retention_hint_s
        for ended in residency.hold(context, job.call.program, blocks, now, hint_s):
            self.kv.unpin(ended)
        if context in residency:
            self.kv.pin(context)

    def _expire_holds(self, now: float) -> None:
        if self.residency is not None:
            for context in self.residency.expired(now):
                self.kv.unpin(context)

    def _wake_for_holds(self, now: float) -> None:
        """Calls wait outside the working set: step again when the next hold expires."""
        if self.residency is None or not self.core.waiting:
            return
        expiry = self.residency.next_expiry()
        if expiry is not None and expiry > now and expiry != self._hold_wake:
            self._hold_wake = expiry
            self.wake_at(self, expiry)

    def _victim(self, candidates: list[Job]) -> Job:
        """The running call to preempt when KV runs out, of ``candidates``."""
        rank = self.core.policy.rank
        if self.residency is None or not self.residency.retention.cheap_victims:
            return max(candidates, key=lambda j: rank(j.call))
        victim = self.residency.victim([j.call for j in candidates], rank, self._undo_cost)
        return victim.payload

    def _undo_cost(self, call: Call) -> float:
        """What a preemption of ``call`` costs to undo (the core's ``undo_cost``): its
        computed tokens, less what the host tier would reload instead."""
        job: Job = call.payload
        reloadable = self.host.cache.get(job.context, 0) if self.host else 0
        return undo_cost(job.computed, reloadable)

    # ---- helpers -------------------------------------------------------------------

    def _free_seats(self) -> int:
        return self.preset.max_num_seqs - len(self.running)

    def _release(self, job: Job) -> int:
        """``job`` leaves the batch; its KV goes to the prefix cache and the host tier.
        Returns the tokens of it the host tier holds."""
        kept = min(job.computed, self.host.store(job.context, job.computed)) if self.host else 0
        self.kv.release(job)
        return kept

    def _preempt(self, job: Job, now: float) -> None:
        self.running.remove(job)
        # What the host tier keeps is reloaded, not recomputed.
        self.recomputed_tokens += job.computed - self._release(job)
        self.preemptions += 1
        job.wait_since = now
        self.core.preempt(job.call)

    def _steady_steps(self, plan: list[Job], duration: float, growth: float, now: float) -> int:
        """How many decode-only steps (the first ``duration`` long, each next one
        ``growth`` longer, from ``now``) can run before anything changes."""
        core = self.core
        k = min(job.decode_left for job in plan)
        # Enough blocks for every job to cross its block boundaries? While a call
        # waits for blocks with a seat free, only free ones: evicting a cached prefix
        # changes what the waiter needs, and may let it in.
        bs = self.kv.block_size
        blocks = self.kv.reclaimable
        if self.preset.exact_macro_steps and core.waiting and self._free_seats() > 0:
            blocks = self.kv.free
        k = min(k, max(1, (blocks // len(plan)) * bs))
        expiry = self.residency.next_expiry() if self.residency is not None else None
        if expiry is not None:  # a hold that ends frees blocks and may admit a waiter
            k = min(k, max(1, steps_to_reach(expiry - now, duration, growth)))
        if core.waiting:
            # A demotion or a starvation promotion may let a waiter preempt.
            # Service per call in the first step, and how much more in each next one.
            per_step = core.meter.amount(1, 0, duration / len(plan))
            per_step_growth = core.meter.amount(0, 0, growth / len(plan))
            for job in plan:
                left = core.next_demotion(job.call)
                if left != math.inf:
                    k = min(k, max(1, steps_to_reach(left, per_step, per_step_growth)))
            deadline = core.next_promotion()
            if deadline is not None:
                timed = core.meter.unit == "time"
                clock_step, clock_growth = (duration, growth) if timed else (1.0, 0.0)
                k = min(k, max(1, steps_to_reach(deadline - core.clock, clock_step, clock_growth)))
        return max(1, k)
