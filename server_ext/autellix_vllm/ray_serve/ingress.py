"""The OpenAI-compatible front on Ray Serve: session API, calls, keys, the router's errors.

Routes (as ``router.routes``): ``POST /v1/chat/completions``,
``/v1/completions``, ``/v1/responses`` (streamed or not, tool calls as the
engine answers them), ``GET /v1/models``, ``POST /autellix/v1/programs``,
``GET /autellix/v1/programs``, ``DELETE /autellix/v1/programs/{id}`` and
``GET /health``. Every error is the router's JSON body and code, with the
router's pieces doing the checking: keys (``router.keys``), reading a call
(``router.calls.read_call``), the process table's refusals
(``router.programs``, through the directory), service from usage
(``router.usage``).

Per call: the directory admits it (one round trip, carrying the reports of
calls that ended since the last one) by the router's own rules
(``router.admission``): the program the call names, or for a call that names
none, the one derived from its session headers and body as the router derives
it; the call runs under its program's owner (else its caller's key). The call
then goes to an engine replica through the engines' handle (the program-aware
request router places it), and how it ended is queued for the directory. The
engine is told the identity the directory accepted and the program's service
over all replicas (its replica applies the router's rule on it), never a
client's scheduling fields (``read_call`` strips them).

Flow control: when the directory keeps the flow-control gate (``autellix
ray-serve --flow-control``), an admitted call waits for its turn there
(``ProgramDirectory.enter``, under a ticket of its own) before it goes to an
engine replica, and once it ended (answered, failed, or its client left, also
while it was held) its ticket is sent to ``ProgramDirectory.leave``, so that
its seat goes to the next held call. A call held there goes with how long
(``CallIdentity.router_wait_s``, as the router states it), so that the
engine's starvation bound counts from when the call reached the gate.
Leaves travel at once, batched by a background task: a request sent from a
handler that Serve cancels (its client left) would be cancelled with it.

Failover: a call whose replica died, or whose engine could not take it,
before any byte reached the client, is sent again (same body and call id) to
another replica, up to ``max_attempts`` tries (tenacity, as in the router): a
whole answer is collected before it is relayed, so only a stream can break
after its start, and it then ends with the router's ``engine_failed_mid_stream`` event.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import json
import logging
import uuid
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from autellix_vllm.policy.config import ServiceMeter
from autellix_vllm.protocol.bearer import INVALID_KEY_CODE
from autellix_vllm.protocol.identity import CallIdentity, IdentityError, validate_id
from autellix_vllm.protocol.openai_errors import (
    error_answer,
    mid_stream_error_event,
    normalized_error,
    status_error_code,
)
from autellix_vllm.protocol.paths import GENERATION_PATHS, PROGRAMS_PATH
from autellix_vllm.ray_serve._ray_adapter import (
    REPLICA_FAILURES,
    DeploymentHandle,
    DeploymentResponseGenerator,
)
from autellix_vllm.ray_serve.messages import (
    Admission,
    AnswerHead,
    Arrival,
    CallReport,
    EngineCall,
    Refusal,
    ReportBatch,
)
from autellix_vllm.router.calls import Call, parse_json_object, read_call
from autellix_vllm.router.config import DEFAULT_MAX_BODY_BYTES
from autellix_vllm.router.errors import ApiError
from autellix_vllm.router.keys import ANONYMOUS, Client, KeyRing, load_api_keys
from autellix_vllm.router.params import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, program_name, query_int
from autellix_vllm.router.usage import SseRelay, read_answer

log = logging.getLogger("autellix.ray_serve")


@dataclass(frozen=True)
class IngressSettings:
    """How the ingress answers (the router's options of the same names)."""

    chars_per_token: float = 4.0
    max_attempts: int = 3
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Reports of ended calls wait at most this long for an admission to carry them.
    report_interval_s: float = 0.05
    api_key: str | None = None
    api_keys_file: str | None = None
    admin_key: str | None = None

    def key_ring(self) -> KeyRing:
        named = load_api_keys(self.api_keys_file) if self.api_keys_file else None
        return KeyRing.build(self.api_key, named, self.admin_key)


class _Chunks:
    """What :class:`SseRelay` writes to: the events to pass on, collected."""

    def __init__(self) -> None:
        self.out: list[bytes] = []

    async def write(self, data: bytes) -> None:
        self.out.append(data)

    def take(self) -> bytes:
        data, self.out = b"".join(self.out), []
        return data


@dataclass
class _Sent:
    """A call's answer as it started: its head and the rest of its body."""

    head: AnswerHead
    body: Any  # a stream's rest (the replica's answer stream, after the head); None if whole
    first: bytes  # for a stream: its first chunk; for a whole answer: all of it


class _NotAnswered(Exception):
    """No replica answered a call this time (nothing reached the client): try again."""


class Ingress:
    """Serve deployment class (``app``): the HTTP front of the application."""

    def __init__(
        self, engines: DeploymentHandle, directory: DeploymentHandle, settings: IngressSettings
    ) -> None:
        self.engines = engines
        self.directory = directory
        self.settings = settings
        self.keys = settings.key_ring()
        self.meter = ServiceMeter()
        self.reports = ReportBatch()
        self._models: dict[str, dict[str, Any]] = {}
        self._alone_keys = itertools.count()  # routing keys of calls without a program
        self._flusher: asyncio.Task[None] | None = None
        # Tickets of gated calls that ended, for the directory's gate (see the module).
        self.leaving: list[str] = []
        self._leaves_due = asyncio.Event()
        self._leaver: asyncio.Task[None] | None = None

    async def __call__(self, request: Request) -> Response:
        try:
            caller = self._caller(request)
            return await self._route(request, caller)
        except ApiError as error:
            return _error_response(error)
        except Exception:
            log.exception("%s %r failed", request.method, request.url.path[:200])
            return _error_response(
                ApiError(500, "the router failed to handle the request", "internal_error")
            )

    # ---- routes --------------------------------------------------------------------

    async def _route(self, request: Request, caller: Client) -> Response:
        path, method = request.url.path, request.method
        if path in GENERATION_PATHS and method == "POST":
            return await self._generate(request, caller)
        if path == "/v1/models" and method == "GET":
            return JSONResponse({"object": "list", "data": list((await self._known()).values())})
        if path == PROGRAMS_PATH and method == "POST":
            return await self._open_program(request, caller)
        if path == PROGRAMS_PATH and method == "GET":
            return await self._list_programs(request, caller)
        if path.startswith(PROGRAMS_PATH + "/") and method == "DELETE":
            return await self._end_program(path[len(PROGRAMS_PATH) + 1 :], caller)
        if path == "/health" and method == "GET":
            return JSONResponse({"healthy": True})
        known = (*GENERATION_PATHS, "/v1/models", PROGRAMS_PATH, "/health")
        if path in known or path.startswith(PROGRAMS_PATH + "/"):
            raise ApiError(405, f"{method} is not allowed on {path}", status_error_code(405))
        raise ApiError(404, f"no such route: {method} {path}", status_error_code(404))

    async def _open_program(self, request: Request, caller: Client) -> Response:
        raw = await self._body(request)
        body = parse_json_object(raw) if raw.strip() else {}
        opened = await self.directory.issue.remote(program_name(body.get("name")), caller)
        return JSONResponse(_accepted(opened))

    async def _list_programs(self, request: Request, caller: Client) -> Response:
        query = request.query_params
        limit = query_int(query.get("limit"), "limit", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
        after = query_int(query.get("after"), "after", None, 0, None)
        page = await self.directory.page.remote(caller, after, limit, self.reports.take())
        return JSONResponse(page)

    async def _end_program(self, program_id: str, caller: Client) -> Response:
        try:
            validate_id(program_id, "program_id")
        except IdentityError as error:
            raise ApiError(400, str(error), error.code, error.param) from None
        ended = _accepted(await self.directory.end.remote(program_id, caller, self.reports.take()))
        # The engines drop the program's context when it has been idle for their TTL.
        return JSONResponse({"program_id": ended["program_id"], "ended": True})

    async def _generate(self, request: Request, caller: Client) -> Response:
        self._start_flushing()
        raw = await self._body(request)
        call = read_call(
            request.url.path,
            raw,
            request.headers,
            await self._known(),
            self.settings.chars_per_token,
        )
        admission: Admission = _accepted(
            await self.directory.admit.remote(_arrival(call), caller, self.reports.take())
        )
        identity, ticket = admission.identity, None
        try:
            if admission.gated:
                ticket = uuid.uuid4().hex
                identity = await self._wait_at_gate(ticket, identity)
            engine_call = EngineCall(
                path=call.path,
                raw=call.raw,
                identity=identity,
                stream=call.stream,
                program_key=identity.program_id or f"alone-{next(self._alone_keys)}",
                prompt_tokens=call.prompt_tokens,
                prior_service=admission.prior_service,
                bound_replica=admission.bound_replica,
            )
            sent = await self._send(engine_call)
        except BaseException:  # also the client leaving while the call is held
            self._report(call, identity, None, None, completed=False)
            self._leave(ticket)
            raise
        if call.stream and sent.head.status == 200:
            return StreamingResponse(
                self._relay(call, identity, sent, ticket),
                status_code=200,
                headers={**sent.head.headers, "Cache-Control": "no-cache"},
            )
        self._leave(ticket)
        completed = sent.head.status == 200
        service, response_id = read_answer(sent.first, self.meter) if completed else (None, None)
        self._report(call, identity, sent.head, service, completed, response_id)
        body = sent.first
        if sent.head.status >= 400:
            body = json.dumps(normalized_error(sent.head.status, body)).encode()
        return Response(
            body, status_code=sent.head.status, media_type=sent.head.headers.get("Content-Type")
        )

    # ---- sending and relaying ----------------------------------------------------------

    async def _send(self, engine_call: EngineCall) -> _Sent:
        """Send the call to a replica, and again to another while none could answer."""
        failed: list[str] = []  # replicas that could not answer it, ranked last

        async def attempt() -> _Sent:
            engine_call.avoid = tuple(failed)
            # The session id is the program's: Ray's consistent-hash router keys on it.
            handle = self.engines.options(session_id=engine_call.program_key)
            # The head first, then the body's bytes.
            stream: DeploymentResponseGenerator[Any] | None = None
            try:
                if engine_call.stream:
                    # remote() is typed for either option; stream=True gives the generator.
                    stream = cast(
                        DeploymentResponseGenerator[Any],
                        handle.options(stream=True).generate.remote(engine_call),
                    )
                    head: AnswerHead = await stream.__anext__()
                else:
                    head = await handle.answer.remote(engine_call)
                if head.engine_failed:
                    failed.append(head.replica)
                    raise _NotAnswered(f"the engine of replica {head.replica} could not take it")
                if head.body is not None:
                    first = head.body
                else:  # only a stream's head comes without its body
                    assert stream is not None
                    first = await anext(stream, b"")
            except REPLICA_FAILURES as error:
                if stream is not None:
                    stream.cancel()
                if engine_call.placed_on is not None:
                    failed.append(engine_call.placed_on)
                log.warning("call of %s: a replica failed: %s", engine_call.program_key, error)
                raise _NotAnswered(f"{type(error).__name__}: {error}") from error
            return _Sent(head, stream, first)

        tries = self.settings.max_attempts
        retrying = AsyncRetrying(
            stop=stop_after_attempt(tries),
            retry=retry_if_exception_type(_NotAnswered),
            reraise=True,
        )
        try:
            return await retrying(attempt)
        except _NotAnswered as error:
            message = f"no engine could answer after {tries} tries; last: {error}"
            raise ApiError(502, message, "engine_unreachable") from None

    async def _relay(
        self, call: Call, identity: CallIdentity, sent: _Sent, ticket: str | None
    ) -> AsyncIterator[bytes]:
        chunks = _Chunks()
        relay = SseRelay(chunks, self.meter, drop_usage=call.usage_injected)
        completed = False
        try:
            await relay.feed(sent.first)
            yield chunks.take()
            try:
                async for chunk in sent.body:
                    await relay.feed(chunk)
                    if data := chunks.take():
                        yield data
            except REPLICA_FAILURES as error:
                log.warning(
                    "replica %s broke a stream after it started: %s", sent.head.replica, error
                )
                await relay.finish()
                yield chunks.take() + mid_stream_error_event(error)
                return
            await relay.finish()
            yield chunks.take()
            completed = True
        finally:
            if not completed:
                sent.body.cancel()
            service = relay.service_so_far(call.prompt_tokens)
            self._report(call, identity, sent.head, service, completed, relay.response_id)
            self._leave(ticket)

    # ---- the directory's reports ---------------------------------------------------------

    def _report(
        self,
        call: Call,
        identity: CallIdentity,
        head: AnswerHead | None,
        service: float | None,
        completed: bool,
        response_id: str | None = None,
    ) -> None:
        """Queue how a call of ``identity``'s program ended (a call without one: nothing)."""
        if identity.program_id is None:
            return
        self.reports.add(
            CallReport(
                identity.program_id,
                identity.call_id,
                head.replica if head else None,
                head.route if head else None,
                service,
                completed,
                call.path,
                response_id,
            )
        )

    def _start_flushing(self) -> None:
        """Start the background tasks that send reports and leaves to the directory."""
        if self._flusher is None:
            self._flusher = _background(self._flush_forever(), "autellix-reports")
            self._leaver = _background(self._leave_forever(), "autellix-leaves")

    async def _flush_forever(self) -> None:
        """Send the reports no admission carried within ``report_interval_s``."""
        while True:
            await asyncio.sleep(self.settings.report_interval_s)
            if self.reports:
                reports = self.reports.take()
                try:
                    await self.directory.apply.remote(reports)
                except Exception:
                    log.exception("the directory did not take %d call reports", len(reports))

    # ---- the directory's flow-control gate ----------------------------------------------

    async def _wait_at_gate(self, ticket: str, identity: CallIdentity) -> CallIdentity:
        """Wait at the directory's gate until the call ``ticket`` may go; the
        identity it goes with (the caller leaves the gate however the call ends)."""
        gone = await self.directory.enter.remote(
            ticket, identity.priority or 0, identity.owner or ""
        )
        # None only if the call had left before: never, as it leaves after this.
        return identity if gone is None else gone.applied(identity)

    def _leave(self, ticket: str | None) -> None:
        """Queue the leave of a gated call that ended (None: the call was not gated)."""
        if ticket is not None:
            self.leaving.append(ticket)
            self._leaves_due.set()

    async def _leave_forever(self) -> None:
        """Send the queued leaves to the directory as soon as there are any."""
        while True:
            await self._leaves_due.wait()
            self._leaves_due.clear()
            tickets, self.leaving = self.leaving, []
            try:
                await self.directory.leave.remote(tickets)
            except Exception:
                log.exception("the directory did not take %d leaves of its gate", len(tickets))

    # ---- small helpers -------------------------------------------------------------------

    def _caller(self, request: Request) -> Client:
        if not self.keys.required:
            return ANONYMOUS
        client = self.keys.client_for(request.headers.get("Authorization"))
        if client is None:
            raise ApiError(
                401, "a valid API key is needed: Authorization: Bearer <key>", INVALID_KEY_CODE
            )
        return client

    async def _body(self, request: Request) -> bytes:
        limit = self.settings.max_body_bytes
        raw = await request.body()
        if len(raw) > limit:
            message = f"the request body is larger than the limit of {limit} bytes"
            raise ApiError(413, message, status_error_code(413))
        return raw

    async def _known(self) -> dict[str, dict[str, Any]]:
        """The models the engines serve (asked of one replica, once: all serve the same)."""
        if not self._models:
            entries = await self.engines.models.remote()
            self._models = {entry["id"]: entry for entry in entries}
        return self._models


def _background(work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """A task of the replica's own, outside the request that started it: Serve
    cancels the handle calls of a request whose client left, and a task made in
    a request's context would have its calls counted as that request's."""
    return asyncio.create_task(work, name=name, context=contextvars.Context())


def _accepted(answer: Any) -> Any:
    """The directory's answer, or its refusal raised as the router's error."""
    if isinstance(answer, Refusal):
        raise ApiError(answer.status, answer.message, answer.code, answer.param)
    return answer


def _arrival(call: Call) -> Arrival:
    """What the directory admits ``call`` by: its identity, and for a call that
    names no program, what one may be derived from."""
    if call.identity.program_id is not None:
        return Arrival(call.identity)
    return Arrival(call.identity, call.path, call.body, call.session_headers)


def _error_response(error: ApiError) -> JSONResponse:
    answer = error_answer(error.status, error.message, error.code, error.param)
    return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)
