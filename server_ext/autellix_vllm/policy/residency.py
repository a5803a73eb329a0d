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
  program's own expected tool gaps (their mean, pulled towards a prior; fewer
  if a host tier keeps the context, whose loss costs a reload, not a prefill),
  or for the time a client hint gives. Holds share a budget (a part of KV) and are
  granted by program level, so a program's idle context never displaces a
  better-ranked program's hold; a hold ends when the program's next call is
  admitted, when it expires, or when a better-ranked call needs its blocks.
* **Working set.** A call whose context is not resident (not held, not in use
  by a running call) is admitted only if its whole context fits in KV that is
  free or cached but not held, minus a headroom for the resident contexts'
  growth.
  Otherwise it waits, and calls behind it may go first; it does not evict held
  contexts. A call that anti-starvation promoted may break holds of programs in
  worse levels: every wait stays bounded.
* **Fair share.** Retention hints come from clients, so a client could claim
  the longest hold for every program it runs. Holds are therefore shared among
  owners (``Program.owner``, whom the router states) as well as by rank: while
  calls of another owner wait, an owner's holds together stay within its fair
  share, the hold budget divided by the owners that contend for it (those
  holding and those with calls waiting). A hold that would take its owner
  past its share is refused, and the holds an owner has beyond its share are
  the first any other owner's call may take blocks from (its worst first),
  whatever their rank. When no other owner waits, holds use what is free. A
  hint only sets how long a hold lasts: it never changes a program's level,
  so it never ranks a program's calls or holds higher.
* **Victim cost.** When KV runs out under running calls, holds of worse-ranked
  programs go first; then, among the running calls of the worst level, the one
  whose preemption is cheapest to undo (nothing cached is cheapest, a reload
  from host memory next, recomputing a long context dearest).

This module keeps the holds and makes the decisions; the engine (the simulator
or the vLLM scheduler) owns the blocks and applies them.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from .config import ResidencyConfig
from .table import Call, Program, Rank

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

    @property
    def owner(self) -> str:
        return self.program.owner


class Residency:
    """The holds of one engine and the working-set rule (see the module docstring).

    ``level_of`` gives a program's level as its next call would enter it; holds
    are compared by it (higher is worse). ``waiting_owners`` gives the owners
    with calls waiting on the engine (the wait queue's ``owners``); by default
    nobody waits, and the fair share never binds.
    """

    def __init__(
        self,
        config: ResidencyConfig,
        capacity_blocks: int,
        level_of: Callable[[Program], int],
        waiting_owners: Callable[[], Collection[str]] = tuple,
    ) -> None:
        self.config = config
        self.capacity_blocks = capacity_blocks
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
        self.capped = 0  # refused because their owner was at its fair share

    @property
    def budget_blocks(self) -> int:
        return int(self.capacity_blocks * self.config.hold_share)

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
            "holds_capped": self.capped,
        }

    # ---- retention ------------------------------------------------------------------

    def hold(
        self,
        context: str,
        program: Program,
        blocks: int,
        now: float,
        hint_s: float | None = None,
        reloadable: bool = False,
    ) -> list[str]:
        """``context`` went idle with ``blocks`` cached: hold it if the budget and its
        owner's fair share allow, displacing other owners' holds beyond their share
        (if its owner stays within its own) and holds of worse-ranked programs
        (worst first, oldest first), for the client's hint or the estimate
        (``ResidencyConfig.ttl_s``; ``reloadable``: a host tier keeps the context).

        Returns the contexts whose holds ended to make room; the engine releases
        them. Whether ``context`` itself is held: ``context in residency``.
        """
        if context in self.holds:
            self._drop(context)
        if program.ended or blocks <= 0:
            return []
        owner = program.owner
        if self._over_share(owner, blocks):
            self.capped += 1
            self.refused += 1
            return []
        level = self.level_of(program)
        ended: list[str] = []
        room = self.budget_blocks - self.held_blocks
        if blocks > room:
            within = self.held_by_owner[owner] + blocks <= self.fair_share(owner)
            victims = [self.holds[c] for c in self.breakable(level, owner if within else None)]
            if blocks > room + sum(h.blocks for h in victims):
                self.refused += 1
                return []
            for victim in victims:
                if blocks <= room:
                    break
                room += victim.blocks
                self.break_hold(victim.context)
                ended.append(victim.context)
        until = now + self.config.ttl_s(program, hint_s, reloadable)
        held = Hold(context, program, blocks, level, until, next(self._seq))
        self.holds[context] = held
        self.held_blocks += blocks
        self.held_by_owner[owner] += blocks
        heapq.heappush(self._expiry, (until, held.seq, context))
        self.granted += 1
        return ended

    def waiting(self, context: str) -> None:
        """A call of the held ``context`` arrived: the hold lasts until it is admitted."""
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
        ended = [c for c, h in self.holds.items() if h.program.program_id == program_id]
        for context in ended:
            self._drop(context)
        return ended

    def expired(self, now: float) -> list[str]:
        """End the holds whose time is up at ``now``; returns their contexts."""
        out = []
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
        """When the next hold may expire (None if no hold can)."""
        heap = self._expiry
        while heap:
            until, seq, context = heap[0]
            held = self.holds.get(context)
            if held is not None and held.seq == seq and held.until == until:
                return until
            heapq.heappop(heap)
        return None

    def breakable(self, level: int, owner: str | None = None) -> list[str]:
        """What a call of ``level`` (run by ``owner``, if given) may take blocks from:
        first the holds other owners have beyond their fair share (:meth:`excess`),
        then the held contexts of programs in a level worse than ``level``, worst
        first and, within a level, oldest first."""
        first = self.excess(owner) if owner is not None else []
        taken = set(first)
        worse = (h for h in self.holds.values() if h.level > level and h.context not in taken)
        return first + [h.context for h in self._worst_first(worse)]

    # ---- the fair share among owners --------------------------------------------------

    def fair_share(self, asking: str) -> int:
        """Blocks of the hold budget each owner may hold while ``asking`` wants KV:
        the budget divided among the owners contending for it (those holding, those
        with calls waiting, and ``asking``)."""
        owners = {asking, *self.held_by_owner, *self.waiting_owners()}
        return self.budget_blocks // len(owners)

    def excess(self, owner: str) -> list[str]:
        """Holds of owners other than ``owner`` beyond their fair share while ``owner``
        wants KV, each owner's worst first, as many as take it back to its share:
        what any call of ``owner`` may take blocks from, whatever its rank."""
        if not self.config.fair_share or not any(o != owner for o in self.held_by_owner):
            return []
        share = self.fair_share(owner)
        out: list[str] = []
        for other, held in self.held_by_owner.items():
            if other == owner or held <= share:
                continue
            for hold in self._worst_first(h for h in self.holds.values() if h.owner == other):
                if held <= share:
                    break
                out.append(hold.context)
                held -= hold.blocks
        return out

    def _over_share(self, owner: str, blocks: int) -> bool:
        """Whether holding ``blocks`` more would take ``owner`` past its fair share
        while another owner's calls wait."""
        if not self.config.fair_share or not any(o != owner for o in self.waiting_owners()):
            return False
        return self.held_by_owner[owner] + blocks > self.fair_share(owner)

    def _drop(self, context: str) -> None:
        held = self.holds.pop(context)
        self.held_blocks -= held.blocks
        self.held_by_owner[held.owner] -= held.blocks
        if not self.held_by_owner[held.owner]:
            del self.held_by_owner[held.owner]

    @staticmethod
    def _worst_first(holds: Iterable[Hold]) -> list[Hold]:
        return sorted(holds, key=lambda h: (-h.level, h.seq))

    # ---- the working set and victims ------------------------------------------------

    def fits(self, context_blocks: int, reclaimable_blocks: int, largest_resident: int = 0) -> bool:
        """Whether a call whose context is not resident may be admitted: its whole
        context fits in the blocks that are free or evictable (not held, not in use),
        with the reserve for the resident contexts' growth left over (the headroom,
        or a share of the ``largest_resident`` context in blocks if more)."""
        reserve = max(self.headroom_blocks, self.config.growth_reserve * largest_resident)
        return context_blocks <= reclaimable_blocks - reserve

    @staticmethod
    def victim(
        running: Iterable[Call],
        rank: Callable[[Call], Rank],
        undo_cost: Callable[[Call], float],
    ) -> Call:
        """The running call to preempt when KV runs out: the worst level first (the
        paper's order), then the cheapest to undo, then the worst rank."""
        return max(running, key=lambda call: Residency.victim_key(call, rank, undo_cost))

    @staticmethod
    def victim_key(
        call: Call,
        rank: Callable[[Call], Rank],
        undo_cost: Callable[[Call], float],
    ) -> tuple[int, float, Rank]:
        """Orders running calls for preemption when KV runs out (:meth:`victim`): the
        greatest key goes first. An engine that preempts by its own rule (vLLM) sorts
        its running calls by it."""
        return (call.level, -undo_cost(call), rank(call))
