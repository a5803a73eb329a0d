"""The router's aiohttp application and how to run it.

    app = create_app(RouterConfig(upstreams=("http://127.0.0.1:8001",)))
    web.run_app(app, host="127.0.0.1", port=8000, handler_cancellation=True)

or, from asyncio code, ``await serve_router(config, host, port, stop_event)``.
Handler cancellation must be on: it is how a client's disconnect reaches the
engine (the engine connection closes and vLLM aborts the request).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from autellix_vllm.policy.routing import make_balancer
from autellix_vllm.router.config import RouterConfig
from autellix_vllm.router.dispatch import Dispatcher
from autellix_vllm.router.engines import EnginePool
from autellix_vllm.router.metrics import RouterMetrics
from autellix_vllm.router.middlewares import openai_errors, require_api_key
from autellix_vllm.router.programs import ProgramTable
from autellix_vllm.router.routes import add_routes
from autellix_vllm.router.state import STATE, RouterState


def create_app(config: RouterConfig, metrics: RouterMetrics | None = None) -> web.Application:
    metrics = metrics or RouterMetrics()
    middlewares = [openai_errors(metrics, config.max_body_bytes)]
    if config.api_key is not None:
        middlewares.append(require_api_key(config.api_key))
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=middlewares)
    add_routes(app)
    app.cleanup_ctx.append(_router_state(config, metrics))
    return app


def _router_state(
    config: RouterConfig, metrics: RouterMetrics
) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: web.Application) -> AsyncIterator[None]:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s),
            auto_decompress=False,
        )
        balancer = make_balancer(config.balancer, config.locality_threshold)
        programs = ProgramTable(config.ended_ids_kept, config.idle_ttl_s, on_drop=balancer.forget)
        metrics.track_programs(lambda: len(programs))
        pool = EnginePool(
            config.upstreams,
            session,
            metrics,
            interval_s=config.health_interval_s,
            timeout_s=config.health_timeout_s,
            failures_to_drop=config.health_failures,
        )
        dispatcher = Dispatcher(config, session, pool, programs, balancer, metrics)
        pool.on_down = dispatcher.engine_down
        app[STATE] = RouterState(config, session, metrics, programs, pool, dispatcher)
        try:
            await pool.start()
            yield
        finally:
            await pool.stop()
            await session.close()

    return lifespan


async def serve_router(
    config: RouterConfig,
    host: str,
    port: int,
    stop: asyncio.Event,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until ``stop`` is set; ``on_ready`` gets the root URL (port 0 picks one)."""
    runner = web.AppRunner(create_app(config), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        if on_ready is not None:
            bound_host, bound_port = runner.addresses[0][:2]
            on_ready(f"http://{_url_host(bound_host)}:{bound_port}")
        await stop.wait()
    finally:
        await runner.cleanup()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
