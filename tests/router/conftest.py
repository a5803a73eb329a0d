"""Helpers for the router tests: an in-process router on a free loopback port."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from autellix_vllm.router import RouterConfig, create_app
from autellix_vllm.router.app import router_runner
from autellix_vllm.router.state import STATE, RouterState
from local_http import serving


@dataclass
class RunningRouter:
    url: str
    app: web.Application

    @property
    def state(self) -> RouterState:
        return self.app[STATE]


@contextlib.asynccontextmanager
async def running_router(upstreams: list[Any], **options: Any) -> AsyncIterator[RunningRouter]:
    """A router over ``upstreams`` (RouterConfig ``options``), served as in production
    (``router_runner``), on 127.0.0.1 and a free port.

    An upstream is a URL, or an engine (``tests/conftest.py``'s): its URL, and its
    key as the router's engine key.
    """
    urls = []
    for upstream in upstreams:
        if isinstance(upstream, str):
            urls.append(upstream)
        else:
            urls.append(upstream.base_url)
            options.setdefault("engine_key", upstream.config.api_key)
    app = create_app(RouterConfig(upstreams=tuple(urls), **options))
    async with serving(router_runner(app)) as url:
        yield RunningRouter(url, app)


@pytest.fixture
def start_router() -> Callable[..., contextlib.AbstractAsyncContextManager[RunningRouter]]:
    """``async with start_router([upstream], **options) as router``: see :func:`running_router`."""
    return running_router
