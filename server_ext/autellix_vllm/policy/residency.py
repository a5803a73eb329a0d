"""KV residency: which idle contexts an engine keeps, and which calls may take KV.

A long-context agent spends most of its life between calls, in a tool, with a
context of tens of thousands of tokens cached on the engine. An order that
ignores this thrashes once the contexts of the sessions in flight no longer fit
in KV: every newly admitted call evicts some idle session's context, which its
next call prefills again, which evicts another. Three rules, in KV blocks, keep
the set of programs an engine works on within its KV, as an operating system's
working set keeps processes within memory:

* **Retention.** When a context goes idle (its call ended), the engine holds its
  blocks for a while if its program is expected back: for some of the
  program's own expected tool gaps (their mean, pulled towards a prior), or
  for the time a client hint gives. Holds share a budget (a part of KV) and are
  granted by program level, so a program's idle context never displaces a
  better-ranked program's hold; a hold ends when the program's next call is
  admitted, when it expires, or when a better-ranked call needs its blocks.
* **Working set.** A call whose context is not resident (not held, not in use
  by a running call) is admitted only if its whole context fits in KV that is
  free or cached but not held, minus a headroom for the resident contexts'
  growth.
  Otherwise it waits, and calls behind it may go first; it does not evict held
  contexts. A call that anti-starvation promoted, and a new program's first call
  (``ResidencyConfig.first_call_bound_s``), may break holds of programs in worse
  levels: every wait stays bounded, and a hold never keeps a new program out.
* **Fair share.** Retention hints come from clients, so a client could claim
  the longest hold for every program it runs. What a hint buys is the part of
  a hold past the engine's own estimate, and that part is shared among owners
  (``Program.owner``, whom the router states): while calls of another owner
  wait, a hold that takes its owner past its fair share (the budget divided
  among the owners that contend for it: those holding and those with calls
  waiting) lasts no longer than the engine's own estimate, whatever its hint;
  and when another owner's call cannot be admitted for lack of KV, the holds
  others have past their share are cut back to that estimate (the longest
  claims first), if ending them would let the call in. A hint may always
  shorten a hold, and when no other owner waits, holds use what is free. A
  hint never changes a program's level, so it never ranks a program's calls
  or holds higher. The share binds only what hints buy: holding by the
  engine's own estimate stays ranked by program alone, because cutting an
  honest long context to an owner's share costs its whole prefill when the
  program returns (docs/scheduling.md, "Hints and the fair share").
* **Victim cost.** When KV runs out under running calls, holds of programs in
  their level or worse go first (a running call is dearer to undo than an idle
  context of its own level, which may not be needed within its hold); then,
  among the running calls of the worst level, the one whose preemption is
  cheapest to undo (nothing cached is cheapest, a reload from host memory
  next, recomputing a long context dearest).

* **Host tier.** With a host-memory KV tier that can keep every live
  program's context, an evicted context comes back by a reload instead of a
  prefill, and holds and the working set cost more than they save: while the
  live contexts fit in the tier, the rules step aside (no holds, every call
  admissible) and the engine evicts and reloads as vLLM does
  (:meth:`Residency.engaged`).

These are the default's rules (:class:`~autellix_vllm.policy.retention.WorkingSet`);
the peers' policies keep their holds here too, under rules of their own
(``policy.retention``). This module keeps the holds and makes the decisions; the
engine (the simulator or the vLLM scheduler) owns the blocks and applies them.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from .config import ResidencyConfig
from .retention import Retention, WorkingSet
from .table import Call, ProcessTable, Program, Rank

# How many waiting calls outside the working set admission looks past in a step
# (they are skipped, not evicted for); bounds the cost of a step.
SKIPPED_WAITERS = 64

# Reloading a token from a host tier is this many times cheaper than recomputing it.
RELOAD_SPEEDUP = 100


def undo_cost(computed_tokens: int, reloadable_tokens: int = 0) -> float:
    """What preempting a running call costs to undo, in tokens recomputed: vLLM V1
    frees a preempted call's blocks, so its computed tokens are prefilled again on
    resume, except those a host tier keeps (``reloadable_tokens``), which reload
    ``RELOAD_SPEEDUP`` times cheaper."""
    kept = min(computed_tokens, reloadable_tokens)
    return computed_tokens - kept + kept / RELOAD_SPEEDUP


@dataclass(eq=False, slots=True)
class Hold:
    """An idle context whose blocks the engine keeps."""

    context: str
    program: Program
    blocks: int
    level: int
    until: float  # inf while a call of the context waits to be admitted
    seq: int
    # When the engine's own estimate would end it (a later ``until`` is the hint's claim).
    own_until: float = 0.0

    @property
    def owner(self) -> str:
        return self.program.owner


class LiveContexts:
    """The KV of the live programs' contexts, in blocks: each context's largest
    prompt so far (its calls share a prefix, the longest holds it), until its
    program ends or leaves the process table."""

    def __init__(self) -> None:
        self._blocks: dict[str, dict[str, int]] = {}  # program -> context -> blocks
        self.total = 0
        self._departures_seen = 0  # the table's departures at the last prune

    def seen(self, program_id: str, context: str, blocks: int) -> None:
        contexts = self._blocks.setdefault(program_id, {})
        old = contexts.get(context, 0)
        if blocks > old:
            contexts[context] = blocks
            self.total += blocks - old

    def ended(self, program_id: str) -> None:
        self.total -= sum(self._blocks.pop(program_id, {}).values())

    def has(self, program_id: str) -> bool:
        return program_id in self._blocks

    def blocks_of(self, program_id: str) -> int:
        """The blocks of the program's contexts (0 if it is not live)."""
        return sum(self._blocks.get(program_id, {}).values())

    def prune(self, table: ProcessTable) -> None:
        """Forget programs that left ``table`` (clients that never end theirs); a
        walk over the live programs only when some program left it since the last
        prune, so that an engine asking every step pays for departures, not for
        every live program every step."""
        if table.departures == self._departures_seen:
            return
        self._departures_seen = table.departures
        for program_id in [p for p in self._blocks if p not in table]:
            self.ended(program_id)


class Residency:
    """The holds of one engine and the working-set rule (see the module docstring).

    ``level_of`` gives a program's level as its next call would enter it; holds
    are compared by it (higher is worse). ``waiting_owners`` gives the owners
    with calls waiting on the engine (the wait queue's ``owners``); by default
    nobody waits, and the fair share never binds. ``tier_blocks``: blocks of
    this engine's KV a host tier can keep (0: no tier). ``retention``: the
    policy's rule (default: the working set, the default policy's);
    ``kv_fill_s``: seconds the engine takes to prefill its whole KV, for rules
    that weigh a hold against a recompute (None: unknown).
    """

    def __init__(
        self,
        config: ResidencyConfig,
        capacity_blocks: int,
        level_of: Callable[[Program], int],
        waiting_owners: Callable[[], Collection[str]] = tuple,
        tier_blocks: int = 0,
        retention: Retention | None = None,
        kv_fill_s: float | None = None,
    ) -> None:
        self.config = config
        self.retention = retention if retention is not None else WorkingSet()
        self.kv_fill_s = kv_fill_s
        self.capacity_blocks = capacity_blocks
        self.tier_blocks = tier_blocks
        self.live = LiveContexts()
        self.level_of = level_of
        self.waiting_owners = waiting_owners
        self.holds: dict[str, Hold] = {}
        self.held_blocks = 0
        self.held_by_owner: Counter[str] = Counter()  # owner -> its held blocks (> 0)
        self._seq = itertools.count()
        self._expiry: list[tuple[float, int, str]] = []  # (until, seq, context), lazily stale
        # Counters, for reports.
        self.granted = 0
        self.refused = 0
        self.taken = 0
        self.expired_count = 0
        self.broken = 0
        self.cut = 0  # claims cut to the engine's estimate for their owner's fair share

    @property
    def budget_blocks(self) -> int:
        share = self.retention.hold_share
        return int(self.capacity_blocks * (self.config.hold_share if share is None else share))

    @property
    def headroom_blocks(self) -> int:
        return math.ceil(self.capacity_blocks * self.config.headroom)

    def __contains__(self, context: str) -> bool:
        return context in self.holds

    def counters(self) -> dict[str, int]:
        """What the holds did so far, under the names engines report them by."""
        return {
            "holds_granted": self.granted,
            "holds_refused": self.refused,
            "holds_taken": self.taken,
            "holds_expired": self.expired_count,
            "holds_broken": self.broken,
            "holds_cut": self.cut,
        }

    def engaged(self, table: ProcessTable) -> bool:
        """Whether the rules apply now: without a host tier always; with one, once
        the live contexts (``live``, of programs still in ``table``) outgrow it,
        so that the tier (least recently used first) drops contexts whose
        programs come back, and recomputing them is what the rules save. An
        engine whose rules step aside ends every hold (:meth:`release_all`) and
        admits every call. Rules that do not step aside for a tier always apply."""
        if not self.retention.steps_aside_for_tier:
            self.live.prune(table)
            return True
        if not self.tier_blocks:
            return True
        if self.live.total > self.tier_blocks:
            self.live.prune(table)
        return self.live.total > self.tier_blocks

    # ---- retention ------------------------------------------------------------------

    def hold(
        self,
        context: str,
        program: Program,
        blocks: int,
        now: float,
        hint_s: float | None = None,
    ) -> list[str]:
        """``context`` went idle with ``blocks`` cached: hold it if the budget allows,
        displacing holds of worse-ranked programs (worst first, oldest first), for
        the client's hint or the estimate (``ResidencyConfig.ttl_s``); a hint no
        longer than the estimate if the hold takes its owner past its fair share
        while other owners' calls wait.

        Returns the contexts whose holds ended to make room; the engine releases
        them. Whether ``context`` itself is held: ``context in residency``.
        """
        if context in self.holds:
            self._drop(context)
        if program.ended or blocks <= 0:
            return []
        owner = program.owner
        level = self.level_of(program)
        ended: list[str] = []
        room = self.budget_blocks - self.held_blocks
        if blocks > room:
            victims = [self.holds[c] for c in self.breakable(level)]
            if blocks > room + sum(h.blocks for h in victims):
                self.refused += 1
                return []
            for victim in victims:
                if blocks <= room:
                    break
                room += victim.blocks
                self.break_hold(victim.context)
                ended.append(victim.context)
        own_ttl = self.retention.ttl_s(self, program, blocks, None)
        ttl = self.retention.ttl_s(self, program, blocks, hint_s)
        if own_ttl is None or ttl is None:  # the rule holds no such context
            self.refused += 1
            return ended
        own_until, until = now + own_ttl, now + ttl
        if until > own_until and self._past_share(owner, blocks):
            until = own_until
            self.cut += 1
        held = Hold(context, program, blocks, level, until, next(self._seq), own_until)
        self.holds[context] = held
        self.held_blocks += blocks
        self.held_by_owner[owner] += blocks
        if until < math.inf:  # a hold without a time-to-live ends only when displaced
            heapq.heappush(self._expiry, (until, held.seq, context))
        self.granted += 1
        return ended

    def waiting(self, program_id: str, context: str, blocks: int) -> None:
        """A call of ``context`` arrived with a prompt of ``blocks``: the context's
        hold, if any, lasts until the call is admitted, and the context counts
        among the live ones at least this large."""
        self.live.seen(program_id, context, blocks)
        held = self.holds.get(context)
        if held is not None:
            held.until = math.inf

    def take(self, context: str) -> bool:
        """The context's next call was admitted (its blocks are in use again), or the
        engine dropped the blocks: the hold ends. True if there was one."""
        if context not in self.holds:
            return False
        self._drop(context)
        self.taken += 1
        return True

    def release(self, context: str) -> bool:
        """End a hold without its context being used (the engine needs its blocks).
        True if there was one."""
        if context not in self.holds:
            return False
        self._drop(context)
        return True

    def break_hold(self, context: str) -> None:
        """End the hold of ``context`` because a better-ranked call needs its blocks
        (counted in ``broken``)."""
        self._drop(context)
        self.broken += 1

    def release_program(self, program_id: str) -> list[str]:
        """The program ended (its client said so): end its holds; returns their
        contexts."""
        self.live.ended(program_id)
        return self.release_program_holds(program_id)

    def release_program_holds(self, program_id: str) -> list[str]:
        """End the holds of a program that stays live; returns their contexts."""
        ended = [c for c, h in self.holds.items() if h.program.program_id == program_id]
        for context in ended:
            self._drop(context)
        return ended

    def release_all(self) -> list[str]:
        """End every hold (the rules step aside); returns their contexts."""
        ended = list(self.holds)
        for context in ended:
            self._drop(context)
        return ended

    def expired(self, now: float) -> list[str]:
        """End the holds whose time is up at ``now``, and those the rule's periodic
        decisions end; returns their contexts."""
        out = self.retention.tick(self, now)
        heap = self._expiry
        while heap and heap[0][0] <= now:
            _, seq, context = heapq.heappop(heap)
            held = self.holds.get(context)
            if held is None or held.seq != seq or held.until > now:
                continue  # stale: taken, re-held, or waited on since
            self._drop(context)
            self.expired_count += 1
            out.append(context)
        return out

    def next_expiry(self) -> float | None:
        """When the next hold may expire or the rule decides again (None if neither)."""
        tick = self.retention.next_tick()
        heap = self._expiry
        while heap:
            until, seq, context = heap[0]
            held = self.holds.get(context)
            if held is not None and held.seq == seq and held.until == until:
                return until if tick is None else min(until, tick)
            heapq.heappop(heap)
        return tick

    def admits(self, program: Program) -> bool:
        """Whether the rule lets ``program``'s calls be admitted now (ThunderAgent
        pauses programs); the working set is :meth:`fits`."""
        return self.retention.admits(program)

    def overdue(self, call: Call, now: float) -> bool:
        """Whether ``call``, outside the working set, is a new program's first and
        has waited past ``ResidencyConfig.first_call_bound_s``: it may break holds
        of programs in worse levels."""
        first = call.program.calls_completed == 0
        return first and now - call.arrival_s >= self.config.first_call_bound_s

    @property
    def working_set(self) -> bool:
        """Whether a call whose context is not resident must fit (:meth:`fits`)."""
        return self.retention.working_set

    def breakable(self, level: int) -> list[str]:
        """What a call of ``level`` may take blocks from, first to go first: under the
        default's rule held contexts of programs in a worse level, worst first and,
        within a level, oldest first (``Retention.breakable``)."""
        return [h.context for h in self.retention.breakable(self.holds.values(), level)]

    # ---- the fair share among owners --------------------------------------------------

    def fair_share(self, asking: str) -> int:
        """Blocks of the hold budget each owner may hold while ``asking`` wants KV:
        the budget divided among the owners contending for it (those holding, those
        with calls waiting, and ``asking``)."""
        owners = {asking, *self.held_by_owner, *self.waiting_owners()}
        return self.budget_blocks // len(owners)

    def excess(self, owner: str, now: float) -> list[str]:
        """Holds of owners other than ``owner`` that last past the engine's own
        estimate on a hint's claim while their owner is past its fair share (as
        ``owner`` wants KV): the longest claims first, as many as take each owner
        back to its share. A hold whose program's call waits to be admitted is
        not among them (it is about to be used)."""
        if not self.config.fair_share or not any(o != owner for o in self.held_by_owner):
            return []
        share = self.fair_share(owner)
        out: list[str] = []
        for other, held in self.held_by_owner.items():
            if other == owner or held <= share:
                continue
            claims = (
                h
                for h in self.holds.values()
                if h.owner == other and max(h.own_until, now) < h.until < math.inf
            )
            for hold in sorted(claims, key=lambda h: (-h.until, h.seq)):
                if held <= share:
                    break
                held -= hold.blocks
                out.append(hold.context)
        return out

    def cut_for(
        self,
        owner: str,
        now: float,
        context_blocks: int,
        reclaimable_blocks: int,
        largest_resident: int = 0,
    ) -> int:
        """A call of ``owner`` whose context is not resident waits for KV: cut the
        claims of other owners past their fair share (:meth:`excess`) back to the
        engine's own estimate (or ``now``, if that has passed), if ending them would
        let the call in (:meth:`fits`). Returns how many were cut; the engine ends
        them with :meth:`expired`."""
        excess = self.excess(owner, now)
        freed = sum(self.holds[context].blocks for context in excess)
        if not excess or not self.fits(
            context_blocks, reclaimable_blocks + freed, largest_resident
        ):
            return 0
        for context in excess:
            held = self.holds[context]
            held.until = max(held.own_until, now)
            heapq.heappush(self._expiry, (held.until, held.seq, context))
        self.cut += len(excess)
        return len(excess)

    def _past_share(self, owner: str, blocks: int) -> bool:
        """Whether holding ``blocks`` more takes ``owner`` past its fair share while
        another owner's calls wait."""
        if not self.config.fair_share or not any(o != owner for o in self.waiting_owners()):
            return False
        return self.held_by_owner[owner] + blocks > self.fair_share(owner)

    def _drop(self, context: str) -> None:
        held = self.holds.pop(context)
        self.held_blocks -= held.blocks
        self.held_by_owner[held.owner] -= held.blocks
        if not self.held_by_owner[held.owner]:
            del self.held_by_owner[held.owner]

    # ---- the working set and victims ------------------------------------------------

    def fits(self, context_blocks: int, reclaimable_blocks: int, largest_resident: int = 0) -> bool:
        """Whether a call whose context is not resident may be admitted: its whole
        context fits in the blocks that are free or evictable (not held, not in use),
        with the reserve for the resident contexts' growth left over (the headroom,
        or a share of the ``largest_resident`` context in blocks if more)."""
        reserve = 0.0
        if self.retention.working_set:
            reserve = max(self.headroom_blocks, self.config.growth_reserve * largest_resident)
        return context_blocks <= reclaimable_blocks - reserve

    @staticmethod
    def victim(
        running: Iterable[Call],
        rank: Callable[[Call], Rank],
        undo_cost: Callable[[Call], float],
    ) -> Call:
        """The running call to preempt when KV runs out: the worst band first, then
        the worst level (the paper's order), then the cheapest to undo, then the
        worst rank."""
        return max(running, key=lambda call: Residency.victim_key(call, rank, undo_cost))

    @staticmethod
    def victim_key(
        call: Call,
        rank: Callable[[Call], Rank],
        undo_cost: Callable[[Call], float],
    ) -> tuple[int, int, float, Rank]:
        """Orders running calls for preemption when KV runs out (:meth:`victim`): the
        greatest key goes first. An engine that preempts by its own rule (vLLM) sorts
        its running calls by it."""
        return (call.band, call.level, -undo_cost(call), rank(call))
