"""Serving an aiohttp app in a test: on 127.0.0.1, at a port the OS picks."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serving(runner: web.BaseRunner) -> AsyncIterator[str]:
    """Start ``runner`` (not yet set up) on a free loopback port; yields its base URL
    (``http://127.0.0.1:PORT``) and cleans the runner up however the block ends."""
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
