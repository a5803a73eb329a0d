"""Bounded memories for the process tables of the engine and of the router.

Both tables must stay small however many programs and calls pass through
them, and both bound what they keep the same two ways:

* :class:`IdleTable`: entries ordered least recently active first; a sweep
  drops, from the front, those idle for a time-to-live with nothing in flight,
  at most :data:`SWEEP_BATCH` a sweep (the owner sweeps again until a sweep
  drops fewer, so a flood of programs going idle at once never stalls it).
* :class:`RecentMap` and :class:`RecentIds`: the newest ``capacity`` keys
  written (a program's completed call ids, ended program ids); the oldest are
  forgotten first.

Keys are ids (strings). Nothing here reads a clock: callers pass the time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar, overload

# Call ids a program remembers, so that a retry of an attempt that did not
# complete (same call id) is charged once, and a reuse of a completed id is
# told from a retry.
CHARGED_CALLS_KEPT = 256
# Entries one IdleTable sweep drops at most (about a millisecond of the router's
# work); a sweep that drops this many may have left more for the next one.
SWEEP_BATCH = 1024


class Activity(Protocol):
    """What :class:`IdleTable` needs to know about each entry it holds."""

    @property
    def last_active_s(self) -> float:
        """When the entry last did something (created, a call arrived or ended)."""
        ...

    @property
    def busy(self) -> bool:
        """Something of it is in flight: it is never dropped for being idle."""
        ...


EntryT = TypeVar("EntryT", bound=Activity)
ValueT = TypeVar("ValueT")


class IdleTable(Generic[EntryT]):
    """Entries by id, least recently active first, dropped after ``idle_ttl_s`` idle.

    The owner calls :meth:`touch` whenever an entry's ``last_active_s`` moves
    forward (and :meth:`add` puts new entries last), so the order is the order
    of last activity and :meth:`drop_idle` stops at the first entry that is
    not idle yet, without scanning the rest. ``departures`` counts the entries
    that left (popped or dropped), so that a mirror of the table knows when it
    has something to forget without comparing itself entry by entry.
    """

    def __init__(self, idle_ttl_s: float) -> None:
        self.idle_ttl_s = idle_ttl_s
        self._entries: OrderedDict[str, EntryT] = OrderedDict()
        self.departures = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[EntryT]:
        """The entries, least recently active first (a copy: the table may change meanwhile)."""
        return iter(list(self._entries.values()))

    def get(self, key: str) -> EntryT | None:
        return self._entries.get(key)

    def add(self, key: str, entry: EntryT) -> None:
        """Hold ``entry`` under ``key`` as the most recently active one."""
        self._entries[key] = entry
        self._entries.move_to_end(key)

    def touch(self, key: str) -> None:
        """The entry under ``key`` (if held) is now the most recently active."""
        if key in self._entries:
            self._entries.move_to_end(key)

    def pop(self, key: str) -> EntryT | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.departures += 1
        return entry

    def drop_idle(self, now_s: float, limit: int = SWEEP_BATCH) -> list[str]:
        """Drop entries idle for ``idle_ttl_s`` or more and not busy; return their keys.

        At most ``limit`` (>= 1) are dropped, the least recently active first;
        when ``limit`` were dropped, more may be idle: sweep again (see
        :func:`swept_all`).
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        dropped = []
        for key, entry in self._entries.items():
            if now_s - entry.last_active_s < self.idle_ttl_s:
                break  # every entry after it was active more recently
            if not entry.busy:
                dropped.append(key)
                if len(dropped) == limit:
                    break
        for key in dropped:
            del self._entries[key]
        self.departures += len(dropped)
        return dropped


def swept_all(dropped: list[str], limit: int = SWEEP_BATCH) -> bool:
    """Whether a sweep that returned ``dropped`` left nothing idle behind it."""
    return len(dropped) < limit


class RecentMap(Generic[ValueT]):
    """The ``capacity`` most recently written keys and their values.

    Writing a key makes it the newest; past ``capacity`` the oldest is forgotten.
    Reading does not change the order.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must not be negative, got {capacity}")
        self.capacity = capacity
        self._values: OrderedDict[str, ValueT] = OrderedDict()

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    @overload
    def get(self, key: str, default: None = None) -> ValueT | None: ...
    @overload
    def get(self, key: str, default: ValueT) -> ValueT: ...
    def get(self, key: str, default: ValueT | None = None) -> ValueT | None:
        """The value of ``key``, or ``default`` if it was never written or is forgotten."""
        return self._values.get(key, default)

    def put(self, key: str, value: ValueT) -> None:
        self._values[key] = value
        self._values.move_to_end(key)
        while len(self._values) > self.capacity:
            self._values.popitem(last=False)


class RecentIds:
    """The newest ``capacity`` ids added: a bounded set, the oldest forgotten first."""

    def __init__(self, capacity: int) -> None:
        self._ids: RecentMap[None] = RecentMap(capacity)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, key: object) -> bool:
        return key in self._ids

    def add(self, key: str) -> bool:
        """Remember ``key``; False if it was remembered already (its age is kept)."""
        if key in self._ids:
            return False
        self._ids.put(key, None)
        return True
