"""Waiting in a test for what another process or task will make true.

``wait_until`` polls from a plain test (with the launcher's ``poll_until``),
``eventually`` from an async one (its ``fetch`` may be a coroutine function).
Both return the value that satisfied ``until`` and fail the test with the last
value seen when time runs out. ``wait_until_gone`` waits for a process group
to empty.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from autellix_vllm.engine.launcher import poll_until
from autellix_vllm.engine.reaper import group_members

T = TypeVar("T")
Message = str | Callable[[], str]


def wait_until(
    fetch: Callable[[], T],
    until: Callable[[T], object] = bool,
    *,
    timeout_s: float = 10.0,
    poll_s: float = 0.05,
    what: Message = "timed out",
) -> T:
    last: list[T] = []

    def holds() -> bool:
        last[:] = [fetch()]
        return bool(until(last[0]))

    if not poll_until(holds, timeout_s, poll_s):
        _fail(what, timeout_s, last[0])
    return last[0]


async def eventually(
    fetch: Callable[[], T | Awaitable[T]],
    until: Callable[[T], object] = bool,
    *,
    timeout_s: float = 10.0,
    poll_s: float = 0.05,
    what: Message = "timed out",
) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = fetch()
        if inspect.isawaitable(value):
            value = await value
        if until(value):
            return value
        if loop.time() >= deadline:
            _fail(what, timeout_s, value)
        await asyncio.sleep(poll_s)


def _fail(what: Message, timeout_s: float, last: object) -> None:
    message = what() if callable(what) else what
    pytest.fail(f"{message} (after {timeout_s} s; last seen: {last!r})")


def wait_until_gone(group: int, timeout_s: float = 5.0) -> None:
    """Every process of ``group`` has exited (a process group's id is its leader's pid)."""
    wait_until(
        lambda: group_members(group),
        lambda members: not members,
        timeout_s=timeout_s,
        what=f"processes left in group {group}",
    )
