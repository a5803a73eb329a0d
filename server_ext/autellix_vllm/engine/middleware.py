"""ASGI middleware for vLLM's ``--middleware``: identity headers -> ``vllm_xargs``.

vLLM drops unknown headers before a request reaches the engine, but it passes
the body's ``vllm_xargs`` through to ``Request.sampling_params.extra_args``.
This middleware reads the call's identity exactly as the router does
(:func:`autellix_vllm.protocol.read_identity`: the ``X-Autellix-*`` headers win
over the body's keys) and writes it into that dict, where the scheduler finds
it. A malformed value is answered with OpenAI's error body and status 400,
without forwarding the request.

Only JSON POSTs to the generation endpoints are touched; everything else, and
any body this middleware cannot parse, passes through byte for byte so vLLM
reports its own errors.

Usage: ``--middleware autellix_vllm.engine.middleware.IdentityMiddleware``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from autellix_vllm.protocol import (
    GENERATION_PATHS,
    SESSION_ID_FIELD,
    XARGS_FIELD,
    IdentityError,
    error_body,
    read_identity,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class IdentityMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _is_json_generation_post(scope):
            await self.app(scope, receive, send)
            return
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        body = await _read_body(receive)
        try:
            new_body = rewrite_body(body, headers)
        except IdentityError as exc:
            await send_openai_error(send, 400, str(exc), exc.code, exc.param)
            return
        if new_body is not body:
            scope = dict(scope)
            scope["headers"] = [
                (k, v) for k, v in scope["headers"] if k.lower() != b"content-length"
            ] + [(b"content-length", str(len(new_body)).encode())]
        await self.app(scope, _replay(new_body, receive), send)


def rewrite_body(body: bytes, headers: Iterable[tuple[str, str]]) -> bytes:
    """The body with the call's identity written into its ``vllm_xargs``.

    Other ``vllm_xargs`` keys are kept. Returns ``body`` itself (the same
    object) when nothing changes or the body is not a JSON object with a dict
    (or absent) ``vllm_xargs``; those are left for vLLM to reject. Raises
    :class:`IdentityError` for a malformed identity value, in the headers or
    the body.
    """
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        payload = None
    if not isinstance(payload, dict):
        read_identity(headers)  # malformed headers are rejected all the same
        return body
    body_xargs = payload.get(XARGS_FIELD)
    identity = read_identity(headers, body_xargs, payload.get(SESSION_ID_FIELD))
    if body_xargs is not None and not isinstance(body_xargs, dict):
        return body
    body_xargs = body_xargs or {}
    identity_xargs = identity.as_xargs()
    if all(body_xargs.get(key) == value for key, value in identity_xargs.items()):
        return body
    payload[XARGS_FIELD] = {**body_xargs, **identity_xargs}
    return json.dumps(payload).encode()


async def send_openai_error(
    send: Send, status: int, message: str, code: str, param: str | None = None
) -> None:
    """Answer with OpenAI's error body (:func:`autellix_vllm.protocol.error_body`)."""
    content = json.dumps(error_body(status, message, code, param)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(content)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": content})


def _is_json_generation_post(scope: Scope) -> bool:
    if scope["type"] != "http" or scope["method"] != "POST":
        return False
    if scope["path"].rstrip("/") not in GENERATION_PATHS:
        return False
    content_type = dict(scope["headers"]).get(b"content-type", b"application/json")
    return content_type.split(b";")[0].strip().lower() == b"application/json"


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
