"""What the ingress, the request router, the engine replicas and the directory pass
each other (plain, picklable data; no Ray, no web framework)."""

from __future__ import annotations

from dataclasses import dataclass, field

from autellix_vllm.policy.routing import Route


@dataclass
class EngineCall:
    """One call for an engine replica, as the ingress accepted it.

    ``headers`` are what the engine is told (the accepted identity, the prior
    service, the content type), never the client's credentials. ``program_key``
    and ``prompt_tokens`` are what the request router places the call by, with
    ``bound_replica``, the program's binding in the table. ``avoid`` names
    replicas that already failed this call. ``route`` and ``placed_on`` (the
    replica ranked first) are written by the request router when it places the
    call, in the ingress's process before the call leaves it; the replica echoes
    the route back in :class:`AnswerHead`.
    """

    path: str
    raw: bytes
    headers: dict[str, str]
    stream: bool
    program_key: str
    prompt_tokens: int
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
class Admission:
    """The directory let a call in: the program's service over every replica
    (for ``X-Autellix-Prior-Service``) and the replica it is bound to, if any."""

    service: float
    bound_replica: str | None


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
