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

KV is counted in blocks. With prefix caching a finished or preempted call's
blocks stay cached for its program (LRU across programs), so the program's next
call on this engine prefills only what is new; on another engine it starts cold.

A step with only decodes repeats identically until something changes, so the
engine runs such stretches as one *macro step* of k steps (until the first
completion, demotion, starvation promotion or block boundary, or an arrival,
which truncates it). This is what makes a sweep run in seconds.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..policy import Call, ProgramScheduler
from ..workloads.trace import CallSpec
from .presets import EnginePreset


@dataclass(eq=False)
class ProgramRun:
    """A program being replayed: what is done and what is left."""

    program_id: str
    arrival: float
    calls_left: int
    decode_total: int
    remaining_work: float  # decode tokens still to produce (the SRPT oracle's view)
    end: float = 0.0
    done: set[str] = field(default_factory=set)


@dataclass(eq=False, slots=True)
class Job:
    """One call on one engine."""

    spec: CallSpec
    program: ProgramRun
    call: Call | None = None
    prompt: int = 0  # at least one token, as in vLLM
    computed: int = 0  # tokens whose KV exists (prefix hit + prefilled + decoded)
    decoded: int = 0
    hit_blocks: int = 0  # leading blocks shared with the program's cached prefix
    own_blocks: int = 0
    wait_since: float = 0.0
    wait_s: float = 0.0

    def __post_init__(self) -> None:
        self.prompt = max(self.spec.prompt_tokens, 1)

    @property
    def missing(self) -> int:
        """Tokens without KV yet: the prompt and, once decoding, the last sampled
        token. After a preemption, everything again."""
        return self.prompt + self.decoded - self.computed

    @property
    def decode_left(self) -> int:
        return self.spec.decode_tokens - self.decoded


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class KVPool:
    """Blocks in use by running calls plus a per-program LRU prefix cache.

    A program's cache entry is the longest context of it that was computed here;
    entries whose blocks a running call shares (a prefix hit) are pinned.
    """

    def __init__(self, capacity: int, block_size: int, prefix_caching: bool) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.used = 0
        self.cached_blocks = 0
        self.pinned_blocks = 0
        self.cache: OrderedDict[str, int] = OrderedDict()  # program -> cached tokens
        self.pins: dict[str, int] = {}
        self.hit_tokens = 0
        self.prompt_tokens = 0

    @property
    def free(self) -> int:
        return self.capacity - self.used - self.cached_blocks

    @property
    def reclaimable(self) -> int:
        """Blocks that are free or can be freed by evicting unpinned cache entries."""
        return self.capacity - self.used - self.pinned_blocks

    def reclaim(self, need: int) -> bool:
        """Evict least recently used, unpinned entries until ``need`` blocks are free."""
        freed = self.free
        if freed >= need:
            return True
        if self.reclaimable < need:
            return False
        victims = []
        for pid, tokens in self.cache.items():
            if pid not in self.pins:
                victims.append(pid)
                freed += _blocks(tokens, self.block_size)
                if freed >= need:
                    break
        for pid in victims:
            self.cached_blocks -= _blocks(self.cache.pop(pid), self.block_size)
        return True

    def hit(self, job: Job) -> int:
        """Full blocks of ``job``'s prompt its program has cached here (at least one token
        is always computed, as in vLLM)."""
        if not self.prefix_caching:
            return 0
        cached = self.cache.get(job.program.program_id, 0)
        return max(0, min(cached, job.missing - 1)) // self.block_size

    def admit(self, job: Job, hit_blocks: int) -> None:
        pid = job.program.program_id
        job.hit_blocks = hit_blocks
        job.computed = hit_blocks * self.block_size
        if hit_blocks:
            self.cache.move_to_end(pid)
            if pid not in self.pins:
                self.pins[pid] = 0
                self.pinned_blocks += _blocks(self.cache[pid], self.block_size)
            self.pins[pid] += 1

    def grow(self, job: Job, tokens: int) -> bool:
        """Make room for ``tokens`` more of ``job``'s KV; False if the pool is full."""
        held = job.hit_blocks + job.own_blocks
        if job.computed + tokens <= held * self.block_size:
            return True  # fits in its last block
        need = _blocks(job.computed + tokens, self.block_size) - held
        if need <= 0:
            return True
        if not self.reclaim(need):
            return False
        job.own_blocks += need
        self.used += need
        return True

    def release(self, job: Job) -> None:
        """The job left the batch; with prefix caching its KV stays cached."""
        pid = job.program.program_id
        bs = self.block_size
        self.used -= job.own_blocks
        job.own_blocks = 0
        if job.hit_blocks:
            job.hit_blocks = 0
            self.pins[pid] -= 1
            if not self.pins[pid]:
                del self.pins[pid]
                self.pinned_blocks -= _blocks(self.cache[pid], bs)
        if self.prefix_caching and job.computed:
            old = self.cache.get(pid, 0)
            new = max(old, job.computed)
            grown = _blocks(new, bs) - _blocks(old, bs)
            self.cached_blocks += grown
            if pid in self.pins:
                self.pinned_blocks += grown
            self.cache[pid] = new
            self.cache.move_to_end(pid)
            self.reclaim(0)
        job.computed = 0


@dataclass
class Step:
    """What one (macro) step runs, how long one step takes and how often it repeats."""

    decodes: list[Job]
    prefills: list[tuple[Job, int]]  # job, prompt tokens computed this step
    duration: float
    repeat: int
    started: float


@dataclass
class _Batch:
    """The calls chosen for the next step, and the token budget they leave."""

    budget: int
    decodes: list[Job] = field(default_factory=list)
    prefills: list[tuple[Job, int]] = field(default_factory=list)  # job, prompt tokens

    def add(self, job: Job, tokens: int) -> None:
        if job.missing == 1:  # the last sampled token: a decode
            self.decodes.append(job)
        else:
            self.prefills.append((job, tokens))
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
    ) -> None:
        self.name = name
        self.preset = preset
        self.core = core
        self.kv = KVPool(preset.kv_blocks, preset.block_size, prefix_caching)
        self.on_complete = on_complete
        self.running: list[Job] = []
        self.step: Step | None = None
        self.steps = 0
        self.preemptions = 0
        self.recomputed_tokens = 0

    @property
    def load(self) -> int:
        return len(self.running) + len(self.core.waiting)

    # ---- arrival -----------------------------------------------------------------

    def submit(self, job: Job, now: float, prior_service: float) -> None:
        spec = job.spec
        job.call = self.core.add_call(
            spec.id,
            job.program.program_id,
            now,
            thread_id=spec.thread,
            parent_thread_id=spec.parent_thread,
            prior_service=prior_service,
            prompt_tokens=spec.prompt_tokens,
            payload=job,
        )
        job.wait_since = now
        self.core.enqueue(job.call)

    # ---- one (macro) step ----------------------------------------------------------

    def begin_step(self, now: float) -> Step | None:
        """Choose the batch for the next step at ``now``; None when there is nothing to run.

        The phases of vLLM V1's ``Scheduler.schedule()``, in its order: seats,
        running calls, waiting calls (only if no running call was preempted).
        """
        self._free_seats_for_waiters(now)
        batch = _Batch(self.preset.token_budget)
        if not self._schedule_running(batch, now):
            self._schedule_waiting(batch, now)
        return self._start(batch, now)

    def _free_seats_for_waiters(self, now: float) -> None:
        """Preempt the running calls that better waiting calls displace from a full batch."""
        for victim in self.core.victims([j.call for j in self.running], self._free_seats()):
            self._preempt(victim.payload, now)

    def _schedule_running(self, batch: _Batch, now: float) -> bool:
        """Give running calls, best first, their next tokens within the budget. When KV
        blocks run out, the worst-ranked running call is preempted; True if any was."""
        rank = self.core.policy.rank
        preempted: set[Job] = set()
        for job in self._running_in_rank_order(batch.budget):
            if job in preempted or batch.budget <= 0:
                continue
            tokens = min(job.missing, batch.budget)
            while not self.kv.grow(job, tokens):
                victim = max(self.running, key=lambda j: rank(j.call))
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
            rank = self.core.policy.rank
            return sorted(running, key=lambda j: rank(j.call))
        return list(running)

    def _schedule_waiting(self, batch: _Batch, now: float) -> None:
        """Admit waiting calls in rank order while seats, budget and blocks last; the
        first that does not fit stops admission (head-of-line blocking, as in vLLM)."""
        core = self.core
        while batch.budget > 0 and self._free_seats() > 0 and core.waiting:
            job = core.peek().payload
            self.kv.admit(job, self.kv.hit(job))
            tokens = min(job.missing, batch.budget)
            if not self.kv.grow(job, tokens):
                self.kv.release(job)  # back out: it waits for blocks
                break
            core.start(job.call)
            self.kv.hit_tokens += job.computed
            self.kv.prompt_tokens += job.computed + job.missing
            job.wait_s += now - job.wait_since
            self.running.append(job)
            batch.add(job, tokens)

    def _start(self, batch: _Batch, now: float) -> Step | None:
        """Time the batch as one step, or as a macro step of identical decode steps."""
        if not batch.decodes and not batch.prefills:
            if self.running or self.core.waiting:
                raise RuntimeError(f"engine {self.name}: a call does not fit in an empty engine")
            self.step = None
            return None
        prefill_tokens = sum(n for _, n in batch.prefills)
        duration = self.preset.step_time(len(batch.decodes), prefill_tokens)
        repeat = self._steady_steps(batch.decodes, duration) if not batch.prefills else 1
        self.step = Step(batch.decodes, batch.prefills, duration, repeat, now)
        return self.step

    def truncate(self, now: float) -> bool:
        """An arrival at ``now``: end the current macro step at the next step boundary."""
        step = self.step
        if step is None or step.repeat == 1:
            return False
        done = max(1, math.ceil((now - step.started) / step.duration - 1e-9))
        if done >= step.repeat:
            return False
        step.repeat = done
        return True

    @property
    def step_end(self) -> float:
        assert self.step is not None
        return self.step.started + self.step.duration * self.step.repeat

    def finish_step(self) -> float:
        """Apply the current step's work; returns the time it ended."""
        step = self.step
        assert step is not None
        core, k = self.core, step.repeat
        now = step.started + step.duration * k
        # Engine time is split among the calls by their share of the step's tokens.
        per_token = step.duration * k / (len(step.decodes) + sum(n for _, n in step.prefills))
        self.steps += k
        finished = []
        for job, tokens in step.prefills:
            job.computed += tokens
            sampled = int(job.missing == 0)  # the last chunk samples a token
            job.decoded += sampled
            job.program.remaining_work -= sampled
            core.charge(job.call, sampled, prefill_tokens=tokens, seconds=per_token * tokens)
            if job.decode_left <= 0:
                finished.append(job)
        for job in step.decodes:  # k steps: each computes the last token, samples one more
            job.computed += k
            job.decoded += k
            job.program.remaining_work -= k
            core.charge(job.call, decode_tokens=k, seconds=per_token)
            if job.decode_left <= 0:
                finished.append(job)
        core.advance(now, steps=k)
        for job in finished:
            self.running.remove(job)
            self.kv.release(job)
            core.finish(job.call, now)
            self.on_complete(job, now)
        self.step = None
        return now

    # ---- helpers -------------------------------------------------------------------

    def _free_seats(self) -> int:
        return self.preset.max_num_seqs - len(self.running)

    def _preempt(self, job: Job, now: float) -> None:
        self.running.remove(job)
        self.recomputed_tokens += job.computed
        self.kv.release(job)
        self.preemptions += 1
        job.wait_since = now
        self.core.preempt(job.call)

    def _steady_steps(self, plan: list[Job], duration: float) -> int:
        """How many identical decode-only steps can run before anything changes."""
        core = self.core
        k = min(job.decode_left for job in plan)
        # Enough free blocks for every job to cross its block boundaries?
        bs = self.kv.block_size
        k = min(k, max(1, (self.kv.reclaimable // len(plan)) * bs))
        if core.waiting:
            # A demotion or a starvation promotion may let a waiter preempt.
            per_step = core.meter.amount(1, 0, duration / len(plan))
            for job in plan:
                left = core.next_demotion(job.call)
                if left != math.inf:
                    k = min(k, max(1, math.ceil(left / per_step - 1e-9)))
            deadline = core.next_promotion()
            if deadline is not None:
                clock_step = duration if core.meter.unit == "time" else 1.0
                k = min(k, max(1, math.ceil((deadline - core.clock) / clock_step - 1e-9)))
        return max(1, k)
