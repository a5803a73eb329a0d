"""ASGI middleware for vLLM's ``--middleware``: identity headers -> ``vllm_xargs``.

vLLM drops unknown headers before a request reaches the engine, but it passes
the body's ``vllm_xargs`` through to ``Request.sampling_params.extra_args``.
This middleware copies the ``X-Autellix-*`` headers into that dict (see
:mod:`autellix_vllm.protocol` for the keys and the precedence rule), and
answers a malformed value with an OpenAI-style HTTP 400 without forwarding
the request.

Only JSON POSTs to the generation endpoints are touched; everything else, and
any body this middleware cannot parse, passes through byte for byte so vLLM
reports its own errors.

Usage: ``--middleware autellix_vllm.engine.middleware.IdentityMiddleware``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from autellix_vllm.protocol import (
    IdentityError,
    merge_into_xargs,
    validate_xargs,
    xargs_from_headers,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The endpoints whose bodies accept `vllm_xargs`.
GENERATION_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"}
)


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
            new_body = rewrite_body(body, xargs_from_headers(headers))
        except IdentityError as exc:
            await send_openai_error(send, 400, str(exc), param=exc.param)
            return
        if new_body is not body:
            scope = dict(scope)
            scope["headers"] = [
                (k, v) for k, v in scope["headers"] if k.lower() != b"content-length"
            ] + [(b"content-length", str(len(new_body)).encode())]
        await self.app(scope, _replay(new_body, receive), send)


def rewrite_body(body: bytes, header_xargs: dict[str, str | float]) -> bytes:
    """The body with ``header_xargs`` merged into its ``vllm_xargs``.

    Returns ``body`` itself (the same object) when nothing changes or the body
    is not a JSON object with a dict (or absent) ``vllm_xargs``; those are left
    for vLLM to reject. Raises :class:`IdentityError` for malformed identity keys
    already in the body.
    """
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return body
    if not isinstance(payload, dict):
        return body
    body_xargs = payload.get("vllm_xargs")
    if body_xargs is not None and not isinstance(body_xargs, dict):
        return body
    if not header_xargs:
        validate_xargs(body_xargs or {})
        return body
    merged = merge_into_xargs(body_xargs, header_xargs)
    validate_xargs(merged)
    payload["vllm_xargs"] = merged
    return json.dumps(payload).encode()


async def send_openai_error(
    send: Send, status: int, message: str, param: str | None = None
) -> None:
    """Answer with vLLM/OpenAI's error shape: ``{"error": {message, type, param, code}}``."""
    content = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": status,
            }
        }
    ).encode()
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
