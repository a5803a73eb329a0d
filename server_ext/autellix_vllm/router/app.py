"""The router's aiohttp application and how to run it.

    runner = router_runner(create_app(RouterConfig(upstreams=("http://127.0.0.1:8001",))))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 8000).start()

or, from asyncio code, ``await serve_router(config, host, port, stop_event)``.
:func:`router_runner` is aiohttp's ``AppRunner`` with handler cancellation on
(it is how a client's disconnect reaches the engine: the engine connection
closes and vLLM aborts the request) and with :class:`JsonErrorRequestHandler`,
so that the requests aiohttp's HTTP parser refuses get JSON errors too.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler

from autellix_vllm.policy.routing import make_balancer
from autellix_vllm.protocol.openai_errors import error_body
from autellix_vllm.router.config import RouterConfig
from autellix_vllm.router.derived import ProgramDeriver
from autellix_vllm.router.dispatch import Dispatcher
from autellix_vllm.router.engines import EnginePool
from autellix_vllm.router.metrics import RouterMetrics
from autellix_vllm.router.middlewares import authenticate, openai_errors
from autellix_vllm.router.programs import ProgramTable
from autellix_vllm.router.routes import add_routes, end_idle_derived_forever
from autellix_vllm.router.state import STATE, RouterState
from autellix_vllm.router.tracing import tracer_from_environment

log = logging.getLogger("autellix.router")


def create_app(config: RouterConfig, metrics: RouterMetrics | None = None) -> web.Application:
    metrics = metrics or RouterMetrics()
    middlewares = [openai_errors(metrics, config.max_body_bytes)]
    if config.keys.required:
        middlewares.append(authenticate(config.keys))
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=middlewares)
    add_routes(app)
    app.cleanup_ctx.append(_router_state(config, metrics))
    return app


def _router_state(
    config: RouterConfig, metrics: RouterMetrics
) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: web.Application) -> AsyncIterator[None]:
        # Used for engines only: every request to one carries the engine key.
        engine_auth = {"Authorization": f"Bearer {config.engine_key}"} if config.engine_key else {}
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=config.engine_keepalive_s),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s),
            auto_decompress=False,
            headers=engine_auth,
        )
        balancer = make_balancer(config.balancer, config.locality_threshold)
        deriver = None
        if config.derived_programs:
            deriver = ProgramDeriver(config.derived_idle_end_s, config.prefix_programs)

        tracer = tracer_from_environment()  # None unless the OTEL_* variables ask for traces

        def dropped(program_id: str) -> None:
            balancer.forget(program_id)
            if deriver is not None:
                deriver.forget(program_id)
            if tracer is not None:
                tracer.program_left(program_id)

        programs = ProgramTable(config.table, on_drop=dropped)
        metrics.track_programs(lambda: len(programs))
        pool = EnginePool(
            config.upstreams,
            session,
            metrics,
            interval_s=config.health_interval_s,
            timeout_s=config.health_timeout_s,
            failures_to_drop=config.health_failures,
        )
        dispatcher = Dispatcher(
            config, session, pool, programs, balancer, metrics, deriver=deriver, tracer=tracer
        )
        pool.on_down = dispatcher.engine_down
        state = app[STATE] = RouterState(config, session, metrics, programs, pool, dispatcher)
        sweepers = [programs.sweep_forever(config.health_interval_s)]
        if deriver is not None:
            sweepers.append(end_idle_derived_forever(state, config.health_interval_s))
        sweeper = asyncio.create_task(_all(sweepers), name="autellix-idle-sweep")
        # What exists now (modules, the app) lives as long as the router: keep it
        # out of every full garbage collection, so that those stay short pauses of
        # the loop however large the process's heap (a test process holds vLLM's).
        gc.freeze()
        try:
            await pool.start()
            yield
        finally:
            gc.unfreeze()
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await pool.stop()
            await session.close()
            if tracer is not None:
                await asyncio.to_thread(tracer.shutdown)  # exports the spans not yet sent

    return lifespan


async def _all(tasks: list[Coroutine[Any, Any, None]]) -> None:
    await asyncio.gather(*tasks)


async def serve_router(
    config: RouterConfig,
    host: str,
    port: int,
    stop: asyncio.Event,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until ``stop`` is set; ``on_ready`` gets the root URL (port 0 picks one)."""
    runner = router_runner(create_app(config))
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


def router_runner(app: web.Application) -> web.AppRunner:
    """How the router's application is served (see the module's docstring)."""
    return _RouterRunner(app, handler_cancellation=True, access_log=None)


class JsonErrorRequestHandler(RequestHandler):
    """aiohttp's HTTP connection handler, answering the requests its parser refuses.

    aiohttp's parser rejects some requests before any middleware runs: a
    request line or header longer than ``max_field_size`` (8190 bytes), more
    than ``max_headers`` (128) headers, a control character in a header. Its
    ``handle_error`` answers those with plain text and logs a traceback; here
    they get the router's JSON error and one log line.
    """

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0 or status >= 500:
            # Too late for an answer, or a fault of the router's: aiohttp's own
            # handling (it logs the traceback).
            return super().handle_error(request, status, exc, message)
        if isinstance(exc, LineTooLong) or "Too many headers" in (message or ""):
            code = "request_too_large"
            text = (
                f"a request line or header is longer than {self.max_field_size} bytes, or"
                f" there are more than {self.max_headers} headers"
            )
        else:
            code = "invalid_http_request"
            # aiohttp's message starts with a fixed description, then quotes the bytes.
            reason = (message or "malformed request").split("\n", 1)[0].rstrip(": ")
            text = f"the HTTP request is malformed: {reason}"
        log.info("refused a malformed HTTP request from %s: %d %s", request.remote, status, code)
        response = web.json_response(error_body(status, text, code), status=status)
        response.force_close()
        return response


class _JsonErrorServer(web.Server):
    """aiohttp's low-level server, making :class:`JsonErrorRequestHandler` connections."""

    def __call__(self) -> RequestHandler:
        return JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)


class _RouterRunner(web.AppRunner):
    """``AppRunner`` whose server is a :class:`_JsonErrorServer`."""

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # starts the app; aiohttp's own server
        return _JsonErrorServer(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=made._loop,
            **made._kwargs,
        )
