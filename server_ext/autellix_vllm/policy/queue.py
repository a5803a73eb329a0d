"""The queue of waiting calls: bands first, a fair share between owners inside a
band, the policy's rank inside an owner.

Each (band, owner) has its own binary heap ordered by the policy's rank. The
head of the queue is the best band's (lowest number's) call of the owner whose
``share`` (its attained service over its weight, :class:`~.core.OwnerShares`)
is the least, so owners take turns by the service they received: an owner that
splits an agent into many programs, or runs many, gains nothing against
another, because its programs' service adds up in one share. With one owner
and one band there is one heap, and the order is the policy's alone.

Each heap uses lazy invalidation: changing a call's rank (promotion, a new
level, a new band) pushes a fresh entry and bumps the call's version, and stale
entries are skipped when they reach the top. Add, remove and re-rank are
O(log n); peek is O(heaps) amortised. Ties are impossible because every rank
ends with a unique seq. The queue also counts its calls per owner
(:meth:`WaitQueue.owners`), for the fair share of held KV (policy.residency).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Collection, Iterator

from .table import Call, Rank

_Entry = tuple[Rank, int, Call]
# Where a call waits: (its band, its program's owner).
_Key = tuple[int, str]


def _no_share(owner: str) -> float:
    return 0.0


class _Heap:
    """One (band, owner)'s waiting calls, by the policy's rank."""

    __slots__ = ("entries", "size")

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.size = 0

    def top(self) -> Call | None:
        entries = self.entries
        while entries:
            _, version, call = entries[0]
            if call.queued and version == call.queue_version:
                return call
            heapq.heappop(entries)
        return None

    def best(self, limit: int) -> list[Call]:
        """Up to ``limit`` live calls in rank order, without removing them."""
        taken: list[_Entry] = []
        out: list[Call] = []
        entries = self.entries
        while entries and len(out) < limit:
            entry = heapq.heappop(entries)
            _, version, call = entry
            if call.queued and version == call.queue_version:
                taken.append(entry)
                out.append(call)
        for entry in taken:
            heapq.heappush(entries, entry)
        return out

    def compact(self) -> None:
        # Stale entries are dropped only when they surface; rebuild if they pile up.
        if len(self.entries) > 2 * self.size + 64:
            self.entries = [e for e in self.entries if e[2].queued and e[1] == e[2].queue_version]
            heapq.heapify(self.entries)


class WaitQueue:
    def __init__(self, share: Callable[[str], float] = _no_share) -> None:
        self._heaps: dict[_Key, _Heap] = {}
        self._size = 0
        self._by_owner: Counter[str] = Counter()  # owner -> its queued calls (> 0)
        self._share = share

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __contains__(self, call: Call) -> bool:
        return call.queued

    def owners(self) -> Collection[str]:
        """The owners with a call in the queue."""
        return self._by_owner.keys()

    def push(self, call: Call, rank: Rank) -> None:
        if call.queued:
            raise ValueError(f"call {call.call_id} is already queued")
        call.queued = True
        self._size += 1
        self._by_owner[call.program.owner] += 1
        self._push_entry(call, rank)

    def rerank(self, call: Call, rank: Rank) -> None:
        """Move a queued call to its new rank (and to its band's heap, if its band
        changed)."""
        if call.queued:
            self._heaps[call.queue_key].size -= 1
            self._push_entry(call, rank)

    def remove(self, call: Call) -> bool:
        if not call.queued:
            return False
        self._dequeued(call)
        self._heaps[call.queue_key].compact()
        return True

    def peek(self) -> Call | None:
        for key in self._keys_in_order(first_band_only=True):
            call = self._heaps[key].top()
            if call is not None:
                return call
        return None

    def pop(self) -> Call:
        call = self.peek()
        if call is None:
            raise IndexError("pop from an empty wait queue")
        heapq.heappop(self._heaps[call.queue_key].entries)
        self._dequeued(call)
        return call

    def best(self, limit: int) -> list[Call]:
        """Up to ``limit`` calls in queue order, without removing them: band by band,
        and inside a band the owners in turn, least share first."""
        out: list[Call] = []
        keys = self._keys_in_order()
        for _, band_keys in itertools.groupby(keys, key=lambda key: key[0]):
            per_owner = [self._heaps[key].best(limit - len(out)) for key in band_keys]
            for turn in itertools.zip_longest(*per_owner):
                out.extend(call for call in turn if call is not None)
            if len(out) >= limit:
                return out[:limit]
        return out

    def __iter__(self) -> Iterator[Call]:
        """All queued calls in queue order (over a copy)."""
        return iter(self.best(self._size))

    def _keys_in_order(self, first_band_only: bool = False) -> list[_Key]:
        """The (band, owner) heaps with calls, best band first, least share first."""
        live = [key for key, heap in self._heaps.items() if heap.size > 0]
        if len(live) <= 1:
            return live
        if first_band_only:
            band = min(key[0] for key in live)
            live = [key for key in live if key[0] == band]
        return sorted(live, key=lambda key: (key[0], self._share(key[1]), key[1]))

    def _dequeued(self, call: Call) -> None:
        call.queued = False
        call.queue_version += 1
        self._size -= 1
        self._heaps[call.queue_key].size -= 1
        owner = call.program.owner
        self._by_owner[owner] -= 1
        if not self._by_owner[owner]:
            del self._by_owner[owner]

    def _push_entry(self, call: Call, rank: Rank) -> None:
        call.queue_version += 1
        call.queue_key = (call.band, call.program.owner)
        heap = self._heaps.get(call.queue_key)
        if heap is None:
            heap = self._heaps[call.queue_key] = _Heap()
        heap.size += 1
        heapq.heappush(heap.entries, (rank, call.queue_version, call))
        heap.compact()
