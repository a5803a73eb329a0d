"""Helpers for the router tests: an in-process router on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from autellix_vllm.router import RouterConfig, serve_router


@contextlib.asynccontextmanager
async def running_router(upstreams: list[str], **options: Any) -> AsyncIterator[str]:
    """A router over ``upstreams`` (RouterConfig ``options``); yields its root URL."""
    config = RouterConfig(upstreams=tuple(upstreams), **options)
    stop = asyncio.Event()
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve_router(config, "127.0.0.1", 0, stop, ready.set_result))
    done, _ = await asyncio.wait({server, ready}, return_when=asyncio.FIRST_COMPLETED)
    if server in done:
        server.result()  # raises what stopped it
    try:
        yield ready.result()
    finally:
        stop.set()
        await server


@pytest.fixture
def start_router() -> Callable[..., contextlib.AbstractAsyncContextManager[str]]:
    """``async with start_router([upstream], **options) as url``: see :func:`running_router`."""
    return running_router
