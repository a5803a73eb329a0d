"""Who is calling: the program and thread that the running code belongs to.

The identity lives in a `contextvars.ContextVar`, so it follows the code the way
asyncio does: a task created with `asyncio.create_task` and a call made through
`asyncio.to_thread` see a copy of their creator's identity, while plain
`threading.Thread`s and executors start with none (see `_threads.bound`).
A task that inherits an identity it does not own makes its calls in a child
thread of its own (see "which task owns the identity" below).

Ids are opaque strings. Thread ids may start with a readable name
(`search-1f0c...`) so server logs show which part of the agent made a call.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import re
import threading
import weakref
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, TypeAlias

_NOT_ID_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_MAX_NAME_CHARS = 40

# Every LLM call needs a fresh id, so ids are cheap: a random per-process
# prefix (64 bits from the OS) and a counter. The counter is a C iterator, so
# OS threads cannot get the same number; a forked child draws a new prefix.
_process_prefix = os.urandom(8).hex()
_counter = itertools.count()


def _new_process_prefix() -> None:
    global _process_prefix
    _process_prefix = os.urandom(8).hex()


os.register_at_fork(after_in_child=_new_process_prefix)


def new_id(name: str | None = None) -> str:
    """Return an id unique across processes, prefixed with `name` made header-safe."""
    unique = f"{_process_prefix}{next(_counter):x}"
    if not name:
        return unique
    readable = _NOT_ID_SAFE.sub("_", name)[:_MAX_NAME_CHARS].strip("_")
    return f"{readable}-{unique}" if readable else unique


@dataclass(frozen=True, slots=True)
class ThreadIdentity:
    """The program and thread that LLM calls made in this context belong to.

    `parent_thread_id` is None for a program's main thread and the forking
    thread's id for every other thread.
    """

    program_id: str
    thread_id: str
    parent_thread_id: str | None = None

    @classmethod
    def main_thread_of(cls, program_id: str) -> ThreadIdentity:
        """The identity of a newly opened program's main thread."""
        return cls(program_id=program_id, thread_id=new_id("main"))

    def child(self, name: str | None = None) -> ThreadIdentity:
        """A new thread of the same program, forked from this one."""
        return ThreadIdentity(self.program_id, new_id(name), parent_thread_id=self.thread_id)


# ---- which task owns the identity ---------------------------------------------
#
# asyncio copies the context into every task it creates, so a task started with
# plain `asyncio.gather`, `create_task` or `TaskGroup` inherits the binding of the
# task that started it. The binding therefore records its owner: the task that
# bound it. A call from any other task is a parallel branch, and it gets a child
# thread of its own (bound in that task's context copy, so the parent never sees
# it), named after the task when it was given a name. One exception: a task that
# its owner merely waits for through `asyncio.wait_for` is the owner's own work.
# Code outside any task (sync code, executor threads) never forks by itself: a
# blocking call there is the work of whoever bound the identity.


def _outside_any_task() -> None:
    """The owner of a binding made outside any asyncio task."""


def _unclaimed() -> None:
    """The owner of a binding made for a task that does not exist yet (see `bind_for_new_task`)."""


class _Binding:
    """An identity bound in a context, and the task that owns it (`owner()`, a weak reference)."""

    __slots__ = ("identity", "owner")

    def __init__(self, identity: ThreadIdentity, owner: Callable[[], object]) -> None:
        self.identity = identity
        self.owner = owner

    def claim(self, task: asyncio.Task[Any]) -> None:
        """Make `task` the owner, unless someone already owns the binding."""
        if self.owner is _unclaimed:
            self.owner = weakref.ref(task)


_current: ContextVar[_Binding | None] = ContextVar("autellix_thread", default=None)
# What `bind` returns and `unbind` takes back.
BindToken: TypeAlias = Token[_Binding | None]

# asyncio names a task it was not given a name for "Task-<n>"; that says nothing,
# so such a task's thread id gets no readable prefix.
_DEFAULT_TASK_NAME = re.compile(r"Task-\d+")


def running_task() -> asyncio.Task[Any] | None:
    """The asyncio task running this code, or None (no event loop runs in this OS thread)."""
    # asyncio.current_task() raises outside a loop; an exception per blocking
    # call would cost more than this whole check.
    loop = asyncio.events._get_running_loop()
    return None if loop is None else asyncio.current_task(loop)


def current_identity() -> ThreadIdentity | None:
    """The identity the running code's LLM calls carry, or None outside any program.

    In an asyncio task that did not bind the current identity itself, the first
    call of this function starts the task's own child thread (see above).
    """
    binding = _current.get()
    if binding is None:
        return None
    task = running_task()
    if task is None or binding.owner() is task:
        return binding.identity
    return _enter_task_thread(binding, task)


def _enter_task_thread(binding: _Binding, task: asyncio.Task[Any]) -> ThreadIdentity:
    """The identity of `task`, which inherited `binding` from code it does not own."""
    if binding.owner is _unclaimed:
        binding.claim(task)
        return binding.identity
    if _waits_for(binding.owner(), task):
        identity = binding.identity
    else:
        name = task.get_name()
        identity = binding.identity.child(None if _DEFAULT_TASK_NAME.fullmatch(name) else name)
    _current.set(_Binding(identity, weakref.ref(task)))
    return identity


_WAIT_FOR_CODE = asyncio.wait_for.__code__


def _waits_for(owner: object, task: asyncio.Task[Any]) -> bool:
    """Whether `owner` is suspended in `asyncio.wait_for(...)` on `task`.

    `wait_for` with a timeout runs its coroutine as a task of its own (always on
    Python 3.11), while the owner does nothing but wait: that task is the
    owner's sequential work, not a parallel branch, so it keeps the owner's thread.
    """
    awaiting = owner.get_coro() if isinstance(owner, asyncio.Task) else None
    while inspect.iscoroutine(awaiting):
        if awaiting.cr_code is _WAIT_FOR_CODE:
            frame = awaiting.cr_frame  # None only once the coroutine has finished
            return frame is not None and frame.f_locals.get("fut") is task
        awaiting = awaiting.cr_await
    return False


def identity_in_context() -> ThreadIdentity | None:
    """The identity bound in this context, as it is: the thread explicit forks start from.

    Unlike `current_identity`, it never starts a task's own thread: a task that
    has made no call yet has no thread of its own, and a thread without calls is
    unknown to the server, so forks made before the task's first call start
    from the thread the task inherited.
    """
    binding = _current.get()
    return binding.identity if binding else None


def current_program() -> str | None:
    """The id of the program the running code belongs to, or None outside any program."""
    binding = _current.get()
    return binding.identity.program_id if binding else None


def current_thread() -> str | None:
    """The id of the autellix thread the running code belongs to, or None outside any program."""
    identity = current_identity()
    return identity.thread_id if identity else None


def bind(identity: ThreadIdentity | None) -> BindToken:
    """Make `identity` current in this context, owned by the running task (if any).

    Pass the token to `unbind` to undo it.
    """
    if identity is None:
        return _current.set(None)
    task = running_task()
    owner = _outside_any_task if task is None else weakref.ref(task)
    return _current.set(_Binding(identity, owner))


def bind_for_new_task(identity: ThreadIdentity) -> Callable[[asyncio.Task[Any]], None]:
    """Bind `identity` in this context for a task about to be created in it.

    Call the returned function with the task once it exists: it becomes the
    owner, unless the task already claimed the binding by making a call (an
    eager task factory runs a task before `create_task` returns).
    """
    binding = _Binding(identity, _unclaimed)
    _current.set(binding)
    return binding.claim


def unbind(token: BindToken) -> None:
    """Restore the identity that was current before the matching `bind`."""
    _current.reset(token)


# ---- programs open in this process ------------------------------------------------

_open_programs = 0
_open_programs_lock = threading.Lock()  # sync programs open and close in any OS thread


def count_open_program(change: int) -> None:
    """Count a program opened (+1) or closed (-1) anywhere in this process."""
    global _open_programs
    with _open_programs_lock:
        _open_programs += change


def programs_open() -> int:
    """How many programs are open in this process, in any OS thread or event loop."""
    return _open_programs
