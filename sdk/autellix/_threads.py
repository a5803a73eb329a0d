"""Threads of a program: parallel branches that fork from a thread and join back.

A thread is a sequence of LLM calls. Forking gives the child a new thread id
whose parent is the forking thread; the parent's own context is never changed,
because the child's identity is set in the child's copy of the context.

Plain asyncio needs no help: a task started with `asyncio.gather`,
`asyncio.create_task` or `TaskGroup.create_task` makes its calls in a child
thread of its own, from its first call on (see `_identity`). A join needs no
message either: the server treats the parent's next call as joining the
children that have finished. The helpers below are for control (naming a
thread, a block that is a thread) and for OS threads, which asyncio does not
reach:

- `fork(coro)` / `create_task(coro)`: start a coroutine as a (named) child thread.
- `gather(*coros)`: fork each coroutine and wait for all of them (join).
- `with thread(name)` / `async with thread(name)`: run a block as a child thread.
- `forked(fn)`: for OS threads and executors, run each call of `fn` as a child thread.
- `bound(fn)`: for OS threads and executors, run `fn` in the current thread.

Explicit forks start from the thread bound where they are made: in a task that
has made no call yet, that is the thread the task inherited. Outside a program
all of these behave like their asyncio counterparts and tag nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from ._identity import (
    BindToken,
    ThreadIdentity,
    bind,
    bind_for_new_task,
    identity_in_context,
    programs_open,
    running_task,
    unbind,
)
from ._once import warn_once

T = TypeVar("T")
P = ParamSpec("P")


def fork(coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
    """Start `coro` as a task in a new child thread of the current thread.

    `name` names the asyncio task and prefixes the new thread id.
    """
    parent = identity_in_context()
    if parent is None:
        return asyncio.create_task(coro, name=name)
    context = contextvars.copy_context()
    claim = context.run(bind_for_new_task, parent.child(name))
    task = asyncio.create_task(coro, name=name, context=context)
    claim(task)
    return task


create_task = fork
"""Alias of `fork`, shaped like `asyncio.create_task`."""


async def gather(*awaitables: Awaitable[Any], return_exceptions: bool = False) -> list[Any]:
    """`asyncio.gather` that runs each coroutine in its own child thread (fork, then join).

    Awaitables that are not coroutines (tasks, futures) already run in some
    thread and are awaited as they are.
    """
    children = [fork(each) if asyncio.iscoroutine(each) else each for each in awaitables]
    return await asyncio.gather(*children, return_exceptions=return_exceptions)


class ThreadBlock:
    """A `with` / `async with` block whose LLM calls belong to a new child thread."""

    def __init__(self, name: str | None = None) -> None:
        self._name = name
        self._token: BindToken | None = None

    def __enter__(self) -> ThreadIdentity | None:
        parent = identity_in_context()
        if parent is None:
            return None
        child = parent.child(self._name)
        self._token = bind(child)
        return child

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            unbind(self._token)
            self._token = None

    async def __aenter__(self) -> ThreadIdentity | None:
        return self.__enter__()

    async def __aexit__(self, *exc_info: object) -> None:
        self.__exit__(*exc_info)


def thread(name: str | None = None) -> ThreadBlock:
    """A block that runs as a child thread of the current thread (a no-op outside programs).

    The block yields its `ThreadIdentity` (None outside programs).
    """
    return ThreadBlock(name)


def forked(fn: Callable[P, T], *, name: str | None = None) -> Callable[P, T]:
    """Wrap `fn` so that each call runs as a new child thread of the thread wrapping it.

    For plain `threading.Thread`s and executors, which do not copy contextvars:
    `pool.map(autellix.forked(work), items)` makes one child thread per item.
    """
    wrapping_context = contextvars.copy_context()

    def run_as_child(*args: P.args, **kwargs: P.kwargs) -> T:
        parent = identity_in_context()
        if parent is not None:
            bind(parent.child(name))  # in a throwaway copy of the context
        return fn(*args, **kwargs)

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        return wrapping_context.copy().run(run_as_child, *args, **kwargs)

    return call


def bound(fn: Callable[P, T]) -> Callable[P, T]:
    """Wrap `fn` so that it runs in a copy of the current context (the same thread).

    For plain `threading.Thread`s and executors, whose work would otherwise run
    outside the program.
    """
    wrapping_context = contextvars.copy_context()

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        return wrapping_context.copy().run(fn, *args, **kwargs)

    return call


def warn_if_lost_in_os_thread() -> None:
    """Warn (once per process) about a call with no program from an OS thread while one is open.

    Executors and `threading.Thread` do not copy the context, so the calls of
    work submitted from a program lose it silently; the SDK cannot tell which
    program they belong to. Calls from asyncio tasks are left alone: tasks
    inherit the program, so a task without one is outside programs on purpose.
    """
    if running_task() is not None:
        return
    warn_once(
        "call-lost-in-os-thread",
        "autellix: a call from OS thread %r belongs to no program while %d program(s) are"
        " open in this process, so it goes out untagged; if it is a program's work,"
        " submit autellix.forked(fn) (a child thread per call) or autellix.bound(fn)"
        " (the submitting thread) to the executor instead of fn",
        threading.current_thread().name,
        programs_open(),
    )
