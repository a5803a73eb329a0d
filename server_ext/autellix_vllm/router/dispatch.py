"""Sending a call to an engine: choosing one, retrying, relaying the answer.

Per call: the program's entry in the router's table (opened on first sight,
after the table's checks; for a call that names no program, the one
``router.derived`` names from what the client sent, if anything), the
balancer's choice among healthy engines that serve the model, then the answer,
relayed as it is (engine errors keep their status and message, in the router's
error shape).

What the engine is told: the client's headers without its credentials and
without any scheduling header; in their place the identity the router
accepted (``X-Autellix-Program-Id``, the derived one for a call that named
none, ``-Thread-Id``, ``-Parent-Thread-Id``, ``-Call-Id``), the program's
service summed over all engines (``X-Autellix-Prior-Service``, at most
``ProgramLimits.max_prior_service``), the program's owner
(``X-Autellix-Owner``: the key that opened it) and the client's retention hint
as sent (``X-Autellix-Retention-Ttl``; the engine clamps it). What the router
adds is kept in its own record (``admission.Admitted``); the accepted call
(``calls.Call``) is not changed.
The engine key travels as the session's ``Authorization`` (``app``). With
tracing on (``router.tracing``), the call's own ``traceparent`` replaces the
client's, and goes back to the client on the answer.

Flow control (``router.flow_control``): a call of a worse band waits at the
router while the pool is saturated for its band, after admission and before
an engine is chosen; its client leaving meanwhile drops it from the queue.
A call it held goes with how long (``X-Autellix-Router-Wait``), so that the
engine's starvation bound counts from when the call reached the router.

Failover: a call whose engine cannot be reached, or drops the connection
before the client got any byte, is sent again (same body, same call id) to
another engine, up to ``max_attempts`` tries (tenacity). A connection the
engine closed while it sat in the pool (it fails before any answer byte) is
no sign of a dead engine: that call may go to the same engine once more. A
stream that breaks after its first byte reached the client cannot be
retried; it ends with an error event. A client that goes away closes the
engine connection, which makes vLLM abort the request.

Outcome: a call is completed when the engine's whole 200 answer was relayed.
Anything else (an engine error, no engine, a client that left) is a failed
call, charged the service the engine did for it (for a stream cut short: its
usage if it came, else an estimate from the events relayed).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import aiohttp
from aiohttp import web
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from autellix_vllm.policy.config import ServiceMeter
from autellix_vllm.policy.routing import Balancer, EngineLoad
from autellix_vllm.protocol.identity import IDENTITY_HEADERS, VLLM_PRIORITY_HEADER
from autellix_vllm.protocol.openai_errors import mid_stream_error_event, normalized_error
from autellix_vllm.router.admission import (
    Admitted,
    admit,
    answered,
    prior_service,
    states_prior_service,
)
from autellix_vllm.router.calls import Call
from autellix_vllm.router.config import RouterConfig
from autellix_vllm.router.derived import ProgramDeriver
from autellix_vllm.router.engines import (
    ENGINE_CONNECTION_FAILURES,
    Engine,
    EnginePool,
    passed_back_headers,
)
from autellix_vllm.router.errors import ApiError
from autellix_vllm.router.flow_control import Gate
from autellix_vllm.router.keys import ANONYMOUS, Client
from autellix_vllm.router.metrics import RouterMetrics
from autellix_vllm.router.programs import ProgramRecord, ProgramTable
from autellix_vllm.router.timeline import CallSpan
from autellix_vllm.router.tracing import TRACE_CONTEXT_HEADERS, ProgramTracer
from autellix_vllm.router.usage import NO_REPORT, CallReport, SseRelay, read_whole_answer

log = logging.getLogger("autellix.router")

# Not copied to the engine: hop-by-hop headers, what aiohttp sets itself, the
# client's credentials, compression (bodies are relayed as they are), and every
# scheduling header, which only the router may state.
_DROPPED_HEADERS = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length", "expect",
        "authorization", "accept-encoding",
        *(header.lower() for header in (*IDENTITY_HEADERS.values(), VLLM_PRIORITY_HEADER)),
    }
)  # fmt: skip
_CLIENT_GONE = (ConnectionResetError, aiohttp.ClientConnectionResetError)


class EngineUnreachable(Exception):
    """The engine failed the call before the client got anything: retry.

    ``stale``: the connection broke before any answer byte, without being
    refused: most likely a pooled connection the engine had just closed.
    """

    def __init__(self, engine: Engine, cause: BaseException, stale: bool = False) -> None:
        super().__init__(f"{engine.name} ({engine.url}): {type(cause).__name__}: {cause}")
        self.engine = engine
        self.cause = cause
        self.stale = stale


def _closed_before_answer(error: BaseException) -> bool:
    """A connection the engine closed or reset before answering, not one it refused."""
    refused = isinstance(error, aiohttp.ClientConnectorError)
    dropped = isinstance(error, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError)
    return dropped and not refused


@dataclass
class Outcome:
    """What became of a call so far; read when the call ends, however it ends
    (also when the client's disconnect cancels the handler mid-way)."""

    response: web.StreamResponse | None = None
    engine: Engine | None = None  # the engine that answered, or was streaming
    completed: bool = False  # the engine's whole 200 answer was relayed
    service: float | None = None
    response_id: str | None = None  # a non-streamed response's id (the Responses API)
    relay: SseRelay | None = None  # a stream's relay, once it started
    upstream_s: float = 0.0  # time spent waiting for the engine (non-streaming calls)
    whole_report: CallReport = NO_REPORT  # what a non-streamed answer said of the call
    # The call's trace context (router.tracing), sent to the engine and back to the client.
    trace_headers: dict[str, str] = field(default_factory=dict)

    @property
    def report(self) -> CallReport:
        """What the engine said the call was made of (its tokens and timings)."""
        return self.relay.report if self.relay is not None else self.whole_report

    def charged(self, prompt_tokens: int) -> float | None:
        """The service to charge: the usage's, or for a stream, what it did so far."""
        if self.relay is not None:
            return self.relay.service_so_far(prompt_tokens)
        return self.service


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
        deriver: ProgramDeriver | None = None,
        tracer: ProgramTracer | None = None,
    ) -> None:
        self.config = config
        # Holds calls of worse bands while the pool is saturated (None: off).
        self.gate: Gate | None = None
        if config.flow_control is not None:
            self.gate = Gate(config.flow_control, pool.seats, metrics.held)
        self.deriver = deriver
        self.tracer = tracer  # None: tracing is off
        self.session = session
        self.pool = pool
        self.programs = programs
        self.balancer = balancer
        self.metrics = metrics
        self.meter = meter or ServiceMeter()
        self._alone_keys = itertools.count()  # routing keys of calls without a program

    async def handle(
        self, request: web.Request, call: Call, started: float, caller: Client = ANONYMOUS
    ) -> web.StreamResponse:
        """Answer ``call`` for ``caller``; ``started`` is when the router got it
        (``perf_counter``)."""
        admitted = admit(
            self.programs,
            self.deriver,
            call.identity,
            caller,
            call.path,
            call.body,
            call.session_headers,
        )
        record = admitted.record
        if record is None:
            self.metrics.calls_without_program.inc()
            key = f"alone-{next(self._alone_keys)}"
        else:
            key = record.program_id
        outcome = Outcome()
        call_trace = None
        if self.tracer is not None:
            elapsed = time.perf_counter() - started
            call_trace = self.tracer.call_started(request.headers, call, admitted, caller, elapsed)
            outcome.trace_headers = call_trace.headers
        arrived_s = self.programs.clock() - (time.perf_counter() - started)  # the router got it
        gate = self.gate.through(admitted) if self.gate else contextlib.nullcontext(admitted)
        try:
            async with gate as going:
                await self._send_with_retries(request, call, key, going, outcome)
        finally:
            if call_trace is not None:
                call_trace.finished(call, outcome)
            if record is not None:
                engine = outcome.engine.name if outcome.engine else None
                identity, finished_s = call.identity, self.programs.clock()
                span = CallSpan(identity.call_id, identity.thread_id, engine, arrived_s,
                                finished_s, outcome.completed, outcome.report)  # fmt: skip
                self.programs.call_finished(
                    record,
                    call.identity.call_id,
                    engine=engine,
                    service=outcome.charged(call.prompt_tokens),
                    completed=outcome.completed,
                    span=span,
                )
                response_id = outcome.relay.response_id if outcome.relay else outcome.response_id
                answered(self.deriver, record, call.path, outcome.completed, response_id)
            else:
                self.balancer.forget(key)
        assert outcome.response is not None
        if not call.stream:
            overhead = time.perf_counter() - started - outcome.upstream_s
            self.metrics.proxy_overhead.observe(overhead)
        return outcome.response

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

    async def _send_with_retries(
        self,
        request: web.Request,
        call: Call,
        key: str,
        admitted: Admitted,
        outcome: Outcome,
    ) -> None:
        failed: list[Engine] = []  # not tried again
        stale: set[Engine] = set()  # given their one more try after a stale connection
        previous: list[Engine] = []
        send = self._send_stream if call.stream else self._send_whole

        async def attempt() -> None:
            engine = self.choose(call, key, admitted.record, exclude=failed)
            if previous:
                self.metrics.retried(previous[-1].name)
            previous.append(engine)
            try:
                headers = self._headers(request, admitted, engine, outcome.trace_headers)
                await send(request, call, engine, headers, outcome)
            except EngineUnreachable as error:
                if error.stale and engine not in stale:
                    stale.add(engine)
                    log.info("call %s: %s; trying again", call.identity.call_id or "-", error)
                else:
                    log.warning("call %s failed on %s", call.identity.call_id or "-", error)
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
                f"no engine could answer after {len(previous)} tries; last: {error}",
                "engine_unreachable",
            ) from None

    def _headers(
        self,
        request: web.Request,
        admitted: Admitted,
        engine: Engine,
        trace_headers: Mapping[str, str],
    ) -> dict[str, str]:
        """The client's headers but the dropped ones, and the identity the engine
        is told: the admitted one, with the program's prior service; with tracing
        on, the call's trace context in place of the client's."""
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower() not in _DROPPED_HEADERS
        }
        if trace_headers:
            headers = {k: v for k, v in headers.items() if k.lower() not in TRACE_CONTEXT_HEADERS}
            headers.update(trace_headers)
        identity = admitted.identity
        prior_service = self._prior_service(admitted.record, engine)
        if prior_service is not None:
            identity = replace(identity, prior_service=prior_service)
        headers.update(identity.as_headers())
        return headers

    def _prior_service(self, record: ProgramRecord | None, engine: Engine) -> float | None:
        """The program's service over all engines, for an engine that counts in tokens."""
        if record is None or not states_prior_service(engine.service_unit):
            return None
        return prior_service(record.service, self.config.table.limits)

    async def _send_whole(
        self,
        request: web.Request,
        call: Call,
        engine: Engine,
        headers: dict[str, str],
        outcome: Outcome,
    ) -> None:
        engine.in_flight += 1
        sent = time.perf_counter()
        try:
            upstream = await self._post(call, engine, headers)
            try:
                payload = await upstream.read()
            except ENGINE_CONNECTION_FAILURES as error:
                raise EngineUnreachable(engine, error) from error
            finally:
                upstream.release()
        finally:
            engine.in_flight -= 1
        outcome.upstream_s = time.perf_counter() - sent
        outcome.engine = engine
        outcome.completed = upstream.status == 200
        if outcome.completed:
            outcome.service, outcome.response_id, outcome.whole_report = read_whole_answer(
                payload, self.meter
            )
        outcome.response = _whole_answer(upstream, payload, outcome.trace_headers)

    async def _send_stream(
        self,
        request: web.Request,
        call: Call,
        engine: Engine,
        headers: dict[str, str],
        outcome: Outcome,
    ) -> None:
        engine.in_flight += 1
        upstream: aiohttp.ClientResponse | None = None
        try:
            upstream = await self._post(call, engine, headers)
            try:
                if upstream.status != 200:  # an error answer, not a stream: relay it whole
                    outcome.engine = engine
                    payload = await upstream.read()
                    outcome.response = _whole_answer(upstream, payload, outcome.trace_headers)
                    return
                first = await upstream.content.readany()
            except ENGINE_CONNECTION_FAILURES as error:
                raise EngineUnreachable(engine, error) from error
            if not first:
                raise EngineUnreachable(engine, ConnectionError("stream closed before any data"))
            headers = {**passed_back_headers(upstream), **outcome.trace_headers}
            response = web.StreamResponse(
                status=200, headers={**headers, "Cache-Control": "no-cache"}
            )
            outcome.engine, outcome.response = engine, response
            outcome.relay = SseRelay(response, self.meter, drop_usage=call.usage_injected)
            try:
                await response.prepare(request)
                outcome.completed = await self._relay(outcome.relay, upstream, first, engine)
                await response.write_eof()
            except _CLIENT_GONE:
                outcome.completed = False
                log.info("client went away during a stream from %s; aborting it", engine.name)
        finally:
            engine.in_flight -= 1
            if upstream is not None:
                upstream.release()  # closes the connection if unread: the engine aborts

    async def _post(
        self, call: Call, engine: Engine, headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        """Send ``call`` to ``engine``; returns once the answer's status and headers are in."""
        try:
            return await self.session.post(engine.url + call.path, data=call.raw, headers=headers)
        except ENGINE_CONNECTION_FAILURES as error:
            raise EngineUnreachable(engine, error, _closed_before_answer(error)) from error

    async def _relay(
        self, relay: SseRelay, upstream: aiohttp.ClientResponse, first: bytes, engine: Engine
    ) -> bool:
        """Relay the stream to its end; False if the engine broke it."""
        chunk = first
        while chunk:
            await relay.feed(chunk)
            try:
                chunk = await upstream.content.readany()
            except ENGINE_CONNECTION_FAILURES as error:
                log.warning("%s broke a stream after it started: %s", engine.name, error)
                self.pool.call_failed(engine, error)
                await relay.finish()
                await relay.response.write(mid_stream_error_event(error))
                return False
        await relay.finish()
        return True


def _whole_answer(
    upstream: aiohttp.ClientResponse, payload: bytes, trace_headers: Mapping[str, str]
) -> web.Response:
    """The engine's answer: its status, body and content type, and the call's
    ``trace_headers``; an error's body is put in the router's shape
    (:func:`~autellix_vllm.protocol.openai_errors.normalized_error`), whatever
    shape the engine gave it."""
    headers = {**passed_back_headers(upstream), **trace_headers}
    if upstream.status >= 400:
        payload = json.dumps(normalized_error(upstream.status, payload)).encode()
        headers["Content-Type"] = "application/json"
    return web.Response(body=payload, status=upstream.status, headers=headers)
