"""The process table: programs, their threads, and the calls they have in flight.

An entry is created by a program's first call (or explicitly, by the router's
session API) and removed when the program is ended or has been idle for
``idle_ttl_s``. Everything the policies need about a program's past lives here.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .bounded import CHARGED_CALLS_KEPT, IdleTable, RecentMap

MAIN_THREAD = "main"


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

    def joined_critical_path(self) -> float:
        """Critical path including every finished descendant (a join waits for them)."""
        best = self.critical_path
        for child in self.children:
            if child.active_calls == 0:
                best = max(best, child.joined_critical_path())
        return best


@dataclass(eq=False, slots=True)
class Program:
    """One agentic program (a session): what it has attained and what it is doing."""

    program_id: str
    name: str | None = None
    created_s: float = 0.0
    last_arrival_s: float = 0.0
    last_completion_s: float | None = None
    # Total work of its completed calls (raised to any prior service a router reports).
    attained_service: float = 0.0
    # Longest observed critical path (ATLAS's program scalar).
    critical_path: float = 0.0
    # Waiting of its completed calls, in the wait clock's unit.
    wait: float = 0.0
    threads: dict[str, Thread] = field(default_factory=dict)
    active_calls: dict[str, Call] = field(default_factory=dict)
    calls_completed: int = 0
    engine: str | None = None
    ended: bool = False
    # Service charged per completed call id (the newest CHARGED_CALLS_KEPT ids).
    completed_call_service: RecentMap[float] = field(
        default_factory=lambda: RecentMap(CHARGED_CALLS_KEPT)
    )

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
        """The thread ``thread_id``, created (as a child of its parent) on first use."""
        tid = thread_id or MAIN_THREAD
        found = self.threads.get(tid)
        if found is not None:
            return found
        parent = None
        if parent_thread_id and parent_thread_id != tid:
            parent = self.thread(parent_thread_id)
        elif tid != MAIN_THREAD and MAIN_THREAD in self.threads:
            parent = self.threads[MAIN_THREAD]
        created = Thread(tid, parent=parent)
        if parent is not None:
            parent.children.append(created)
            created.critical_path = parent.critical_path  # a fork starts at its parent's path
        self.threads[tid] = created
        return created

    def remember_completion(self, call_id: str, service: float) -> float:
        """Record a completed call; return the service not yet charged for its id."""
        already = self.completed_call_service.get(call_id, 0.0)
        self.completed_call_service.put(call_id, max(already, service))
        return max(0.0, service - already)


@dataclass(eq=False, slots=True)
class Call:
    """One LLM call: its identity, its place in the levels, and its counters."""

    call_id: str
    program: Program
    thread: Thread
    arrival_s: float
    prompt_tokens: int = 0
    state: CallState = CallState.NEW
    # Program (or thread) service when the call arrived: its priority base.
    base: float = 0.0
    # Service this call has attained so far.
    service: float = 0.0
    level: int = 0
    quantum_left: float = 0.0
    # Order of entry into its level (FIFO within a level); arrival order under FCFS.
    seq: int = 0
    # Anti-starvation counters, reset when the call is promoted.
    starve_wait: float = 0.0
    starve_service: float = 0.0
    # Wait clock reading when the call last started waiting (None while not waiting).
    wait_started: float | None = None
    total_wait: float = 0.0
    preemptions: int = 0
    promotions: int = 0
    # The engine's own object for this call (a vLLM Request, a simulator job).
    payload: Any = None
    # Bookkeeping of the wait queue (see queue.WaitQueue).
    queued: bool = False
    queue_version: int = 0


class ProcessTable:
    """All known programs, bounded by an idle time-to-live."""

    def __init__(self, idle_ttl_s: float = 600.0) -> None:
        self._programs: IdleTable[Program] = IdleTable(idle_ttl_s)

    @property
    def idle_ttl_s(self) -> float:
        return self._programs.idle_ttl_s

    def __len__(self) -> int:
        return len(self._programs)

    def __iter__(self) -> Iterator[Program]:
        return iter(self._programs)

    def __contains__(self, program_id: str) -> bool:
        return program_id in self._programs

    def get(self, program_id: str) -> Program | None:
        return self._programs.get(program_id)

    def open(self, program_id: str, now_s: float, name: str | None = None) -> Program:
        """The program ``program_id``, created if it is new, marked active at ``now_s``."""
        program = self._programs.get(program_id)
        if program is None:
            program = Program(program_id, name=name, created_s=now_s, last_arrival_s=now_s)
            self._programs.add(program_id, program)
        else:
            self._programs.touch(program_id)
            if name and not program.name:
                program.name = name
        return program

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
