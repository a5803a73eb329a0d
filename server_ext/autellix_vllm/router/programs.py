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
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

MAIN_THREAD = "main"
# Completed call ids remembered per program, so a call retried by the client
# after it was answered (same call id) is charged once.
CHARGED_CALLS_KEPT = 256


@dataclass(eq=False)
class ProgramRecord:
    program_id: str
    name: str | None
    created_s: float
    issued: bool  # opened through the program API, not first seen in a call
    last_arrival_s: float | None = None
    last_completion_s: float | None = None
    # The engine the program is bound to (locality binding or hash owner), if any.
    engine: str | None = None
    rebinds: int = 0
    threads: set[str] = field(default_factory=set)
    calls_active: int = 0
    calls_completed: int = 0
    calls_failed: int = 0
    calls_per_engine: dict[str, int] = field(default_factory=dict)
    # Attained service (token equivalents, policy.config.ServiceMeter) over all engines.
    service: float = 0.0
    charged_calls: OrderedDict[str, None] = field(default_factory=OrderedDict)


class ProgramEnded(Exception):
    """A call or request named a program that has been ended."""


class ProgramTable:
    def __init__(
        self,
        ended_ids_kept: int,
        idle_ttl_s: float,
        clock: Callable[[], float] = time.time,
        on_drop: Callable[[str], None] = lambda program_id: None,
    ) -> None:
        self.ended_ids_kept = ended_ids_kept
        self.idle_ttl_s = idle_ttl_s
        self.clock = clock
        # Told the id of every program that leaves the table (ended or idle), so
        # that what else is kept per program (the balancer's binding) goes too.
        self.on_drop = on_drop
        # Least recently active first, so idle programs are found from the front.
        self._programs: OrderedDict[str, ProgramRecord] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._programs)

    def __iter__(self) -> Iterator[ProgramRecord]:
        return iter(list(self._programs.values()))

    def get(self, program_id: str) -> ProgramRecord | None:
        return self._programs.get(program_id)

    def is_ended(self, program_id: str) -> bool:
        return program_id in self._ended

    def issue(self, name: str | None = None) -> ProgramRecord:
        """Open a program under a new unguessable id."""
        self.evict_idle()
        program_id = "prog-" + secrets.token_urlsafe(18)  # 144 random bits
        record = ProgramRecord(program_id, name, created_s=self.clock(), issued=True)
        self._programs[program_id] = record
        return record

    def for_call(self, program_id: str) -> ProgramRecord:
        """The program a call names, opened if it is new; raises :class:`ProgramEnded`."""
        record = self._programs.get(program_id)
        if record is None:
            if program_id in self._ended:
                raise ProgramEnded(program_id)
            self.evict_idle()
            record = ProgramRecord(program_id, None, created_s=self.clock(), issued=False)
            self._programs[program_id] = record
        else:
            self._programs.move_to_end(program_id)
        return record

    def end(self, program_id: str) -> ProgramRecord | None:
        """End a program: it leaves the table and its id is refused from now on."""
        record = self._programs.pop(program_id, None)
        if record is not None:
            self.on_drop(program_id)
            self._ended[program_id] = None
            while len(self._ended) > self.ended_ids_kept:
                self._ended.popitem(last=False)
        return record

    def call_started(self, record: ProgramRecord, thread_id: str | None) -> None:
        record.threads.add(thread_id or MAIN_THREAD)
        record.calls_active += 1
        record.last_arrival_s = self.clock()

    def call_finished(
        self,
        record: ProgramRecord,
        engine: str | None,
        service: float | None,
        call_id: str | None,
    ) -> None:
        """A call ended: answered by ``engine`` with ``service``, or failed (engine None)."""
        record.calls_active -= 1
        record.last_completion_s = self.clock()
        if engine is None:
            record.calls_failed += 1
            return
        record.calls_completed += 1
        record.calls_per_engine[engine] = record.calls_per_engine.get(engine, 0) + 1
        if service and not self._charged_before(record, call_id):
            record.service += service
        if record.program_id in self._programs:
            self._programs.move_to_end(record.program_id)

    def bind(self, record: ProgramRecord, engine: str) -> None:
        if record.engine != engine:
            if record.engine is not None:
                record.rebinds += 1
            record.engine = engine

    def bound_to(self, engine: str) -> list[ProgramRecord]:
        return [r for r in self._programs.values() if r.engine == engine]

    def evict_idle(self) -> list[str]:
        """Drop programs idle for ``idle_ttl_s`` with nothing in flight (not ended:
        a later call of theirs opens them again)."""
        now = self.clock()
        dropped = []
        for program_id, record in self._programs.items():
            last = max(record.last_arrival_s or 0.0, record.last_completion_s or 0.0,
                       record.created_s)  # fmt: skip
            if now - last < self.idle_ttl_s:
                break
            if record.calls_active == 0:
                dropped.append(program_id)
        for program_id in dropped:
            del self._programs[program_id]
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
            for r in self._programs.values()
        ]

    @staticmethod
    def _charged_before(record: ProgramRecord, call_id: str | None) -> bool:
        if call_id is None:
            return False
        if call_id in record.charged_calls:
            return True
        record.charged_calls[call_id] = None
        if len(record.charged_calls) > CHARGED_CALLS_KEPT:
            record.charged_calls.popitem(last=False)
        return False
