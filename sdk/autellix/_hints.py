"""Retention hints: how long the program will be away after its next call.

Between an LLM call's answer and the thread's next call, an agent runs a tool.
The server keeps the program's context (its KV cache) for a while after each
call, for a time it estimates from the program's past tool gaps; a program that
knows better says so with `expect_tool(seconds)`, and its calls made inside the
block carry `X-Autellix-Retention-Ttl: <seconds>` (see `_tagging`). The server
clamps the hint to its bounds; it changes how long the context is kept, never
the program's priority.

The hint lives in a `ContextVar`, so it follows the code as the identity does:
tasks started inside the block carry it too, other OS threads do not.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_retention_ttl: ContextVar[float | None] = ContextVar("autellix_retention_ttl", default=None)


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
