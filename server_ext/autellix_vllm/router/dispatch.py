"""Sending a call to an engine: choosing one, retrying elsewhere, relaying the answer.

Per call: the program's entry in the router's table (opened on first sight),
the balancer's choice among healthy engines that serve the model, the
program's service summed over all engines as ``X-Autellix-Prior-Service``,
then the answer, relayed as it is (engine errors keep their status and body).

Failover: a call whose engine cannot be reached, or drops the connection
before the client got any byte, is sent again (same body, same call id) to
another engine, up to ``max_attempts`` tries (tenacity). A stream that breaks
after its first byte reached the client cannot be retried; it ends with an
error event. A client that goes away closes the engine connection, which
makes vLLM abort the request.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from autellix_vllm.policy.config import ServiceMeter
from autellix_vllm.policy.routing import Balancer, EngineLoad
from autellix_vllm.protocol import PRIOR_SERVICE_HEADER, PROGRAM_ID_HEADER, error_body
from autellix_vllm.router.calls import Call
from autellix_vllm.router.config import RouterConfig
from autellix_vllm.router.engines import Engine, EnginePool
from autellix_vllm.router.errors import ApiError
from autellix_vllm.router.metrics import RouterMetrics
from autellix_vllm.router.programs import ProgramEnded, ProgramRecord, ProgramTable
from autellix_vllm.router.usage import SseRelay, service_from_body

log = logging.getLogger("autellix.router")

# Not copied to the engine: hop-by-hop headers, what aiohttp sets itself, the
# router's own credentials, compression (bodies are relayed as they are), and
# the prior service, which only the router may state.
_DROPPED_HEADERS = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length", "expect",
        "authorization", "accept-encoding", PRIOR_SERVICE_HEADER.lower(),
    }
)  # fmt: skip
_PASSED_BACK_HEADERS = ("Content-Type", "X-Request-Id")
# Failures of the engine connection (not of the client's).
_ENGINE_FAILURES = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)
_CLIENT_GONE = (ConnectionResetError, aiohttp.ClientConnectionResetError)


class EngineUnreachable(Exception):
    """The engine failed the call before the client got anything: retry elsewhere."""

    def __init__(self, engine: Engine, cause: BaseException) -> None:
        super().__init__(f"{engine.name} ({engine.url}): {type(cause).__name__}: {cause}")
        self.engine = engine
        self.cause = cause


@dataclass
class Answer:
    response: web.StreamResponse
    engine: Engine
    service: float | None
    upstream_s: float = 0.0  # time spent waiting for the engine (non-streaming calls)


class Dispatcher:
    def __init__(
        self,
        config: RouterConfig,
        session: aiohttp.ClientSession,
        pool: EnginePool,
        programs: ProgramTable,
        balancer: Balancer,
        metrics: RouterMetrics,
        meter: ServiceMeter | None = None,
    ) -> None:
        self.config = config
        self.session = session
        self.pool = pool
        self.programs = programs
        self.balancer = balancer
        self.metrics = metrics
        self.meter = meter or ServiceMeter()
        self._anonymous = itertools.count()

    async def handle(self, request: web.Request, call: Call, started: float) -> web.StreamResponse:
        """Answer ``call``; ``started`` is when the router got it (``perf_counter``)."""
        record = self._call_arrived(call)
        if record is None:
            self.metrics.calls_without_program.inc()
            key = f"anonymous-{next(self._anonymous)}"
        else:
            key = record.program_id
        answer: Answer | None = None
        try:
            answer = await self._send_with_retries(request, call, key, record)
        finally:
            if record is not None:
                self.programs.call_finished(
                    record,
                    answer.engine.name if answer else None,
                    answer.service if answer else None,
                    call.call_id,
                )
            else:
                self.balancer.forget(key)
        if not call.stream:
            overhead = time.perf_counter() - started - answer.upstream_s
            self.metrics.proxy_overhead.observe(overhead)
        return answer.response

    def choose(
        self, call: Call, key: str, record: ProgramRecord | None, exclude: Iterable[Engine] = ()
    ) -> Engine:
        """The engine for ``call`` (the balancer decides), noted in the record and metrics."""
        excluded = set(exclude)
        candidates = [
            e for e in self.pool.healthy() if call.model in e.models and e not in excluded
        ]
        if not candidates and excluded:
            raise ApiError(502, "every engine that could answer failed", "engine_unreachable")
        if not candidates:
            raise ApiError(
                503, f"no healthy engine serves the model {call.model!r}", "no_healthy_engine"
            )
        loads = [EngineLoad(e.name, e.load) for e in candidates]
        route = self.balancer.choose(key, call.prompt_tokens, loads)
        engine = candidates[route.index]
        if record is not None:
            self.programs.routed(record, engine.name, route)
        self.metrics.routed(engine.name, route.reason)
        return engine

    def engine_down(self, engine: Engine) -> None:
        """``engine`` left rotation: the balancer forgets the programs bound to it
        (by routes that bind, see ``ProgramTable.routed``), so each binds anew."""
        for record in self.programs.bound_to(engine.name):
            self.balancer.forget(record.program_id)

    def _call_arrived(self, call: Call) -> ProgramRecord | None:
        """The record of the call's program, counting the call; None for a call without one."""
        if call.program_id is None:
            return None
        try:
            return self.programs.call_arrived(call.program_id, call.thread_id)
        except ProgramEnded:
            raise ApiError(
                404,
                f"the program {call.program_id!r} has ended",
                "program_ended",
                PROGRAM_ID_HEADER,
            ) from None

    async def _send_with_retries(
        self, request: web.Request, call: Call, key: str, record: ProgramRecord | None
    ) -> Answer:
        failed: list[Engine] = []
        send = self._send_stream if call.stream else self._send_whole

        async def attempt() -> Answer:
            engine = self.choose(call, key, record, exclude=failed)
            if failed:
                self.metrics.retried(failed[-1].name)
            try:
                return await send(request, call, engine, self._headers(request, record, engine))
            except EngineUnreachable as error:
                log.warning("call %s failed on %s", call.call_id or "-", error)
                failed.append(engine)
                self.pool.call_failed(engine, error.cause)
                raise

        try:
            # The first try runs bare (tenacity costs ~40 us a call); tenacity drives the rest.
            try:
                return await attempt()
            except EngineUnreachable:
                if self.config.max_attempts == 1:
                    raise
            retrying = AsyncRetrying(
                stop=stop_after_attempt(self.config.max_attempts - 1),
                retry=retry_if_exception_type(EngineUnreachable),
                reraise=True,
            )
            return await retrying(attempt)
        except EngineUnreachable as error:
            raise ApiError(
                502,
                f"no engine could answer after {len(failed)} tries; last: {error}",
                "engine_unreachable",
            ) from None

    def _headers(
        self, request: web.Request, record: ProgramRecord | None, engine: Engine
    ) -> dict[str, str]:
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower() not in _DROPPED_HEADERS
        }
        if record is not None and record.service > 0 and engine.service_unit in (None, "tokens"):
            headers[PRIOR_SERVICE_HEADER] = f"{record.service:.3f}"
        return headers

    async def _send_whole(
        self, request: web.Request, call: Call, engine: Engine, headers: dict[str, str]
    ) -> Answer:
        engine.in_flight += 1
        sent = time.perf_counter()
        try:
            async with self.session.post(
                engine.url + call.path, data=call.raw, headers=headers
            ) as upstream:
                payload = await upstream.read()
        except _ENGINE_FAILURES as error:
            raise EngineUnreachable(engine, error) from error
        finally:
            engine.in_flight -= 1
        upstream_s = time.perf_counter() - sent
        service = service_from_body(payload, self.meter) if upstream.status == 200 else None
        response = web.Response(
            body=payload, status=upstream.status, headers=_passed_back(upstream.headers)
        )
        return Answer(response, engine, service, upstream_s)

    async def _send_stream(
        self, request: web.Request, call: Call, engine: Engine, headers: dict[str, str]
    ) -> Answer:
        engine.in_flight += 1
        upstream: aiohttp.ClientResponse | None = None
        try:
            try:
                upstream = await self.session.post(
                    engine.url + call.path, data=call.raw, headers=headers
                )
                if upstream.status != 200:  # an error answer, not a stream: relay it whole
                    payload = await upstream.read()
                    response = web.Response(
                        body=payload, status=upstream.status, headers=_passed_back(upstream.headers)
                    )
                    return Answer(response, engine, None)
                first = await upstream.content.readany()
            except _ENGINE_FAILURES as error:
                raise EngineUnreachable(engine, error) from error
            if not first:
                raise EngineUnreachable(engine, ConnectionError("stream closed before any data"))
            response = web.StreamResponse(
                status=200, headers={**_passed_back(upstream.headers), "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            relay = SseRelay(response, self.meter, drop_usage=call.usage_injected)
            try:
                await self._relay(relay, upstream, first, engine)
                await response.write_eof()
            except _CLIENT_GONE:
                log.info("client went away during a stream from %s; aborting it", engine.name)
            return Answer(response, engine, relay.service)
        finally:
            engine.in_flight -= 1
            if upstream is not None:
                upstream.release()  # closes the connection if unread: the engine aborts

    async def _relay(
        self, relay: SseRelay, upstream: aiohttp.ClientResponse, first: bytes, engine: Engine
    ) -> None:
        chunk = first
        while chunk:
            await relay.feed(chunk)
            try:
                chunk = await upstream.content.readany()
            except _ENGINE_FAILURES as error:
                log.warning("%s broke a stream after it started: %s", engine.name, error)
                self.pool.call_failed(engine, error)
                await relay.finish()
                message = f"the engine failed during the stream: {type(error).__name__}"
                event = error_body(502, message, "engine_failed_mid_stream")
                await relay.response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                return
        await relay.finish()


def _passed_back(headers: aiohttp.typedefs.LooseHeaders) -> dict[str, str]:
    return {name: headers[name] for name in _PASSED_BACK_HEADERS if name in headers}
