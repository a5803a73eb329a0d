"""ASGI middleware for vLLM's ``--middleware``: identity headers -> ``vllm_xargs``.

vLLM drops unknown headers before a request reaches the engine, but it passes
the body's ``vllm_xargs`` through to ``Request.sampling_params.extra_args``.
This middleware reads the call's identity exactly as the router does
(:func:`autellix_vllm.protocol.identity.read_identity`, over the headers' raw bytes:
the ``X-Autellix-*`` headers win over the body's keys) and writes it into that
dict, where the scheduler finds it. A malformed value is answered with
OpenAI's error body and status 400, without forwarding the request.

What only the router states (the prior service, the owner, the band, the
weight and the router wait, :data:`~autellix_vllm.protocol.trust.ROUTER_STATED`) reaches the
scheduler only from a request that may state it, by
:func:`~autellix_vllm.protocol.trust.may_state_router_fields` (the caller
holds the engine key, :func:`~autellix_vllm.engine.settings.engine_key`); from
any other it is dropped, from the headers and from the body of every JSON POST
(vLLM takes ``vllm_xargs`` on more routes than the generation ones).

The body's own ``priority`` (vLLM's field) is read as the band the call asks
for, by the same rule as at the router (a malformed one is the same 400), and
taken out of the body: vLLM never orders calls by a client's raw integer
(the engines run vLLM's priority policy, whose order the scheduler sets).
Like ``X-Autellix-Priority`` it counts only from a holder of the engine key,
the router, which has already bounded it by the client's key.

The body's ``agent_hint`` (vLLM's agent_hint RFC: ``session_id``,
``parent_session_id``, ``cache_control.ttl``) is read last, so an agent that
does not use our SDK still has its calls scheduled as a program; what it
names is written into ``vllm_xargs`` like the rest. The retention TTL
(``X-Autellix-Retention-Ttl``, or ``agent_hint.cache_control.ttl``) is a hint,
not a priority: it is taken from anyone.

Only JSON POSTs are read; everything else, and any body this middleware cannot
parse as JSON, passes through byte for byte so vLLM reports its own errors. A
body nested too deeply to parse is answered here (400, one log line): parsing
it must not fail with a traceback.

Every error answer leaving the engine has one shape,
:func:`autellix_vllm.protocol.openai_errors.error_body` (the router's): vLLM's own error
bodies (``{"error": "Unauthorized"}`` from its ``--api-key`` check, the integer
``"code": 400`` of its request validation, FastAPI's ``detail``) are rewritten
by :func:`autellix_vllm.protocol.openai_errors.normalized_error`, keeping their status and
message. Only error answers are held back to be rewritten; a stream (``200``,
``text/event-stream``) passes through event by event. An exception that
escapes vLLM before it answered gets a ``500 internal_error`` in that shape
(and is raised on, so that it is logged with its traceback).

Usage: ``--middleware autellix_vllm.engine.middleware.IdentityMiddleware``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from autellix_vllm.engine.settings import engine_key
from autellix_vllm.protocol.identity import (
    AGENT_HINT_FIELD,
    PRIORITY_FIELD,
    SESSION_ID_FIELD,
    XARGS_FIELD,
    Header,
    IdentityError,
    read_identity,
)
from autellix_vllm.protocol.openai_errors import error_body, normalized_error
from autellix_vllm.protocol.paths import GENERATION_PATHS
from autellix_vllm.protocol.trust import ROUTER_STATED_XARGS, may_state_router_fields

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
RawHeader = tuple[bytes, bytes]  # ASGI's (name, value), the name in lower case

# The error code of a body that is not the JSON a route needs (as the router's).
INVALID_JSON = "invalid_json"


class BodyTooDeep(ValueError):
    """A JSON body nested deeper than Python's parser can follow."""


class IdentityMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.engine_key = engine_key(os.environ)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        shaped = ErrorShaper(send, rewrite=scope["method"] != "HEAD")
        try:
            await self._handle(scope, receive, shaped)
        except Exception as exc:
            if not shaped.started:
                message = f"the engine failed to handle the request: {type(exc).__name__}"
                await send_openai_error(send, 500, message, "internal_error")
            raise

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _is_json_post(scope):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        headers: list[RawHeader] = scope["headers"]
        may_state = may_state_router_fields(self.engine_key, _header(headers, b"authorization"))
        try:
            if scope["path"].rstrip("/") in GENERATION_PATHS:
                new_body = rewrite_body(body, headers, may_state_router_fields=may_state)
            else:
                new_body = body if may_state else drop_router_stated(body)
        except IdentityError as exc:
            await send_openai_error(send, 400, str(exc), exc.code, exc.param)
            return
        except BodyTooDeep as exc:
            logger.warning("%s %s: 400, %s", scope["method"], scope["path"], exc)
            await send_openai_error(send, 400, str(exc), INVALID_JSON)
            return
        if new_body is not body:
            scope = dict(scope)
            scope["headers"] = [
                (k, v) for k, v in scope["headers"] if k.lower() != b"content-length"
            ] + [(b"content-length", str(len(new_body)).encode())]
        await self.app(scope, _replay(new_body, receive), send)


def rewrite_body(
    body: bytes, headers: Iterable[Header], may_state_router_fields: bool = True
) -> bytes:
    """The body with the call's identity written into its ``vllm_xargs``, and
    without its own ``priority`` (read as the band asked for).

    Other ``vllm_xargs`` keys are kept. Unless ``may_state_router_fields`` (see
    :mod:`~autellix_vllm.protocol.trust`), what only the router states (the prior
    service, the owner, the band, the weight, the router wait) is left out, and removed from the
    body's ``vllm_xargs``.
    Returns ``body`` itself (the same object) when nothing changes or the body
    is not a JSON object with a dict (or absent) ``vllm_xargs``; those are left
    for vLLM to reject. Raises :class:`IdentityError` for a malformed identity
    value, in the headers or the body (the prior service too, trusted or not:
    router and engine reject the same requests), and :class:`BodyTooDeep`.

    The body is decoded once; a body without ``vllm_xargs`` (every call the
    router sends) gets the key spliced in, without encoding the rest again.
    """
    payload = _parse(body)
    if not isinstance(payload, dict):
        read_identity(headers)  # malformed headers are rejected all the same
        return body
    body_xargs = payload.get(XARGS_FIELD)
    identity = read_identity(
        headers,
        body_xargs,
        payload.get(SESSION_ID_FIELD),
        agent_hint=payload.get(AGENT_HINT_FIELD),
        priority=payload.get(PRIORITY_FIELD),
    )
    if body_xargs is not None and not isinstance(body_xargs, dict):
        return body
    new_xargs = {**(body_xargs or {}), **identity.as_xargs()}
    if not may_state_router_fields:
        for key in ROUTER_STATED_XARGS:
            new_xargs.pop(key, None)
    had_priority = PRIORITY_FIELD in payload
    payload.pop(PRIORITY_FIELD, None)
    if new_xargs == (body_xargs or {}) and not had_priority:
        return body
    if XARGS_FIELD not in payload and payload and not had_priority and _opens_in_utf8(body):
        return _with_first_key(body, XARGS_FIELD, new_xargs)
    payload[XARGS_FIELD] = new_xargs
    return _dump(payload)


def _opens_in_utf8(body: bytes) -> bool:
    """Whether ``body`` (a JSON object) starts with ``{`` after ASCII whitespace, in
    UTF-8 without a byte-order mark (JSON may come in UTF-16 or UTF-32 too)."""
    return body.lstrip(b" \t\r\n").startswith(b"{") and b"\x00" not in body[:4]


def _with_first_key(body: bytes, key: str, value: Any) -> bytes:
    """``body``, a non-empty JSON object in UTF-8 without ``key``, with ``key`` added
    as its first member: the rest of the bytes stay as they are."""
    start = body.index(b"{") + 1
    return body[:start] + json.dumps({key: value})[1:-1].encode() + b", " + body[start:]


def drop_router_stated(body: bytes) -> bytes:
    """``body`` without the ``vllm_xargs`` keys only the router states (the same
    object if it has none, or is not a JSON object)."""
    payload = _parse(body)
    xargs = payload.get(XARGS_FIELD) if isinstance(payload, dict) else None
    if not isinstance(xargs, dict):
        return body
    found = [key for key in ROUTER_STATED_XARGS if key in xargs]
    if not found:
        return body
    for key in found:
        del xargs[key]
    return _dump(payload)


def _parse(body: bytes) -> Any:
    """The body's JSON value; None if it is not JSON (vLLM will say so)."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    except RecursionError:
        raise BodyTooDeep("the body is nested too deeply") from None


def _dump(payload: Any) -> bytes:
    try:
        return json.dumps(payload).encode()
    except RecursionError:
        raise BodyTooDeep("the body is nested too deeply") from None


async def send_openai_error(
    send: Send, status: int, message: str, code: str, param: str | None = None
) -> None:
    """Answer with OpenAI's error body (:func:`autellix_vllm.protocol.openai_errors.error_body`)."""
    await _send_json(send, status, error_body(status, message, code, param), [])


async def _send_json(
    send: Send, status: int, payload: dict[str, Any], headers: list[tuple[bytes, bytes]]
) -> None:
    """Answer ``payload`` as JSON with ``status``; ``headers`` are kept, but for
    the content's type and length."""
    content = json.dumps(payload).encode()
    kept = [(k, v) for k, v in headers if k.lower() not in (b"content-type", b"content-length")]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": kept
            + [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(content)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": content})


class ErrorShaper:
    """A ``send`` that puts every error answer (status >= 400) that is not a stream
    into :func:`~autellix_vllm.protocol.openai_errors.error_body`'s shape; other answers pass
    through message by message. ``started``: an answer has begun."""

    def __init__(self, send: Send, rewrite: bool = True) -> None:
        self.send = send
        self.rewrite = rewrite
        self.started = False
        self._start: Message | None = None  # the held-back start of an error answer
        self._body: list[bytes] = []

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            if self.rewrite and message["status"] >= 400 and not _is_stream(message):
                self._start = message
                return
        elif message["type"] == "http.response.body" and self._start is not None:
            self._body.append(message.get("body", b""))
            if not message.get("more_body", False):
                start, self._start = self._start, None
                status = start["status"]
                payload = normalized_error(status, b"".join(self._body))
                await _send_json(self.send, status, payload, list(start.get("headers", [])))
            return
        await self.send(message)


def _is_stream(start: Message) -> bool:
    content_type = _header(start.get("headers", []), b"content-type") or b""
    return content_type.split(b";")[0].strip().lower() == b"text/event-stream"


def _is_json_post(scope: Scope) -> bool:
    if scope["type"] != "http" or scope["method"] != "POST":
        return False
    content_type = _header(scope["headers"], b"content-type") or b"application/json"
    return content_type.split(b";")[0].strip().lower() == b"application/json"


def _header(headers: Iterable[RawHeader], name: bytes) -> bytes | None:
    """The value of header ``name`` (lower case), or None."""
    return next((value for key, value in headers if key.lower() == name), None)


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields ``body`` once, then defers to the real one."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
