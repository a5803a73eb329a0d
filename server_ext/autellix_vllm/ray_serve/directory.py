"""The global process table for many ingress replicas: one directory, asked once per call.

Design: the table (:class:`autellix_vllm.router.programs.ProgramTable`, the
router's own, unchanged: bounded, owner-scoped, the same refusals) lives in
one place, a single Serve replica (``app``), and every ingress replica asks it
when a call of a program arrives (:meth:`ProgramDirectory.admit`): that is the
one round trip a call pays, and it must be synchronous, since the table may
refuse the call (ended program, another key's program, limits, a reused call
id) and since it answers with the program's service over every replica, which
the engine ranks the call by. How calls ended (service, replica, binding)
travels the other way in batches (:class:`~.messages.ReportBatch`), on the
next admission or after a short interval, so the service a call sees is the
program's as of the reports that landed; a report applies before the
admission it travels with.

Why not partition programs over the ingress replicas by id: Serve's HTTP
proxies spread requests over ingress replicas without regard to programs, so
a partition would need an ingress-to-ingress hop on most calls, the same cost
as one hop to the directory, and re-partitioning whenever ingress replicas
come and go.

A call is admitted by the router's own rules (``router.admission``): a call
that names no program gets the one ``router.derived`` names from its session
headers and body, the call runs under its program's owner, and the prior
service is clamped as the router clamps it. Derived programs idle for
``derived_idle_end_s`` are ended here as the router ends them (their clients
never do); the engines drop their contexts on their own idle TTL.

With ``flow_control`` (``autellix ray-serve --flow-control``), the directory
also keeps the router's flow-control gate for the whole pool (``flow_control``:
the engine replicas' seats summed, the calls in flight over every ingress
replica): an admitted call is told to wait at it (``Admission.gated``), and the
ingress awaits :meth:`ProgramDirectory.enter` before it sends the call to an
engine replica and names it to :meth:`ProgramDirectory.leave` once it ended.

The directory is plain Python; ``app`` wraps it in a Serve deployment. Errors
are returned as :class:`~.messages.Refusal` values, not raised: they cross a
process boundary. Serve runs a replica's plain methods on a thread pool, so
several admissions may run at once: one lock keeps the table's updates whole.
The gate's methods are ``async``: they run on the replica's event loop, where
the held calls wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from autellix_vllm.policy.config import DEFAULT_BOUNDS, TableBounds
from autellix_vllm.policy.flow_control import FlowControlConfig
from autellix_vllm.protocol.identity import band_name
from autellix_vllm.ray_serve.flow_control import TicketGate
from autellix_vllm.ray_serve.messages import Admission, Arrival, CallReport, Refusal
from autellix_vllm.router.admission import admit, answered, prior_service
from autellix_vllm.router.config import RouterConfig
from autellix_vllm.router.derived import ProgramDeriver
from autellix_vllm.router.errors import ApiError
from autellix_vllm.router.flow_control import Gate, Pass
from autellix_vllm.router.keys import Client
from autellix_vllm.router.programs import ProgramTable


def _refusal(error: ApiError) -> Refusal:
    return Refusal(error.status, error.message, error.code, error.param)


class ProgramDirectory:
    """The process table behind every ingress replica."""

    def __init__(
        self,
        *,
        bounds: TableBounds = DEFAULT_BOUNDS,
        derived_programs: bool = RouterConfig.derived_programs,
        prefix_programs: bool = RouterConfig.prefix_programs,
        derived_idle_end_s: float = RouterConfig.derived_idle_end_s,
        flow_control: FlowControlConfig | None = None,
        seats: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``derived_programs``, ``prefix_programs``, ``derived_idle_end_s``,
        ``flow_control``: as the router's options of the same names
        (``RouterConfig``); ``seats``: the engine replicas' seats summed, the
        pool the gate fills (None: unknown, the gate holds nothing)."""
        self.limits = bounds.limits
        self.deriver = (
            ProgramDeriver(derived_idle_end_s, prefix_programs) if derived_programs else None
        )
        on_drop = self.deriver.forget if self.deriver is not None else lambda program_id: None
        self.table = ProgramTable(bounds, clock, on_drop)
        self._lock = threading.Lock()
        # The flow-control gate (None: off, every call goes at once). This path
        # exports no metrics: the held calls are read with flow().
        self.gate: TicketGate | None = None
        if flow_control is not None:
            self.gate = TicketGate(Gate(flow_control, lambda: seats, lambda held: None))

    def issue(self, name: str | None, caller: Client) -> dict[str, Any] | Refusal:
        """Open a program for ``caller`` (``POST /autellix/v1/programs``)."""
        try:
            with self._lock:
                record = self.table.issue(name, caller)
        except ApiError as error:
            return _refusal(error)
        return {"program_id": record.program_id, "name": record.name, "created": record.created_s}

    def admit(
        self, arrival: Arrival, caller: Client, reports: list[CallReport] | None = None
    ) -> Admission | Refusal:
        """Apply ``reports``, then let a call in (counting it as active, in the
        program it names or one derived for it) or refuse it."""
        try:
            with self._lock:
                self._apply(reports or [])
                self._end_idle_derived()
                admitted = admit(
                    self.table,
                    self.deriver,
                    arrival.identity,
                    caller,
                    arrival.path,
                    arrival.body,
                    arrival.session_headers,
                )
        except ApiError as error:
            return _refusal(error)
        record = admitted.record
        gated = self.gate is not None
        if record is None:
            return Admission(admitted.identity, prior_service=None, bound_replica=None, gated=gated)
        return Admission(
            admitted.identity, prior_service(record.service, self.limits), record.engine, gated
        )

    async def enter(self, ticket: str, band: int, owner: str) -> Pass | None:
        """Wait at the flow-control gate until the call ``ticket`` (the ingress's
        name for it) may go; how it goes (``TicketGate.enter``). Without the gate
        every call goes at once."""
        if self.gate is None:
            return Pass(band)
        return await self.gate.enter(ticket, band, owner)

    async def leave(self, tickets: list[str]) -> None:
        """The calls ``tickets`` ended, or their clients left: their seats (or their
        places in the queue) are free."""
        if self.gate is not None:
            self.gate.leave(tickets)

    async def flow(self) -> dict[str, Any] | None:
        """The gate now: calls held by class, and calls in flight (None: no gate)."""
        if self.gate is None:
            return None
        held = {band_name(band): count for band, count in self.gate.held().items()}
        return {"held": held, "in_flight": self.gate.in_flight()}

    def apply(self, reports: list[CallReport]) -> None:
        """Record how calls ended. A report of a program that left the table since
        (ended, or dropped idle) changes nothing."""
        with self._lock:
            self._apply(reports)

    def _apply(self, reports: list[CallReport]) -> None:
        for report in reports:
            record = self.table.get(report.program_id)
            if record is None:
                continue
            if report.replica is not None and report.route is not None:
                self.table.routed(record, report.replica, report.route)
            self.table.call_finished(
                record,
                report.call_id,
                engine=report.replica,
                service=report.service,
                completed=report.completed,
            )
            answered(self.deriver, record, report.path, report.completed, report.response_id)

    def _end_idle_derived(self) -> None:
        """End the derived programs idle for ``derived_idle_end_s`` with nothing in
        flight, as their owner would (a busy one is looked at again later)."""
        if self.deriver is None:
            return
        for program_id in self.deriver.idle(self.table.clock()):
            record = self.table.get(program_id)
            if record is None:
                continue
            if record.busy:
                self.deriver.watch(record)
                continue
            self.table.end(program_id, Client(owner=record.owner, name=record.owner_name))

    def end(
        self, program_id: str, caller: Client, reports: list[CallReport] | None = None
    ) -> dict[str, Any] | Refusal:
        """End a program (after applying ``reports``); its id is refused from now on.
        Answers with the replicas its calls ran on."""
        try:
            with self._lock:
                self._apply(reports or [])
                record = self.table.end(program_id, caller)
        except ApiError as error:
            return _refusal(error)
        return {
            "program_id": program_id,
            "ended": True,
            "replicas": sorted(record.calls_per_engine),
        }

    def page(
        self, caller: Client, after: int | None, limit: int, reports: list[CallReport] | None = None
    ) -> dict[str, Any]:
        """One page of the programs ``caller`` may see, and the keys' accounts, as
        ``GET /autellix/v1/programs`` lists them (waiting times are the engines'
        and are not asked here: 0)."""
        with self._lock:
            self._apply(reports or [])
            page = self.table.page(caller, after, limit)
            rows = [self.table.row(r, 0.0) for r in page.records]
            keys = self.table.key_rows(caller)
        return {
            "programs": rows,
            "total": page.total,
            "has_more": page.next_after is not None,
            "next_after": None if page.next_after is None else str(page.next_after),
            "keys": keys,
        }

    def evict_idle(self) -> int:
        """Drop idle programs (one batch); how many were dropped."""
        with self._lock:
            return len(self.table.evict_idle())
