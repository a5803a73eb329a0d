"""The program-aware scheduler core, shared by the vLLM engine and the simulator.

The engine (or simulator) owns the batch; this core owns every decision about
order. The life of a call, and the method the engine calls at each point:

    add_call   a call arrives: register it in the process table, give it a level
               (or, if it cannot join its program, run it alone: see add_call)
    enqueue    it waits (on arrival, and again after a preemption)
    pop/peek   the engine admits the best waiting call into the batch
    start      it runs: its waiting stops counting
    charge     each step: it attained service; it may be demoted a level
    victims    each step: running calls a better waiting call should displace
    preempt    a victim goes back to waiting
    finish     it completed (or was aborted): its program's service is updated
    advance    each step: the wait clock moves; starving calls are promoted

Above the policy stand the tenants (:class:`~.config.TenantConfig`): a call
ranks by its band first (its program's priority class, 0 the best; a worse
band's call ranks as band 0 once it has waited ``band_aging_s``, counted from
when it reached the router), then by its
owner's share of the service (:class:`OwnerShares`), then by the policy. With
one owner and one band the order is the policy's alone.

Waiting is measured on a *wait clock* in the unit of service: engine steps for
the token unit (a running call decodes one token per step) and seconds for the
time unit, so the anti-starvation ratio compares like with like.

A policy that fails for one call never stops the core: that call gets a
neutral answer (it runs alone, ranks by its level, preempts nothing) and the
failure is counted in :attr:`ProgramScheduler.faults`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..protocol.identity import CallIdentity
from .bounded import swept_all
from .config import PolicyConfig, TenantConfig
from .faults import Faults, Hook
from .policies import Policy
from .queue import WaitQueue
from .residency import SKIPPED_WAITERS
from .table import Call, CallState, ProcessTable, Program, Rank

# The table is swept for idle programs at most this often (seconds).
_EVICT_INTERVAL_S = 1.0

# Program id prefix of a call that runs alone: it has no program id, or it
# could not join its program (see ProgramScheduler.add_call).
ALONE_PREFIX = "alone:"


@dataclass
class Counters:
    preemptions: int = 0
    promotions: int = 0
    demotions: int = 0
    calls_admitted: int = 0
    calls_finished: int = 0
    calls_aborted: int = 0


class OwnerShares:
    """Each owner's share of the service: what its calls attained, over its weight.

    The wait queue serves the owner with the least share first inside a band,
    so a key's programs share one account and splitting an agent into many
    programs gains nothing. An owner that arrives while nothing of its own is
    in flight starts no lower than the least share of the owners that are: it
    gets no credit for the time it was away (as in start-time fair queuing).

    An owner's weight is the one its calls state (the router states its key's,
    ``CallIdentity.weight``; the latest call's counts), else
    :meth:`TenantConfig.weight`.
    """

    def __init__(self, config: TenantConfig) -> None:
        self.config = config
        self._share: dict[str, float] = {}
        self._in_flight: Counter[str] = Counter()  # owner -> its calls in flight (> 0)
        self._stated: dict[str, float] = {}  # owner -> the weight its calls stated

    def share(self, owner: str) -> float:
        return self._share.get(owner, 0.0)

    def weight(self, owner: str) -> float:
        stated = self._stated.get(owner)
        return stated if stated is not None else self.config.weight(owner)

    def arrived(self, owner: str, weight: float | None = None) -> None:
        """A call of ``owner`` arrived, stating ``weight`` for its owner (None: none)."""
        if weight is not None:
            self._stated[owner] = weight
        if not self._in_flight[owner] and self._in_flight:
            floor = min(self.share(other) for other in self._in_flight)
            self._share[owner] = max(self.share(owner), floor)
        self._in_flight[owner] += 1

    def left(self, owner: str) -> None:
        """A call of ``owner`` finished or was aborted."""
        self._in_flight[owner] -= 1
        if not self._in_flight[owner]:
            del self._in_flight[owner]

    def charge(self, owner: str, amount: float) -> None:
        self._share[owner] = self.share(owner) + amount / self.weight(owner)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Each owner that has had a call: its share (service over weight) and weight."""
        owners = self._share.keys() | self._in_flight.keys()
        return {o: {"share": self.share(o), "weight": self.weight(o)} for o in sorted(owners)}


class ProgramScheduler:
    """Ranks calls by their program's attained service (PLAS/ATLAS and baselines)."""

    def __init__(
        self,
        policy: Policy,
        config: PolicyConfig | None = None,
        table: ProcessTable | None = None,
        seats: int | None = None,
    ) -> None:
        self.policy = policy
        # The engine's batch size; scales the starvation threshold with the queue
        # (see _contention). None: the plain threshold, as in the paper.
        self.seats = seats
        self.config = config or PolicyConfig()
        self.levels = self.config.levels
        self._last_level = len(self.levels) - 1
        self.meter = self.config.meter
        self.table = table or ProcessTable(self.config.table)
        self.shares = OwnerShares(self.config.tenants)
        self.waiting = WaitQueue(self.shares.share)
        self.counters = Counters()
        self.faults = Faults()
        self.clock = 0.0
        self._seq = itertools.count()
        self._starving: list[tuple[float, int, int, Call]] = []  # (deadline, seq, version, call)
        self._aging: list[tuple[float, int, Call]] = []  # (arrival + band_aging_s, seq, call)
        self._aging_seq = itertools.count()
        self._next_evict_s = 0.0

    # ---- arrival -----------------------------------------------------------------

    def add_call(
        self,
        identity: CallIdentity,
        now_s: float,
        *,
        request_id: str | None = None,
        prompt_tokens: int = 0,
        payload: Any = None,
        alone_id: str | None = None,
    ) -> Call:
        """Register a newly arrived call; it enters the level of its program's service.

        The call's id is ``identity.call_id``, else ``request_id`` (the engine's
        own id for the request). Its ``prior_service`` (service the program
        attained elsewhere, as a router reports it) raises the program's own
        count, up to the limits' ``max_prior_service``.

        A call that cannot join its program runs alone, as the one call of
        program ``alone_id`` (default ``ALONE_PREFIX + call_id``), which
        leaves the table when the call completes. That happens when it has no
        program id, when it would grow its program past the table's limits
        (counted in ``table.calls_over_limit``), or when the policy fails to
        place it (counted in :attr:`faults`).
        """
        call_id = identity.call_id or request_id
        if call_id is None:
            raise ValueError("a call needs a call id or a request id")
        if identity.program_id is not None:
            crossed = self.table.limit_crossed(identity)
            if crossed is None:
                call = self._join(call_id, identity, now_s)
                if call is not None:
                    return self._admit(call, prompt_tokens, payload)
            else:
                self.table.calls_over_limit[crossed.limit] += 1
        program = self.table.open(
            alone_id or ALONE_PREFIX + call_id,
            now_s,
            owner=identity.owner,
            band=self._band(identity),
        )
        program.ended = True  # it leaves the table with its only call
        call = Call(call_id, program, program.thread(None), now_s, identity=identity)
        base = self._base(call, "the call ranks as a new program")
        call.base = 0.0 if base is None else base
        return self._admit(call, prompt_tokens, payload)

    def _join(self, call_id: str, identity: CallIdentity, now_s: float) -> Call | None:
        """The call as part of its program; None if the policy cannot place it."""
        assert identity.program_id is not None
        band = self._band(identity)
        program = self.table.open(identity.program_id, now_s, owner=identity.owner, band=band)
        # A call asks for its own class (the SDK's ``autellix.priority`` block): the
        # program stands in its latest call's band, its idle context's holds too.
        program.band = band
        if not program.busy and program.last_completion_s is not None:
            program.gaps += 1  # it was idle, in a tool, since its last call ended
            program.gap_total_s += max(0.0, now_s - program.last_completion_s)
        program.last_arrival_s = now_s
        if identity.prior_service:
            prior_service = self.table.bounds.limits.bounded_prior_service(identity.prior_service)
            program.attained_service = max(program.attained_service, prior_service)
        thread = program.thread(identity.thread_id, identity.parent_thread_id)
        call = Call(call_id, program, thread, now_s, identity=identity)
        call.reuse = program.is_reuse(call_id)
        base = self._base(call, "the call runs alone")
        if base is None:
            return None
        call.base = base
        return call

    def _band(self, identity: CallIdentity) -> int:
        return self.config.tenants.band(identity.owner, identity.priority)

    def _admit(self, call: Call, prompt_tokens: int, payload: Any) -> Call:
        """Give a placed call its level and count it in flight."""
        call.prompt_tokens = prompt_tokens
        call.payload = payload
        if self.policy.uses_levels:
            call.level = self.levels.level_of(call.base)
            call.quantum_left = self.levels.quanta[call.level]
        call.band = call.program.band
        if call.band > 0:
            # The router's gate may have held it: that wait counts towards the bound.
            ages_at = self.config.tenants.band_aged_at(call.arrival_s, call.identity.router_wait_s)
            call.ages_at = ages_at
            if ages_at <= call.arrival_s:
                call.band = 0  # held the whole bound already: band 0 from the start
            else:
                heapq.heappush(self._aging, (ages_at, next(self._aging_seq), call))
        self.shares.arrived(call.program.owner, call.identity.weight)
        self._enter_level(call)
        call.program.active_calls[id(call)] = call
        call.thread.active_calls += 1
        call.thread.calls += 1
        self.counters.calls_admitted += 1
        return call

    # ---- the policy's answers, each failure confined to its call ----------------

    def _base(self, call: Call, fallback: str) -> float | None:
        """The policy's base for ``call`` (a number); None if it fails to give one."""
        try:
            base = float(self.policy.base(call))
            if math.isnan(base):
                raise ValueError("the base is NaN")
            return base
        except Exception as error:
            self.faults.record(Hook.BASE, error, fallback)
            return None

    def program_level(self, program: Program) -> int:
        """The :meth:`standing` the next call of ``program`` would enter with: its
        band's, at its level (the last level if the policy fails; level 0 for
        policies without levels). Holds of idle contexts compare by it."""
        if not self.policy.uses_levels:
            return self._standing(program.band, 0)
        try:
            level = self.levels.level_of(float(self.policy.program_base(program)))
        except Exception as error:
            self.faults.record(Hook.PROGRAM_BASE, error, "the program ranks last")
            level = self._last_level
        return self._standing(program.band, level)

    def standing(self, call: Call) -> int:
        """``call``'s band and level as one number, smaller better: every level of a
        band ranks ahead of the next band's. With one band it is the level. What
        holds of idle contexts and vLLM's own priority compare."""
        return self._standing(call.band, call.level)

    def _standing(self, band: int, level: int) -> int:
        return band * len(self.levels) + level

    def rank(self, call: Call) -> Rank:
        """Where ``call`` stands now, smaller first: its band, its owner's share,
        then the policy's rank (the order the engine runs and preempts by)."""
        return (call.band, self.shares.share(call.program.owner), *self._policy_rank(call))

    def _policy_rank(self, call: Call) -> Rank:
        """The policy's rank for ``call``; if it fails, the call ranks by its level."""
        try:
            return self.policy.rank(call)
        except Exception as error:
            self.faults.record(Hook.RANK, error, "the call ranks by its level")
            return (call.level, call.seq)

    def outranks(self, waiter: Call, victim: Call) -> bool:
        """Whether ``waiter`` may preempt ``victim``: a better band always may, a
        worse one never; in one band, the policy says (if it fails, it may not)."""
        if waiter.band != victim.band:
            return waiter.band < victim.band
        try:
            return self.policy.outranks(waiter, victim)
        except Exception as error:
            self.faults.record(Hook.OUTRANKS, error, "no preemption for that pair")
            return False

    # ---- the wait queue ----------------------------------------------------------

    def enqueue(self, call: Call) -> None:
        """The call waits: on arrival, or after a preemption."""
        call.state = CallState.WAITING
        call.wait_started = self.clock
        self.waiting.push(call, self._policy_rank(call))
        self._watch_starvation(call)

    def peek(self) -> Call | None:
        return self.waiting.peek()

    def pop(self) -> Call:
        return self.waiting.pop()

    def remove(self, call: Call) -> bool:
        return self.waiting.remove(call)

    def requeue(self, call: Call) -> None:
        """A popped call the engine did not admit after all goes back; it has been
        waiting all along, so its waiting stretch continues."""
        if call.state is not CallState.WAITING or call.queued:
            raise ValueError(f"call {call.call_id} was not popped from the wait queue")
        self.waiting.push(call, self._policy_rank(call))
        self._watch_starvation(call)

    def start(self, call: Call) -> None:
        """The call was admitted into the batch: its waiting stops here."""
        self.waiting.remove(call)
        self._stop_waiting(call)
        call.decoded_since_start = 0
        call.state = CallState.RUNNING

    # ---- each step ----------------------------------------------------------------

    def advance(self, now_s: float, steps: float = 1.0) -> None:
        """Move the wait clock by ``steps`` engine steps (or to ``now_s`` in time units)."""
        self.clock = now_s if self.meter.unit == "time" else self.clock + steps
        self._age_bands(now_s)
        self._promote_starving()
        if now_s >= self._next_evict_s:
            # One bounded batch a step; after a full batch, the next step sweeps again.
            swept = swept_all(self.table.evict_idle(now_s))
            self._next_evict_s = now_s + _EVICT_INTERVAL_S if swept else now_s

    def charge(
        self, call: Call, decode_tokens: int = 0, prefill_tokens: int = 0, seconds: float = 0.0
    ) -> None:
        """Account the work one step did for ``call``; demote it when its quantum is spent.

        Engines pass the step's tokens under either unit: the time unit's service
        is ``seconds``, but :meth:`displaceable` counts decoded tokens.
        """
        call.decoded_since_start += decode_tokens
        amount = self.meter.amount(decode_tokens, prefill_tokens, seconds)
        if amount <= 0:
            return
        self.shares.charge(call.program.owner, amount)
        call.service += amount
        call.starve_service += amount
        if not self.policy.uses_levels:
            return
        call.quantum_left -= amount
        while call.quantum_left <= 0 and call.level < self._last_level:
            call.level += 1
            call.quantum_left += self.levels.quanta[call.level]
            self._enter_level(call)
            self.counters.demotions += 1
            self.waiting.rerank(call, self._policy_rank(call))

    def _enter_level(self, call: Call) -> None:
        """``call`` joins the tail of its level; its program keeps the place its first
        call to enter that level took."""
        call.seq = next(self._seq)
        call.program_seq = call.program.level_entries.setdefault(call.level, call.seq)

    def next_demotion(self, call: Call) -> float:
        """Service ``call`` can still attain before its next demotion (inf if none)."""
        if not self.policy.uses_levels or call.level >= self._last_level:
            return float("inf")
        return max(call.quantum_left, 0.0)

    def worst(self, running: Iterable[Call]) -> Call:
        """The running call to preempt first: the worst rank."""
        return max(running, key=self.rank)

    def displaceable(self, running: Iterable[Call], waiting_band: int | None = None) -> list[Call]:
        """The running calls a better waiting call may displace: those that have
        decoded, since they were admitted, at least their prompt's service
        (``prompt_tokens`` at the meter's prefill weight).

        Preempting a call throws its computed context away (vLLM frees its
        blocks, and a context outside the working set waits to come back), so
        its prompt is prefilled again when it returns. Until a call has done as
        much work as that, displacing it costs more than it gained: the
        rent-or-buy rule, which bounds the work a preemption wastes by the work
        the call did. Without it, a late program's first call is demoted by its
        own prompt during its prefill, and the next new program takes its seat
        just after the prefill (docs/scheduling.md, "Levels").
        Preemption for lack of KV blocks is not bound by this rule, nor is a call
        of a band worse than ``waiting_band`` (the best waiting call's): a class
        goes first whatever the worse class's call has done.
        """
        weight = self.meter.prefill_weight
        worse = math.inf if waiting_band is None else waiting_band
        return [
            c
            for c in running
            if c.band > worse or c.decoded_since_start >= weight * c.prompt_tokens
        ]

    def victims(
        self,
        running: Sequence[Call],
        free_seats: int,
        admissible: Callable[[Call], bool] | None = None,
    ) -> list[Call]:
        """Running calls that better waiting calls should displace from a full batch.

        The best ``free_seats`` waiters take the free seats; each waiter after them
        displaces the worst remaining :meth:`displaceable` running call if it
        outranks it (a strictly better level), so preemption never happens within
        a level. With ``admissible`` (a KV-aware engine's working-set rule), only
        waiters it admits count: a call that would not be admitted displaces
        nobody.
        """
        best = self.waiting.peek()
        if best is None:
            return []
        running = self.displaceable(running, best.band)
        if not running:
            return []
        free_seats = max(free_seats, 0)
        waiters = self._best_waiters(free_seats + 1, admissible)
        if len(waiters) <= free_seats:
            return []
        worst = self.worst(running)
        if not self.outranks(waiters[free_seats], worst):
            return []
        # At least one preemption: pair the waiters, best first, with the running
        # calls, worst first, while the waiter is better.
        by_badness = sorted(running, key=self.rank, reverse=True)
        waiters = self._best_waiters(free_seats + len(by_badness), admissible)[free_seats:]
        chosen = []
        for waiter, victim in zip(waiters, by_badness, strict=False):
            if not self.outranks(waiter, victim):
                break
            chosen.append(victim)
        return chosen

    def _best_waiters(self, limit: int, admissible: Callable[[Call], bool] | None) -> list[Call]:
        if admissible is None:
            return self.waiting.best(limit)
        looked_at = self.waiting.best(limit + SKIPPED_WAITERS)
        return [call for call in looked_at if admissible(call)][:limit]

    def preempt(self, call: Call) -> None:
        """A running call was evicted from the batch: it waits again."""
        call.preemptions += 1
        self.counters.preemptions += 1
        self.enqueue(call)

    # ---- completion ---------------------------------------------------------------

    def finish(self, call: Call, now_s: float, aborted: bool = False) -> None:
        """A call completed, or was aborted: its program is charged the service it
        attained either way (an abort's computed prefill and decode are real work)."""
        if call.state is CallState.FINISHED:
            return
        if call.state is CallState.WAITING:
            self.waiting.remove(call)
            self._stop_waiting(call)
        call.state = CallState.FINISHED
        program = call.program
        charged = program.settle(call.call_id, call.service, not aborted, call.reuse)
        program.attained_service += charged
        program.wait += call.total_wait
        program.last_completion_s = now_s
        if aborted:
            program.calls_aborted += 1
            self.counters.calls_aborted += 1
        else:
            program.calls_completed += 1
        self.counters.calls_finished += 1
        program.active_calls.pop(id(call), None)
        self.shares.left(program.owner)
        call.thread.active_calls -= 1
        self.table.touch(program)
        try:
            self.policy.complete(call, charged)
        except Exception as error:
            self.faults.record(Hook.COMPLETE, error, "the program's critical path is not updated")
        self._after_progress(program)
        self.table.release_if_done(program)

    def end_program(self, program_id: str) -> bool:
        """End a program (the client said so); its in-flight calls still complete."""
        return self.table.end(program_id)

    # ---- anti-starvation ---------------------------------------------------------

    def _age_bands(self, now_s: float) -> None:
        """Calls of a worse band that reached the router ``band_aging_s`` ago (their
        :attr:`Call.ages_at` has come) rank as band 0."""
        heap = self._aging
        while heap and heap[0][0] <= now_s:
            call = heapq.heappop(heap)[2]
            if call.state is CallState.FINISHED or call.band == 0:
                continue
            call.band = 0
            self.waiting.rerank(call, self._policy_rank(call))

    def next_band_aging(self) -> float | None:
        """When (in seconds) the next waiting call of a worse band ages (None if none)."""
        heap = self._aging
        while heap and (heap[0][2].state is CallState.FINISHED or heap[0][2].band == 0):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _watch_starvation(self, call: Call) -> None:
        # Calls already in the top level have nowhere to be promoted to.
        if not self.policy.uses_levels or call.level == 0 or call.wait_started is None:
            return
        deadline = self._starvation_deadline(call)
        heapq.heappush(self._starving, (deadline, call.seq, call.queue_version, call))

    def _contention(self) -> float:
        """How many batches' worth of calls wait now; at least 1 (1 without seats).

        Fair sharing alone makes every waiting call's wait/service ratio grow with
        the queue: with s seats and q waiting calls it is about q / s. A fixed
        beta below that promotes nearly every call and hands the order back to
        arrival time (on a 2-seat engine, 727 of 1,236 calls; docs/scheduling.md).
        So the threshold is beta times this: a call starves when it waits beta
        times longer than the current load explains. Computed when a deadline
        is set; a deadline that comes due is checked again with the load then.
        """
        if not self.seats:
            return 1.0
        return max(1.0, len(self.waiting) / self.seats)

    def _starvation_deadline(self, call: Call) -> float:
        """Wait-clock time at which (W_p + W_c) / (T_p + T_c) reaches beta x contention."""
        cfg = self.config
        if self.policy.program_aware:
            served = max(call.base + call.starve_service, cfg.min_service)
            waited = call.program.wait + call.starve_wait
        else:  # only the call itself is known
            served = max(call.starve_service, cfg.min_service)
            waited = call.starve_wait
        assert call.wait_started is not None
        return call.wait_started + cfg.beta * self._contention() * served - waited

    def next_promotion(self) -> float | None:
        """Wait-clock time of the next possible starvation promotion (None if none)."""
        heap = self._starving
        while heap:
            _, _, version, call = heap[0]
            if call.queued and version == call.queue_version and call.level > 0:
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def _promote_starving(self) -> None:
        heap = self._starving
        while heap and heap[0][0] <= self.clock:
            _, _, version, call = heapq.heappop(heap)
            if not call.queued or version != call.queue_version or call.level == 0:
                continue  # stale: the call was admitted, re-ranked or finished since
            deadline = self._starvation_deadline(call)
            if deadline > self.clock:  # its program gained service meanwhile
                heapq.heappush(heap, (deadline, call.seq, call.queue_version, call))
                continue
            self._promote(call)

    def _promote(self, call: Call) -> None:
        """Move a starving call to the top level; only the call's counters reset."""
        call.level = 0
        call.quantum_left = self.levels.quanta[0]
        call.seq = call.program_seq = next(self._seq)  # the tail, whatever its program
        call.total_wait += self.clock - (call.wait_started or self.clock)
        call.wait_started = self.clock
        call.starve_wait = 0.0
        call.starve_service = 0.0
        call.promotions += 1
        self.counters.promotions += 1
        self.waiting.rerank(call, self._policy_rank(call))

    def _stop_waiting(self, call: Call) -> None:
        if call.wait_started is not None:
            waited = self.clock - call.wait_started
            call.starve_wait += waited
            call.total_wait += waited
            call.wait_started = None

    def _after_progress(self, program: Program) -> None:
        """A call of ``program`` finished: its waiting siblings may rank differently."""
        for sibling in program.active_calls.values():
            if sibling.queued:
                if self.policy.rerank_on_progress(program):
                    self.waiting.rerank(sibling, self._policy_rank(sibling))
                # The program's wait grew, so a sibling may starve sooner.
                self._watch_starvation(sibling)

    # ---- reporting -----------------------------------------------------------------

    def wait_of(self, call: Call) -> float:
        """All the waiting of ``call`` so far, including the current stretch."""
        current = self.clock - call.wait_started if call.wait_started is not None else 0.0
        return call.total_wait + current

    def snapshot(self, now_s: float, program_ids: Iterable[str] | None = None) -> dict[str, Any]:
        """A plain-data view of the table (for the engine's table endpoint).

        ``program_ids``: only the rows of these programs (those in the table);
        empty, none: a summary whose cost does not grow with the table.
        """
        depth = [0] * len(self.levels)
        for call in self.waiting:
            depth[min(call.level, len(depth) - 1)] += 1
        if program_ids is None:
            chosen: Iterable[Program] = self.table
        else:
            found = (self.table.get(program_id) for program_id in program_ids)
            chosen = [program for program in found if program is not None]
        programs = []
        for program in chosen:
            active = list(program.active_calls.values())
            programs.append(
                {
                    "program_id": program.program_id,
                    "name": program.name,
                    # Whose fair share of held KV it draws on (the key's owner id).
                    "owner": program.owner,
                    "band": program.band,
                    "engine": program.engine,
                    "threads": len(program.threads),
                    "active_calls": len(active),
                    "calls_completed": program.calls_completed,
                    "calls_aborted": program.calls_aborted,
                    "attained_service": program.attained_service,
                    "critical_path": program.critical_path,
                    "waiting_time": program.wait + sum(self.wait_of(c) for c in active),
                    "level": min((c.level for c in active), default=None),
                    "last_arrival_s": program.last_arrival_s,
                    "last_completion_s": program.last_completion_s,
                    "age_s": now_s - program.created_s,
                    "calls": [
                        {
                            "call_id": c.call_id,
                            "thread_id": c.thread.thread_id,
                            "parent_thread_id": c.thread.parent.thread_id
                            if c.thread.parent
                            else None,
                            "state": c.state.value,
                            "level": c.level,
                            "service": c.service,
                            "waiting_time": self.wait_of(c),
                            "preemptions": c.preemptions,
                            "promotions": c.promotions,
                        }
                        for c in active
                    ],
                }
            )
        return {
            "policy": self.policy.name,
            "service_unit": self.meter.unit,
            "programs": programs,
            "programs_count": len(self.table),
            "queue_depth": depth,
            "waiting": len(self.waiting),
            "owners": self.shares.snapshot(),
            **vars(self.counters),
            "calls_over_limit": dict(self.table.calls_over_limit),
            "hook_failures": dict(self.faults.counts),
        }
