"""The router's global process table: one entry per program, across all engines.

The engines each keep their own table (for scheduling); this one is what only
the router can know: which engines a program's calls ran on, its binding, and
its attained service summed over every engine, which the router hands to the
engine of the program's next call as ``X-Autellix-Prior-Service``.

Ids: ``POST /autellix/v1/programs`` issues them (144 random bits). A call whose
id the router never issued opens a program under that id (the SDK falls back
to local ids when it cannot reach the program API). An ended id is remembered
(the newest ``ended_ids_kept`` of them) and refused, so a late call of an
ended program is not silently re-created.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from autellix_vllm.policy.bounded import CHARGED_CALLS_KEPT, IdleTable, RecentIds
from autellix_vllm.policy.routing import Route
from autellix_vllm.policy.table import MAIN_THREAD


@dataclass(eq=False)
class ProgramRecord:
    """One program as the router sees it; only :class:`ProgramTable` writes to it."""

    program_id: str
    name: str | None
    created_s: float
    issued: bool  # opened through the program API, not first seen in a call
    last_arrival_s: float | None = None
    last_completion_s: float | None = None
    # The engine the program is bound to (by the last route that binds), if any.
    engine: str | None = None
    rebinds: int = 0
    threads: set[str] = field(default_factory=set)
    calls_active: int = 0
    calls_completed: int = 0
    calls_failed: int = 0
    # Engines its calls were sent to -> calls completed there.
    calls_per_engine: dict[str, int] = field(default_factory=dict)
    # Attained service (token equivalents, policy.config.ServiceMeter) over all engines.
    service: float = 0.0
    charged_calls: RecentIds = field(default_factory=lambda: RecentIds(CHARGED_CALLS_KEPT))

    @property
    def last_active_s(self) -> float:
        return max(self.last_arrival_s or 0.0, self.last_completion_s or 0.0, self.created_s)

    @property
    def busy(self) -> bool:
        return self.calls_active > 0


class ProgramEnded(Exception):
    """A call or request named a program that has been ended."""


class ProgramTable:
    """The router's records, one per program; every change to a record goes through here.

    A call meets the table three times: :meth:`call_arrived` (the record,
    opened if new), :meth:`routed` (the engine chosen for it) and
    :meth:`call_finished` (its outcome and service).
    """

    def __init__(
        self,
        ended_ids_kept: int,
        idle_ttl_s: float,
        clock: Callable[[], float] = time.time,
        on_drop: Callable[[str], None] = lambda program_id: None,
    ) -> None:
        self.clock = clock
        # Told the id of every program that leaves the table (ended or idle), so
        # that what else is kept per program (the balancer's binding) goes too.
        self.on_drop = on_drop
        self._programs: IdleTable[ProgramRecord] = IdleTable(idle_ttl_s)
        self._ended = RecentIds(ended_ids_kept)

    def __len__(self) -> int:
        return len(self._programs)

    def __iter__(self) -> Iterator[ProgramRecord]:
        return iter(self._programs)

    def get(self, program_id: str) -> ProgramRecord | None:
        return self._programs.get(program_id)

    def is_ended(self, program_id: str) -> bool:
        return program_id in self._ended

    def issue(self, name: str | None = None) -> ProgramRecord:
        """Open a program under a new unguessable id."""
        self.evict_idle()
        program_id = "prog-" + secrets.token_urlsafe(18)  # 144 random bits
        record = ProgramRecord(program_id, name, created_s=self.clock(), issued=True)
        self._programs.add(program_id, record)
        return record

    def call_arrived(self, program_id: str, thread_id: str | None) -> ProgramRecord:
        """A call of ``program_id`` arrived: its record (opened if the id is new),
        counting the call as active. Raises :class:`ProgramEnded` for an ended id."""
        record = self._programs.get(program_id)
        if record is None:
            if program_id in self._ended:
                raise ProgramEnded(program_id)
            self.evict_idle()
            record = ProgramRecord(program_id, None, created_s=self.clock(), issued=False)
            self._programs.add(program_id, record)
        else:
            self._programs.touch(program_id)
        record.threads.add(thread_id or MAIN_THREAD)
        record.calls_active += 1
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
        engine: str | None,
        service: float | None,
        call_id: str | None,
    ) -> None:
        """A call ended: answered by ``engine`` with ``service``, or failed (engine None).

        A call id already charged (a retry of an answered call) adds no service.
        """
        record.calls_active -= 1
        record.last_completion_s = self.clock()
        if engine is None:
            record.calls_failed += 1
            return
        record.calls_completed += 1
        record.calls_per_engine[engine] = record.calls_per_engine.get(engine, 0) + 1
        if service and (call_id is None or record.charged_calls.add(call_id)):
            record.service += service
        self._programs.touch(record.program_id)

    def end(self, program_id: str) -> ProgramRecord | None:
        """End a program: it leaves the table and its id is refused from now on."""
        record = self._programs.pop(program_id)
        if record is not None:
            self.on_drop(program_id)
            self._ended.add(program_id)
        return record

    def bound_to(self, engine: str) -> list[ProgramRecord]:
        """Programs bound to ``engine`` (see :meth:`routed`)."""
        return [r for r in self._programs if r.engine == engine]

    def evict_idle(self) -> list[str]:
        """Drop programs idle for ``idle_ttl_s`` with nothing in flight (not ended:
        a later call of theirs opens them again)."""
        dropped = self._programs.drop_idle(self.clock())
        for program_id in dropped:
            self.on_drop(program_id)
        return dropped

    def snapshot(self, waits: dict[str, float]) -> list[dict[str, Any]]:
        """Plain data for ``GET /autellix/v1/programs``; ``waits`` is the waiting
        time the engines report per program, summed over engines."""
        now = self.clock()
        return [
            {
                "program_id": r.program_id,
                "name": r.name,
                "engine": r.engine,
                "engines": dict(r.calls_per_engine),
                "rebinds": r.rebinds,
                "threads": len(r.threads),
                "calls_active": r.calls_active,
                "calls_completed": r.calls_completed,
                "calls_failed": r.calls_failed,
                "service": r.service,
                "waiting_time": waits.get(r.program_id, 0.0),
                "last_arrival_s": r.last_arrival_s,
                "last_completion_s": r.last_completion_s,
                "age_s": now - r.created_s,
            }
            for r in self._programs
        ]
