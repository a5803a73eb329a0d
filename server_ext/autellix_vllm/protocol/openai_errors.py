"""The error body, OpenAI's shape, from the router and the engines alike.

:func:`error_body` makes it and :func:`error_answer` the whole answer (a 401's
``WWW-Authenticate`` header too), which each web framework only wraps;
:func:`normalized_error` puts any other error answer (vLLM's own, FastAPI's,
aiohttp's) in that shape, keeping its status and message;
:func:`mid_stream_error_event` ends a stream the engine broke.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from autellix_vllm.protocol.bearer import INVALID_KEY_CODE


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status."""
    if status == 401:
        return "authentication_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


# HTTP status -> the error code of an answer that names none (vLLM's `"code": 400`,
# its `{"error": "Unauthorized"}`, FastAPI's `{"detail": ...}`, aiohttp's errors).
STATUS_ERROR_CODES = {
    400: "invalid_request",
    401: INVALID_KEY_CODE,
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "body_too_large",
    422: "invalid_request",
    429: "rate_limited",
    500: "internal_error",
    501: "not_implemented",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "gateway_timeout",
}


def status_error_code(status: int) -> str:
    """The error code for an HTTP ``status`` when nothing more specific is known."""
    return STATUS_ERROR_CODES.get(status, "server_error" if status >= 500 else "http_error")


def error_body(status: int, message: str, code: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``.

    ``code`` is a short machine-readable name such as ``invalid_identity`` or
    ``model_not_found``; ``param`` names the offending parameter, if any.
    """
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


@dataclass(frozen=True)
class ErrorAnswer:
    """An error answer, for any web framework to send: status, JSON body, headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def error_answer(status: int, message: str, code: str, param: str | None = None) -> ErrorAnswer:
    """The answer of an error: :func:`error_body`, and for a 401 the
    ``WWW-Authenticate: Bearer`` header that says how to authenticate (RFC 9110)."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    return ErrorAnswer(status, error_body(status, message, code, param), headers)


MID_STREAM_FAILURE_CODE = "engine_failed_mid_stream"


def mid_stream_error_event(error: BaseException) -> bytes:
    """The last server-sent event of a stream the engine broke after it started
    (too late to retry or change the status): a 502 error body, code
    :data:`MID_STREAM_FAILURE_CODE`."""
    message = f"the engine failed during the stream: {type(error).__name__}"
    event = error_body(502, message, MID_STREAM_FAILURE_CODE)
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def normalized_error(status: int, body: bytes) -> dict[str, Any]:
    """An error answer's ``body`` (any bytes) as :func:`error_body` of ``status``.

    The message is kept: the error's ``message`` (OpenAI's and vLLM's shape), a
    bare ``{"error": "text"}`` (vLLM's 401), FastAPI's ``detail``, else the body
    as text. A string ``code`` and ``param`` are kept; any other code (vLLM's
    integer ``400``) becomes :func:`status_error_code`. Our own bodies come
    back unchanged.
    """
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError)
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    fields = error if isinstance(error, dict) else {}
    if isinstance(error, dict):
        message: object = error.get("message")
    elif error is not None:
        message = error
    elif isinstance(payload, dict) and "detail" in payload:
        message = payload["detail"]
    else:
        message = body.decode("utf-8", "replace").strip()
    if not isinstance(message, str):
        message = json.dumps(message) if message is not None else ""
    code = fields.get("code")
    param = fields.get("param")
    return error_body(
        status,
        message or f"the server answered {status}",
        code if isinstance(code, str) and code else status_error_code(status),
        param if isinstance(param, str) else None,
    )
