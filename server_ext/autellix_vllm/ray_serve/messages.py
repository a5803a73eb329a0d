"""What the ingress, the request router, the engine replicas and the directory pass
each other (plain, picklable data; no Ray, no web framework)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autellix_vllm.policy.routing import Route
from autellix_vllm.protocol.identity import CallIdentity


@dataclass
class EngineCall:
    """One call for an engine replica, as the ingress accepted it.

    ``identity`` is what the engine is told (the identity the directory
    accepted, with the owner), and ``prior_service`` the program's service over
    every replica, which the replica states only if its engine counts service
    as the table does (``router.admission.states_prior_service``). The client's
    headers, credentials included, never travel. ``program_key``
    and ``prompt_tokens`` are what the request router places the call by, with
    ``bound_replica``, the program's binding in the table. ``avoid`` names
    replicas that already failed this call. ``route`` and ``placed_on`` (the
    replica ranked first) are written by the request router when it places the
    call, in the ingress's process before the call leaves it; the replica echoes
    the route back in :class:`AnswerHead`.
    """

    path: str
    raw: bytes
    identity: CallIdentity
    stream: bool
    program_key: str
    prompt_tokens: int
    prior_service: float | None = None
    bound_replica: str | None = None
    avoid: tuple[str, ...] = ()
    route: Route | None = None
    placed_on: str | None = None


@dataclass(frozen=True)
class AnswerHead:
    """An engine replica's answer to a call: whole (``body``), or the head of a
    stream whose bytes follow as further items.
    ``engine_failed``: the replica's engine could not take the call and did no
    work for it (no body follows): the call may go to another replica.
    """

    status: int
    headers: dict[str, str]
    replica: str  # the replica's unique id, as the request router names it
    route: Route | None
    body: bytes | None = None
    engine_failed: bool = False


@dataclass(frozen=True)
class Arrival:
    """A call for the directory to admit (``ProgramDirectory.admit``): its identity
    as read, and for a call that names no program, what a program is derived
    from (``router.derived``): its path, body and session headers (lower-case
    names; never the client's credentials)."""

    identity: CallIdentity
    path: str = ""
    body: Mapping[str, Any] = field(default_factory=dict)
    session_headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Admission:
    """The directory let a call in: the identity the engine is told (the derived
    program id, if one was derived, and the owner the call runs under), the
    program's service over every replica as an engine is told it (None: none),
    the replica the program is bound to, if any, and whether the call waits at
    the directory's flow-control gate before it goes (``ProgramDirectory.enter``)."""

    identity: CallIdentity
    prior_service: float | None
    bound_replica: str | None
    gated: bool = False


@dataclass(frozen=True)
class Refusal:
    """The directory refused a request: an ``ApiError``'s fields (exceptions with
    their own constructor do not survive pickling, so the error travels as data)."""

    status: int
    message: str
    code: str
    param: str | None = None


@dataclass(frozen=True)
class CallReport:
    """How a call ended, sent to the directory in batches (``ReportBatch``)."""

    program_id: str
    call_id: str | None
    replica: str | None  # the replica that answered, None if none did
    route: Route | None  # how the request router placed it
    service: float | None
    completed: bool
    path: str = ""
    response_id: str | None = None  # a response's id (a later previous_response_id)


@dataclass
class ReportBatch:
    """Call reports waiting to go to the directory, oldest first."""

    reports: list[CallReport] = field(default_factory=list)

    def add(self, report: CallReport) -> None:
        self.reports.append(report)

    def take(self) -> list[CallReport]:
        """Every waiting report, leaving none."""
        taken, self.reports = self.reports, []
        return taken

    def __len__(self) -> int:
        return len(self.reports)
