"""The process table: programs, their threads, and the calls they have in flight.

An entry is created by a program's first call (or explicitly, by the router's
session API) and removed when the program is ended or has been idle for
``idle_ttl_s``. Everything the policies need about a program's past lives here.

A program's shape comes from its client, so it is bounded by
:class:`~autellix_vllm.policy.config.ProgramLimits` (:meth:`ProcessTable.limit_crossed`),
its threads grow by the fork rule of :mod:`~autellix_vllm.policy.forks`, and
every walk over its threads keeps its own stack instead of recursing.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..protocol.identity import ANONYMOUS_OWNER, MAIN_THREAD_ID, NO_IDENTITY, CallIdentity
from .bounded import CHARGED_CALLS_KEPT, IdleTable, RecentMap
from .config import DEFAULT_BOUNDS, ProgramLimits, TableBounds
from .forks import LimitCrossed, limit_crossed, new_threads

# A call's place in the wait queue, compared as a tuple: smaller is better. It ends
# with the call's unique seq, so no two calls tie.
Rank = tuple[float, ...]


class CallState(enum.Enum):
    NEW = "new"
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Thread:
    """A sequence of calls within a program; threads fork from and join into parents."""

    thread_id: str
    parent: Thread | None = None
    children: list[Thread] = field(default_factory=list)
    # Longest chain of service leading to this thread's next call (ATLAS, Eq. 2).
    critical_path: float = 0.0
    active_calls: int = 0
    calls: int = 0
    # Forks between the program's root thread and this one (the root is depth 0).
    depth: int = 0

    def joined_critical_path(self) -> float:
        """Critical path including every finished descendant (a join waits for them).

        A descendant counts when neither it nor a thread between it and this one
        has a call in flight. The walk keeps its own stack: a client decides how
        deep a thread tree grows, so the walk must not use Python's call stack.
        """
        best = self.critical_path
        pending = [child for child in self.children if child.active_calls == 0]
        while pending:
            thread = pending.pop()
            best = max(best, thread.critical_path)
            pending.extend(child for child in thread.children if child.active_calls == 0)
        return best


@dataclass(slots=True)
class CallRecord:
    """What a program remembers of the attempts made under one call id."""

    # Service charged for the attempts that were not reuses (the first and its retries).
    service: float = 0.0
    # Some attempt under this id completed: a later call with the id is a reuse.
    completed: bool = False


@dataclass(eq=False, slots=True)
class Program:
    """One agentic program (a session): what it has attained and what it is doing."""

    program_id: str
    name: str | None = None
    # Who runs it (its first call's ``CallIdentity.owner``): holds are shared fairly
    # among owners (policy.residency).
    owner: str = ANONYMOUS_OWNER
    # Its priority band (its latest call's, ``CallIdentity.priority`` else its
    # owner's): 0, interactive, is the best; a better band goes first
    # (ProgramScheduler.rank).
    band: int = 0
    created_s: float = 0.0
    last_arrival_s: float = 0.0
    last_completion_s: float | None = None
    # Total work of its finished calls (raised to any prior service a router reports).
    attained_service: float = 0.0
    # Longest observed critical path (ATLAS's program scalar).
    critical_path: float = 0.0
    # Waiting of its finished calls, in the wait clock's unit.
    wait: float = 0.0
    # Tool gaps seen (idle stretches from a completion to the next arrival) and
    # their total, for how long an engine holds its idle context (residency).
    gaps: int = 0
    gap_total_s: float = 0.0
    threads: dict[str, Thread] = field(default_factory=dict)
    # Calls in flight, in arrival order, keyed by id(call): call ids may repeat.
    active_calls: dict[int, Call] = field(default_factory=dict)
    calls_completed: int = 0
    calls_aborted: int = 0
    engine: str | None = None
    ended: bool = False
    # The attempts under each call id (the newest CHARGED_CALLS_KEPT ids).
    call_records: RecentMap[CallRecord] = field(
        default_factory=lambda: RecentMap(CHARGED_CALLS_KEPT)
    )
    # Level -> seq of its first call to enter that level (policies that order a
    # level by program).
    level_entries: dict[int, int] = field(default_factory=dict)

    @property
    def multi_threaded(self) -> bool:
        return len(self.threads) > 1

    @property
    def last_active_s(self) -> float:
        return max(self.last_arrival_s, self.last_completion_s or 0.0)

    @property
    def busy(self) -> bool:
        return bool(self.active_calls)

    def thread(self, thread_id: str | None, parent_thread_id: str | None = None) -> Thread:
        """The thread ``thread_id``, created (as a child of its parent) on first use,
        by the fork rule (:func:`~autellix_vllm.policy.forks.new_threads`)."""
        for new in new_threads(thread_id, parent_thread_id, self.depth_of):
            parent = self.threads[new.parent_id] if new.parent_id is not None else None
            created = Thread(new.thread_id, parent=parent, depth=new.depth)
            if parent is not None:
                parent.children.append(created)
                # A fork starts where its parent stands now, counting the parent's own
                # finished forks: a parent that only forks never calls, so its
                # own path alone would leave every new generation at zero.
                created.critical_path = parent.joined_critical_path()
            self.threads[new.thread_id] = created
        return self.threads[thread_id or MAIN_THREAD_ID]

    def depth_of(self, thread_id: str) -> int | None:
        """The fork depth of thread ``thread_id``; None if the program has no such thread."""
        thread = self.threads.get(thread_id)
        return None if thread is None else thread.depth

    def limit_crossed(
        self, limits: ProgramLimits, thread_id: str | None, parent_thread_id: str | None
    ) -> LimitCrossed | None:
        """The limit a new call on ``thread_id`` would cross, or None if it may join
        the program."""
        created = new_threads(thread_id, parent_thread_id, self.depth_of)
        return limit_crossed(limits, len(self.threads), len(self.active_calls), created)

    def is_reuse(self, call_id: str) -> bool:
        """Whether a new call under ``call_id`` repeats a call rather than retrying one:
        an attempt under the id completed, or one is in flight now."""
        record = self.call_records.get(call_id)
        if record is not None and record.completed:
            return True
        return any(call.call_id == call_id for call in self.active_calls.values())

    def settle(self, call_id: str, service: float, completed: bool, reuse: bool) -> float:
        """Record a finished attempt under ``call_id``; return the service to charge.

        A retry of attempts that did not complete recomputes their work, so it is
        charged only what it attained beyond them: the id is charged once. A first
        attempt, or a reuse (see :meth:`is_reuse`), is charged in full.
        """
        record = self.call_records.get(call_id) or CallRecord()
        if reuse:
            charged = service
        else:
            charged = max(0.0, service - record.service)
            record.service = max(record.service, service)
        record.completed = record.completed or completed
        self.call_records.put(call_id, record)
        return charged


@dataclass(eq=False, slots=True)
class Call:
    """One LLM call: its identity, its place in the levels, and its counters."""

    call_id: str
    program: Program
    thread: Thread
    arrival_s: float
    # As the call stated it (the engine reads the client's retention hint here).
    identity: CallIdentity = NO_IDENTITY
    prompt_tokens: int = 0
    state: CallState = CallState.NEW
    # Program (or thread) service when the call arrived: its priority base.
    base: float = 0.0
    # Service this call has attained so far.
    service: float = 0.0
    level: int = 0
    quantum_left: float = 0.0
    # Its program's band, or 0 once it has waited past the aging bound
    # (TenantConfig.band_aging_s).
    band: int = 0
    # When a worse band's call ranks as band 0 (TenantConfig.band_aged_at; None:
    # it arrived in band 0).
    ages_at: float | None = None
    # Order of entry into its level (FIFO within a level); arrival order under FCFS.
    seq: int = 0
    # Its program's order of entry into the call's level (Program.level_entries).
    program_seq: int = 0
    # Anti-starvation counters, reset when the call is promoted.
    starve_wait: float = 0.0
    starve_service: float = 0.0
    # Wait clock reading when the call last started waiting (None while not waiting).
    wait_started: float | None = None
    total_wait: float = 0.0
    # Tokens decoded since the call was last admitted into the batch: a waiter may
    # displace it only once this pays for its prompt (ProgramScheduler.displaceable).
    decoded_since_start: int = 0
    preemptions: int = 0
    promotions: int = 0
    # Its call id was completed or in flight when it arrived: charged in full.
    reuse: bool = False
    # The engine's own object for this call (a vLLM Request, a simulator job).
    payload: Any = None
    # Bookkeeping of the wait queue (see queue.WaitQueue).
    queued: bool = False
    queue_version: int = 0
    queue_key: tuple[int, str] = (0, ANONYMOUS_OWNER)


class ProcessTable:
    """All known programs, bounded by ``bounds``: an idle time-to-live and the
    program limits (the counts of programs are the router's to bound)."""

    def __init__(self, bounds: TableBounds = DEFAULT_BOUNDS) -> None:
        self._programs: IdleTable[Program] = IdleTable(bounds.idle_ttl_s)
        self.bounds = bounds
        # Calls that did not join their program, by the limit they would have crossed.
        self.calls_over_limit: Counter[str] = Counter()

    @property
    def idle_ttl_s(self) -> float:
        return self._programs.idle_ttl_s

    def __len__(self) -> int:
        return len(self._programs)

    def __iter__(self) -> Iterator[Program]:
        return iter(self._programs)

    def __contains__(self, program_id: str) -> bool:
        return program_id in self._programs

    @property
    def departures(self) -> int:
        """How many programs have left the table so far (ended or idle too long)."""
        return self._programs.departures

    def get(self, program_id: str) -> Program | None:
        return self._programs.get(program_id)

    def open(
        self,
        program_id: str,
        now_s: float,
        name: str | None = None,
        owner: str | None = None,
        band: int | None = None,
    ) -> Program:
        """The program ``program_id``, created if it is new (belonging to ``owner``,
        None: the anonymous owner; in ``band``, None: 0), marked active at ``now_s``."""
        program = self._programs.get(program_id)
        if program is None:
            program = Program(
                program_id, name=name, owner=owner or ANONYMOUS_OWNER, band=band or 0,
                created_s=now_s, last_arrival_s=now_s,
            )  # fmt: skip
            self._programs.add(program_id, program)
        else:
            self._programs.touch(program_id)
            if name and not program.name:
                program.name = name
        return program

    def limit_crossed(self, identity: CallIdentity) -> LimitCrossed | None:
        """The limit a new call of ``identity``'s program and thread would cross, or None."""
        assert identity.program_id is not None
        program = self._programs.get(identity.program_id) or Program(identity.program_id)
        return program.limit_crossed(
            self.bounds.limits, identity.thread_id, identity.parent_thread_id
        )

    def touch(self, program: Program) -> None:
        """The program did something (a call completed): it is the most recently active."""
        self._programs.touch(program.program_id)

    def end(self, program_id: str) -> bool:
        """End a program: dropped now, or when its last in-flight call completes."""
        program = self._programs.get(program_id)
        if program is None:
            return False
        program.ended = True
        if not program.busy:
            self._programs.pop(program_id)
        return True

    def release_if_done(self, program: Program) -> None:
        """Drop an ended program once nothing of it is in flight."""
        if program.ended and not program.busy:
            self._programs.pop(program.program_id)

    def evict_idle(self, now_s: float) -> list[str]:
        """Drop programs with nothing in flight whose last activity is older than the TTL."""
        return self._programs.drop_idle(now_s)
