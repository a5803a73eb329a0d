"""The fork rule: which threads a call creates, and which program limit it would cross.

A call names its thread and, optionally, the thread it forked from. The
engine's process table (:mod:`autellix_vllm.policy.table`) and the router's
(:mod:`autellix_vllm.router.programs`) both grow a program's threads by this
one rule and refuse by these same limits, so a call the router lets through
is never one the engine has to run alone:

* a call without a thread id runs on the main thread
  (:data:`~autellix_vllm.protocol.identity.MAIN_THREAD_ID`);
* a new thread forks from the parent it names, else from the main thread if
  the program has one, else it is a root (depth 0);
* a parent named before it ran a call of its own is created first, by the same
  rule (so a call may create two threads);
* a thread's depth counts the forks between it and its root.

Pure functions over what a table knows of a program: how deep each known
thread is (``depth_of``: the depth, None for an unknown thread), how many
threads it has and how many calls it has in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autellix_vllm.policy.config import ProgramLimits
from autellix_vllm.protocol.identity import MAIN_THREAD_ID

DepthOf = Callable[[str], int | None]
"""A thread id -> its fork depth in the program, None if the program has no such thread."""


@dataclass(frozen=True, slots=True)
class NewThread:
    """A thread a call creates: its id, its parent's (None for a root) and its depth."""

    thread_id: str
    parent_id: str | None
    depth: int


@dataclass(frozen=True, slots=True)
class LimitCrossed:
    """Why a call may not join its program: the limit it would cross."""

    limit: str
    """The :class:`~autellix_vllm.policy.config.ProgramLimits` field."""
    code: str
    """The error code a refusal is answered with (``too_many_threads``, ...)."""
    message: str
    part: str
    """The :class:`~autellix_vllm.protocol.identity.CallIdentity` field at fault."""


def new_threads(
    thread_id: str | None, parent_thread_id: str | None, depth_of: DepthOf
) -> tuple[NewThread, ...]:
    """The threads a call on ``thread_id`` (forked from ``parent_thread_id``) creates,
    parents first; none when the thread exists."""
    thread = thread_id or MAIN_THREAD_ID
    if depth_of(thread) is not None:
        return ()
    parent = _parent_of_new(thread, parent_thread_id, depth_of)
    if parent is None:
        return (NewThread(thread, None, 0),)
    parent_depth = depth_of(parent)
    if parent_depth is not None:
        return (NewThread(thread, parent, parent_depth + 1),)
    grandparent = _parent_of_new(parent, None, depth_of)  # the main thread, or none
    grandparent_depth = depth_of(grandparent) if grandparent is not None else None
    depth = 0 if grandparent_depth is None else grandparent_depth + 1
    return (NewThread(parent, grandparent, depth), NewThread(thread, parent, depth + 1))


def _parent_of_new(thread: str, parent_thread_id: str | None, depth_of: DepthOf) -> str | None:
    if parent_thread_id and parent_thread_id != thread:
        return parent_thread_id
    if thread != MAIN_THREAD_ID and depth_of(MAIN_THREAD_ID) is not None:
        return MAIN_THREAD_ID
    return None


def limit_crossed(
    limits: ProgramLimits, threads: int, live_calls: int, created: Sequence[NewThread]
) -> LimitCrossed | None:
    """The limit a new call would cross, for a program of ``threads`` threads with
    ``live_calls`` calls in flight, if the call creates ``created``
    (:func:`new_threads`); None if it may join."""
    if live_calls >= limits.max_live_calls:
        return LimitCrossed(
            "max_live_calls",
            "too_many_live_calls",
            f"the program has {live_calls} calls in flight, the limit of calls in flight per"
            " program (max_live_calls)",
            "program_id",
        )
    if threads + len(created) > limits.max_threads:
        return LimitCrossed(
            "max_threads",
            "too_many_threads",
            f"the program has {threads} threads; a new one would pass the limit of"
            f" {limits.max_threads} threads per program (max_threads)",
            "thread_id",
        )
    depth = created[-1].depth if created else 0  # the call's own thread, the deepest
    if depth > limits.max_fork_depth:
        return LimitCrossed(
            "max_fork_depth",
            "fork_too_deep",
            f"the thread would be {depth} forks below its root thread; the limit is"
            f" {limits.max_fork_depth} (max_fork_depth)",
            "parent_thread_id",
        )
    return None
