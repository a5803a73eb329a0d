"""Hints on calls: how long the program will be away after its next call, and
its priority class.

Between an LLM call's answer and the thread's next call, an agent runs a tool.
The server keeps the program's context (its KV cache) for a while after each
call, for a time it estimates from the program's past tool gaps; a program that
knows better says so with `expect_tool(seconds)`, and its calls made inside the
block carry `X-Autellix-Retention-Ttl: <seconds>` (see `_tagging`). The server
clamps the hint to its bounds; it changes how long the context is kept, never
the program's priority.

A program that may wait behind interactive work says so with
`autellix.priority("batch")` (or `@program(priority="batch")`): its calls carry
`X-Autellix-Priority`. The router lets a client lower its class, never raise it
past what its key allows (the keys file's `max-class`).

Each hint lives in a `ContextVar`, so it follows the code as the identity does:
tasks started inside the block carry it too, other OS threads do not.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_retention_ttl: ContextVar[float | None] = ContextVar("autellix_retention_ttl", default=None)
_priority: ContextVar[str | None] = ContextVar("autellix_priority", default=None)

PRIORITY_CLASSES = ("interactive", "batch")
"""The named classes; a band's number 0 (the best) to 9 works too (1 is batch)."""
_MAX_BAND = 9


@contextmanager
def expect_tool(seconds: float) -> Iterator[None]:
    """Calls made in this block tell the server that a tool call of about `seconds`
    follows their answer, so it keeps the program's context that long.

    Wrap the LLM call whose answer starts the tool (and the tool, if you like)::

        with autellix.expect_tool(45):
            reply = await client.chat.completions.create(...)   # carries the hint
            result = await run_test_suite(reply)                # ~45 s away
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"expect_tool takes a number of seconds, got {seconds!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"expect_tool takes a finite number of seconds >= 0, got {seconds!r}")
    token = _retention_ttl.set(float(seconds))
    try:
        yield
    finally:
        _retention_ttl.reset(token)


def retention_ttl() -> float | None:
    """The retention hint in seconds set where the running code is, or None."""
    return _retention_ttl.get()


def checked_priority(value: str | int) -> str:
    """`value` as the header carries it: a class name, or a band's number 0-9."""
    if isinstance(value, str) and value in PRIORITY_CLASSES:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_BAND:
        return str(value)
    raise ValueError(
        f"priority must be one of {', '.join(PRIORITY_CLASSES)} or a band 0-{_MAX_BAND}, "
        f"got {value!r}"
    )


@contextmanager
def priority(value: str | int) -> Iterator[None]:
    """Calls made in this block ask for priority class `value`: `"interactive"`
    (the default), `"batch"`, or a band's number (0 the best, 9 the worst).

    The server lets a call lower its class, never raise it past its key's::

        with autellix.priority("batch"):
            await run_nightly_evals(client)
    """
    token = _priority.set(checked_priority(value))
    try:
        yield
    finally:
        _priority.reset(token)


def current_priority() -> str | None:
    """The priority class asked for where the running code is, or None."""
    return _priority.get()
