"""The router's global process table: one entry per program, across all engines.

The engines each keep their own table (for scheduling); this one is what only
the router can know: which engines a program's calls ran on, its binding, and
its attained service summed over every engine, which the router hands to the
engine of the program's next call as ``X-Autellix-Prior-Service``.

Ids: ``POST /autellix/v1/programs`` issues them (144 random bits). A call whose
id the router never issued opens a program under that id (the SDK falls back
to local ids when it cannot reach the program API). An ended id is remembered
(the newest ``ended_ids_kept`` of them) and refused, so a late call of an
ended program is not silently re-created. The final rows of the programs each
owner ended last (``ended_rows_kept`` per owner) are kept for listing
(``autellix ps --all``), with their timelines (``autellix ps PROGRAM``), so
that a program of a few seconds can be looked at after it ended.

Owners: a program belongs to the client (key) that opened it. Another client
gets 404 ``program_not_found`` for it, whether it calls, ends or lists it, as
for an id never seen; the admin key sees every program.

Classes and shares: a program's class is the band its latest call was stated
(``admission``); each key's share is the service all its programs attained,
here since the router started, over the key's weight (:meth:`ProgramTable.key_rows`),
the quantity the engines' fair share balances between keys inside a band.

Bounds (``policy.config.TableBounds``), all refused before anything changes:
programs in the table, in all and per key (429 ``too_many_programs``, after
dropping idle ones); one program's threads, fork depth and live calls (400,
``policy.config.ProgramLimits``);
a call id in flight or already completed (409 ``call_id_reused``). A call id
may be used again only by a retry of an attempt that did not complete.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from autellix_vllm.policy.bounded import (
    CHARGED_CALLS_KEPT,
    IdleTable,
    RecentIds,
    RecentMap,
    swept_all,
)
from autellix_vllm.policy.config import DEFAULT_BOUNDS, TableBounds
from autellix_vllm.policy.forks import LimitCrossed, limit_crossed, new_threads
from autellix_vllm.policy.routing import Route
from autellix_vllm.protocol.identity import (
    CALL_ID_HEADER,
    IDENTITY_HEADERS,
    PROGRAM_ID_HEADER,
    CallIdentity,
    band_name,
)
from autellix_vllm.router.errors import ApiError
from autellix_vllm.router.keys import ANONYMOUS, Client
from autellix_vllm.router.timeline import CallSpan, new_spans, timeline

# Final rows of ended programs kept per owner, for listing (newest first).
ENDED_ROWS_KEPT = 100


@dataclass(eq=False, slots=True)
class ProgramRecord:
    """One program as the router sees it; only :class:`ProgramTable` writes to it.

    Slots, and completed call ids kept only once there are some: the table may
    hold 100,000 records, and every container object is more work for each of
    Python's full garbage collections (which stop the event loop).
    """

    program_id: str
    name: str | None
    created_s: float
    issued: bool  # opened through the program API, not first seen in a call
    owner: str = ANONYMOUS.owner  # Client.owner of the key that opened it
    owner_name: str = ANONYMOUS.name
    weight: float = 1.0  # Client.weight of the key that opened it
    band: int = 0  # the band its latest call was stated (its class)
    seq: int = 0  # order of opening, for paging
    last_arrival_s: float | None = None
    last_completion_s: float | None = None
    # The engine the program is bound to (by the last route that binds), if any.
    engine: str | None = None
    rebinds: int = 0
    # Thread id -> its fork depth (policy.forks: forks below its root, which is 0).
    threads: dict[str, int] = field(default_factory=dict)
    calls_active: int = 0
    calls_completed: int = 0
    calls_failed: int = 0
    # Engines its calls were sent to -> calls completed there.
    calls_per_engine: dict[str, int] = field(default_factory=dict)
    # Attained service (token equivalents, policy.config.ServiceMeter) over all engines.
    service: float = 0.0
    calls_in_flight: set[str] = field(default_factory=set)
    # Its newest completed call ids (made on its first completed call with an id).
    completed_calls: RecentIds | None = None
    # Its newest finished calls, for its timeline (made on its first finished call).
    spans: deque[CallSpan] | None = None

    @property
    def last_active_s(self) -> float:
        return max(self.last_arrival_s or 0.0, self.last_completion_s or 0.0, self.created_s)

    @property
    def busy(self) -> bool:
        return self.calls_active > 0


@dataclass(slots=True)
class KeyAccount:
    """What one key's programs attained, for its share (service over weight)."""

    name: str
    band: int  # the key's class: its calls' band unless they ask for another
    weight: float
    service: float = 0.0


# ---- refusals ------------------------------------------------------------------------


class ProgramEnded(ApiError):
    """A call or request named a program its caller has ended."""

    def __init__(self, program_id: str, param: str | None = PROGRAM_ID_HEADER) -> None:
        super().__init__(404, f"the program {program_id!r} has ended", "program_ended", param)


class ProgramNotFound(ApiError):
    """No such program for this caller (never opened, or another key's)."""

    def __init__(self, program_id: str, param: str | None = PROGRAM_ID_HEADER) -> None:
        super().__init__(404, f"no program {program_id!r}", "program_not_found", param)


class TooManyPrograms(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(429, message, "too_many_programs")


class CallIdReused(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(409, message, "call_id_reused", CALL_ID_HEADER)


class ProgramLimitExceeded(ApiError):
    """A call would grow its program past one of ``ProgramLimits`` (the fork rule's
    refusal, :func:`~autellix_vllm.policy.forks.limit_crossed`)."""

    def __init__(self, crossed: LimitCrossed) -> None:
        super().__init__(400, crossed.message, crossed.code, IDENTITY_HEADERS[crossed.part])


# ---- paging --------------------------------------------------------------------------


@dataclass
class Page:
    """One page of the programs a caller may see (``ProgramTable.page``)."""

    records: list[ProgramRecord]
    total: int  # programs the caller may see
    next_after: int | None  # the ``after`` of the next page; None on the last page


class OpeningOrder:
    """Records in the order they were opened, for paging by ``seq``.

    Removal is lazy (a record that left the table is skipped when read) and the
    list is compacted once half of it is gone, so that removing many records
    at once (an idle sweep) costs one pass, not one pass each.
    """

    COMPACT_AT = 1024

    def __init__(self, in_table: Callable[[ProgramRecord], bool]) -> None:
        self._in_table = in_table
        self._records: list[ProgramRecord] = []
        self._gone = 0

    def __len__(self) -> int:
        return len(self._records) - self._gone

    def add(self, record: ProgramRecord) -> None:
        self._records.append(record)  # seqs only grow: the list stays sorted

    def removed(self, count: int = 1) -> None:
        """``count`` of the records have left the table (all of those that left
        since the last call: compacting drops every record not in the table)."""
        self._gone += count
        if self._gone >= self.COMPACT_AT and self._gone * 2 >= len(self._records):
            self._records = [r for r in self._records if self._in_table(r)]
            self._gone = 0

    def page(self, after: int | None, limit: int) -> tuple[list[ProgramRecord], int | None]:
        start = 0
        if after is not None:
            start = bisect.bisect_right(self._records, after, key=lambda r: r.seq)
        found: list[ProgramRecord] = []
        for index in range(start, len(self._records)):
            record = self._records[index]
            if not self._in_table(record):
                continue
            if len(found) == limit:
                return found, found[-1].seq
            found.append(record)
        return found, None


# ---- the table -----------------------------------------------------------------------


class ProgramTable:
    """The router's records, one per program; every change to a record goes through here.

    A call meets the table three times: :meth:`call_arrived` (the record,
    opened if new, after every check), :meth:`routed` (the engine chosen for
    it) and :meth:`call_finished` (its outcome and service).
    """

    def __init__(
        self,
        bounds: TableBounds = DEFAULT_BOUNDS,
        clock: Callable[[], float] = time.time,
        on_drop: Callable[[str], None] = lambda program_id: None,
        *,
        ended_rows_kept: int = ENDED_ROWS_KEPT,
    ) -> None:
        self.clock = clock
        # Told the id of every program that leaves the table (ended or idle), so
        # that what else is kept per program (the balancer's binding) goes too.
        self.on_drop = on_drop
        self.bounds = bounds
        self._programs: IdleTable[ProgramRecord] = IdleTable(bounds.idle_ttl_s)
        self._ended: RecentMap[str] = RecentMap(bounds.ended_ids_kept)  # ended id -> its owner
        self.ended_rows_kept = ended_rows_kept
        # Owner -> the final rows of its programs that ended last, oldest first.
        self._ended_rows: dict[str, deque[dict[str, Any]]] = {}
        # Owner -> the timelines of the same programs: program id -> (name, its
        # newest finished calls, calls finished), oldest ended first.
        self._ended_timelines: dict[str, dict[str, tuple[str | None, list[CallSpan], int]]] = {}
        # Program id -> owner, for the programs in the table (an idle sweep names
        # only the ids it dropped).
        self._owners: dict[str, str] = {}
        self._opened = OpeningOrder(self._in_table)
        self._opened_by_owner: dict[str, OpeningOrder] = {}
        # Owner -> its key's account, from its first program on (one per key).
        self._accounts: dict[str, KeyAccount] = {}
        self._next_seq = 0

    def __len__(self) -> int:
        return len(self._programs)

    def __iter__(self) -> Iterator[ProgramRecord]:
        return iter(self._programs)

    def get(self, program_id: str) -> ProgramRecord | None:
        return self._programs.get(program_id)

    def is_ended(self, program_id: str) -> bool:
        return program_id in self._ended

    def issue(self, name: str | None = None, caller: Client = ANONYMOUS) -> ProgramRecord:
        """Open a program for ``caller`` under a new unguessable id."""
        program_id = "prog-" + secrets.token_urlsafe(18)  # 144 random bits
        return self._open(program_id, name, caller, issued=True)

    def call_arrived(
        self, identity: CallIdentity, caller: Client = ANONYMOUS, name: str | None = None
    ) -> ProgramRecord:
        """A call of ``identity.program_id`` arrived: its record (opened if the id is
        new, under ``name``), counting the call as active and noting its band
        (``identity.priority``, as the router states it). Raises an
        :class:`ApiError` (see the module) and changes nothing if the call may not run."""
        program_id, call_id = identity.program_id, identity.call_id
        if program_id is None:
            raise ValueError("a call without a program id has no record")
        record = self._programs.get(program_id)
        if record is not None and not caller.may_see(record.owner):
            raise ProgramNotFound(program_id)
        if record is None:
            self._refuse_ended(program_id, caller)
        if call_id is not None and record is not None:
            if call_id in record.calls_in_flight:
                raise CallIdReused(f"the call id {call_id!r} is already in flight")
            if record.completed_calls is not None and call_id in record.completed_calls:
                raise CallIdReused(
                    f"the call id {call_id!r} has completed; a call id may be used again"
                    " only to retry an attempt that did not complete"
                )
        known = record.threads if record is not None else {}
        created = new_threads(identity.thread_id, identity.parent_thread_id, known.get)
        live_calls = record.calls_active if record is not None else 0
        crossed = limit_crossed(self.bounds.limits, len(known), live_calls, created)
        if crossed is not None:
            raise ProgramLimitExceeded(crossed)
        if record is None:
            record = self._open(program_id, name, caller, issued=False)
        else:
            self._programs.touch(program_id)
        record.threads.update((new.thread_id, new.depth) for new in created)
        record.calls_active += 1
        record.band = identity.priority or 0
        if call_id is not None:
            record.calls_in_flight.add(call_id)
        record.last_arrival_s = self.clock()
        return record

    def routed(self, record: ProgramRecord, engine: str, route: Route) -> None:
        """A call of the program goes to ``engine``, as ``route`` decided.

        The engine joins the program's engines at once, so that ending the
        program reaches it while the call is still in flight. A route that
        binds ties the program to the engine; a change of engine is a rebind.
        """
        record.calls_per_engine.setdefault(engine, 0)
        if route.binds and record.engine != engine:
            if record.engine is not None:
                record.rebinds += 1
            record.engine = engine

    def call_finished(
        self,
        record: ProgramRecord,
        call_id: str | None,
        *,
        engine: str | None,
        service: float | None,
        completed: bool,
        span: CallSpan | None = None,
    ) -> None:
        """A call ended: ``completed`` (answered in full by ``engine``) or not.

        ``service`` is what the engine did for it, charged either way: an
        attempt that did not complete (a stream the client dropped) is charged
        its work, and one that failed before any work costs nothing, so a
        retry of it is charged once. ``span``: where its time went, for the
        program's timeline.
        """
        if span is not None:
            if record.spans is None:
                record.spans = new_spans()
            record.spans.append(span)
        record.calls_active -= 1
        record.last_completion_s = self.clock()
        if call_id is not None:
            record.calls_in_flight.discard(call_id)
        if service:
            record.service += service
            self._accounts[record.owner].service += service
        if completed and engine is not None:
            record.calls_completed += 1
            record.calls_per_engine[engine] = record.calls_per_engine.get(engine, 0) + 1
            if call_id is not None:
                if record.completed_calls is None:
                    record.completed_calls = RecentIds(CHARGED_CALLS_KEPT)
                record.completed_calls.add(call_id)
        else:
            record.calls_failed += 1
        self._programs.touch(record.program_id)

    def end(
        self, program_id: str, caller: Client = ANONYMOUS, waiting_time: float = 0.0
    ) -> ProgramRecord:
        """End a program: it leaves the table and its id is refused from now on.
        Its final row (``waiting_time`` as in :meth:`row`) is kept for
        :meth:`ended_rows`."""
        record = self._visible(program_id, caller)
        self._drop(record)
        self._ended.put(program_id, record.owner)
        final = {**self.row(record, waiting_time), "ended_s": self.clock()}
        rows = self._ended_rows.get(record.owner)
        if rows is None:
            rows = self._ended_rows[record.owner] = deque(maxlen=self.ended_rows_kept)
        rows.append(final)
        timelines = self._ended_timelines.setdefault(record.owner, {})
        timelines[program_id] = (record.name, list(record.spans or ()), _finished(record))
        if len(timelines) > self.ended_rows_kept:
            del timelines[next(iter(timelines))]
        return record

    def ended_rows(self, caller: Client, limit: int) -> tuple[list[dict[str, Any]], int]:
        """Up to ``limit`` final rows of the ended programs ``caller`` may see, the
        last ended first, each with ``ended_ago_s``; and how many are kept."""
        if caller.admin:
            kept = list(self._ended_rows.values())
        else:
            kept = [self._ended_rows.get(caller.owner, deque())]
        newest_first = heapq.merge(
            *(reversed(rows) for rows in kept), key=lambda row: row["ended_s"], reverse=True
        )
        now = self.clock()
        shown = [
            {**row, "ended_ago_s": now - row["ended_s"]}
            for row in itertools.islice(newest_first, limit)
        ]
        return shown, sum(len(rows) for rows in kept)

    def page(self, caller: Client, after: int | None, limit: int) -> Page:
        """Up to ``limit`` of the programs ``caller`` may see, opened after ``after``
        (a ``seq``), oldest first."""
        order = self._opened if caller.admin else self._opened_by_owner.get(caller.owner)
        if order is None:
            return Page([], 0, None)
        records, next_after = order.page(after, limit)
        return Page(records, len(order), next_after)

    def timeline(self, program_id: str, caller: Client) -> dict[str, Any]:
        """The timeline of a program ``caller`` may see (:func:`timeline`), with its id,
        also of one of the programs its owner ended last (``ended``: true);
        :class:`ProgramNotFound` or :class:`ProgramEnded` if there is none."""
        owner = self._ended.get(program_id, None)
        kept = self._ended_timelines.get(owner, {}).get(program_id) if owner else None
        if kept is not None and owner is not None and caller.may_see(owner):
            name, spans, finished = kept
            return {"program_id": program_id, "name": name, "ended": True, "calls_active": 0,
                    **timeline(spans, finished)}  # fmt: skip
        record = self._visible(program_id, caller)
        return {
            "program_id": program_id,
            "name": record.name,
            "ended": False,
            "calls_active": record.calls_active,
            **timeline(list(record.spans or ()), _finished(record)),
        }

    def bound_to(self, engine: str) -> list[ProgramRecord]:
        """Programs bound to ``engine`` (see :meth:`routed`)."""
        return [r for r in self._programs if r.engine == engine]

    def evict_idle(self) -> list[str]:
        """Drop programs idle for ``idle_ttl_s`` with nothing in flight (not ended:
        a later call of theirs opens them again), at most ``SWEEP_BATCH`` of them
        (a full batch may have left more: :meth:`sweep_forever` sweeps again)."""
        dropped = self._programs.drop_idle(self.clock())
        self._forget(dropped)
        return dropped

    async def sweep_forever(self, interval_s: float) -> None:
        """Every ``interval_s``, drop the idle programs: one batch at a time, letting
        the event loop serve requests between batches, until none is left."""
        while True:
            await asyncio.sleep(interval_s)
            while not swept_all(self.evict_idle()):
                await asyncio.sleep(0)

    def key_rows(self, caller: Client) -> list[dict[str, Any]]:
        """The accounts of the keys ``caller`` may see (the admin: every key that has
        opened a program), by name: each key's class, weight, service over all its
        programs since the router started, share (service over weight) and
        programs in the table."""
        rows = []
        for owner, account in self._accounts.items():
            if not caller.may_see(owner):
                continue
            opened = self._opened_by_owner.get(owner)
            rows.append({
                "name": account.name,
                "class": band_name(account.band),
                "weight": account.weight,
                "service": account.service,
                "share": account.service / account.weight,
                "programs": len(opened) if opened is not None else 0,
            })  # fmt: skip
        return sorted(rows, key=lambda row: row["name"])

    def row(self, record: ProgramRecord, waiting_time: float) -> dict[str, Any]:
        """Plain data for ``GET /autellix/v1/programs``; ``waiting_time`` is what the
        engines report for the program, summed over engines."""
        return {
            "program_id": record.program_id,
            "name": record.name,
            "owner": record.owner_name,
            "class": band_name(record.band),
            "engine": record.engine,
            "engines": dict(record.calls_per_engine),
            "rebinds": record.rebinds,
            "threads": len(record.threads),
            "calls_active": record.calls_active,
            "calls_completed": record.calls_completed,
            "calls_failed": record.calls_failed,
            "service": record.service,
            "waiting_time": waiting_time,
            "last_arrival_s": record.last_arrival_s,
            "last_completion_s": record.last_completion_s,
            "age_s": self.clock() - record.created_s,
        }

    # ---- inside ----------------------------------------------------------------------

    def _open(
        self, program_id: str, name: str | None, caller: Client, issued: bool
    ) -> ProgramRecord:
        self._make_room(caller)
        record = ProgramRecord(
            program_id,
            name,
            created_s=self.clock(),
            issued=issued,
            owner=caller.owner,
            owner_name=caller.name,
            weight=caller.weight,
            seq=self._next_seq,
        )
        if caller.owner not in self._accounts:
            self._accounts[caller.owner] = KeyAccount(caller.name, caller.band, caller.weight)
        self._next_seq += 1
        self._programs.add(program_id, record)
        self._owners[program_id] = caller.owner
        self._opened.add(record)
        owned = self._opened_by_owner.get(caller.owner)
        if owned is None:
            owned = self._opened_by_owner[caller.owner] = OpeningOrder(self._in_table)
        owned.add(record)
        return record

    def _make_room(self, caller: Client) -> None:
        """Drop idle programs; refuse a new one if the table or the caller's share
        of it is still full."""
        self.evict_idle()  # stops at the first program that is not idle: cheap
        bounds = self.bounds
        if len(self._programs) >= bounds.max_programs:
            raise TooManyPrograms(
                f"the router holds {bounds.max_programs} programs, its limit; end programs"
                " that are done"
            )
        owned = self._opened_by_owner.get(caller.owner)
        if owned is not None and len(owned) >= bounds.max_programs_per_key:
            raise TooManyPrograms(
                f"this key has {bounds.max_programs_per_key} programs open, its limit; end"
                " programs that are done"
            )

    def _refuse_ended(
        self, program_id: str, caller: Client, param: str = PROGRAM_ID_HEADER
    ) -> None:
        owner = self._ended.get(program_id)
        if owner is None:
            return
        if caller.may_see(owner):
            raise ProgramEnded(program_id, param)
        raise ProgramNotFound(program_id, param)

    def _visible(self, program_id: str, caller: Client) -> ProgramRecord:
        """The record of a program in the table that ``caller`` may see; else the
        refusal a request naming it in its path gets (ended, or not found)."""
        record = self._programs.get(program_id)
        if record is None or not caller.may_see(record.owner):
            self._refuse_ended(program_id, caller, param="program_id")
            raise ProgramNotFound(program_id, param="program_id")
        return record

    def _in_table(self, record: ProgramRecord) -> bool:
        return self._programs.get(record.program_id) is record

    def _drop(self, record: ProgramRecord) -> None:
        self._programs.pop(record.program_id)
        self._forget([record.program_id])

    def _forget(self, program_ids: list[str]) -> None:
        """``program_ids`` (all that left the table since the last call) are gone:
        forget them everywhere else. The opening orders hear of them at once, so
        that one that compacts itself does not count a record twice."""
        if not program_ids:
            return
        per_owner: Counter[str] = Counter()
        for program_id in program_ids:
            self.on_drop(program_id)
            per_owner[self._owners.pop(program_id)] += 1
        self._opened.removed(len(program_ids))
        for owner, count in per_owner.items():
            owned = self._opened_by_owner[owner]
            owned.removed(count)
            if not owned:
                del self._opened_by_owner[owner]


def _finished(record: ProgramRecord) -> int:
    """The program's calls that ended, completed or not."""
    return record.calls_completed + record.calls_failed
