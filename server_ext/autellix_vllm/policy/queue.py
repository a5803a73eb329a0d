"""The queue of waiting calls, ordered by the policy's rank.

A binary heap with lazy invalidation: changing a call's rank (promotion, a new
level) pushes a fresh entry and bumps the call's version, and stale entries are
skipped when they reach the top. Add, remove and re-rank are O(log n); peek is
amortised O(1). Ties are impossible because every rank ends with a unique seq. The queue
also counts its calls per owner (:meth:`WaitQueue.owners`), for the fair
share of held KV (policy.residency).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Collection, Iterator

from .table import Call, Rank

_Entry = tuple[Rank, int, Call]


class WaitQueue:
    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._size = 0
        self._by_owner: Counter[str] = Counter()  # owner -> its queued calls (> 0)

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
        """Move a queued call to its new rank."""
        if call.queued:
            self._push_entry(call, rank)

    def remove(self, call: Call) -> bool:
        if not call.queued:
            return False
        self._dequeued(call)
        self._maybe_compact()
        return True

    def peek(self) -> Call | None:
        heap = self._heap
        while heap:
            _, version, call = heap[0]
            if call.queued and version == call.queue_version:
                return call
            heapq.heappop(heap)
        return None

    def pop(self) -> Call:
        call = self.peek()
        if call is None:
            raise IndexError("pop from an empty wait queue")
        heapq.heappop(self._heap)
        self._dequeued(call)
        return call

    def best(self, limit: int) -> list[Call]:
        """Up to ``limit`` calls in rank order, without removing them."""
        taken: list[_Entry] = []
        out: list[Call] = []
        heap = self._heap
        while heap and len(out) < limit:
            entry = heapq.heappop(heap)
            _, version, call = entry
            if call.queued and version == call.queue_version:
                taken.append(entry)
                out.append(call)
        for entry in taken:
            heapq.heappush(heap, entry)
        return out

    def __iter__(self) -> Iterator[Call]:
        """All queued calls in rank order (over a copy)."""
        live = [e for e in self._heap if e[2].queued and e[1] == e[2].queue_version]
        return (call for _, _, call in sorted(live, key=lambda e: e[0]))

    def _dequeued(self, call: Call) -> None:
        call.queued = False
        call.queue_version += 1
        self._size -= 1
        owner = call.program.owner
        self._by_owner[owner] -= 1
        if not self._by_owner[owner]:
            del self._by_owner[owner]

    def _push_entry(self, call: Call, rank: Rank) -> None:
        call.queue_version += 1
        heapq.heappush(self._heap, (rank, call.queue_version, call))
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        # Stale entries are dropped only when they surface; rebuild if they pile up.
        if len(self._heap) > 2 * self._size + 64:
            self._heap = [e for e in self._heap if e[2].queued and e[1] == e[2].queue_version]
            heapq.heapify(self._heap)
