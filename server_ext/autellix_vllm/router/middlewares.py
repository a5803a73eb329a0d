"""The router's middlewares: OpenAI-shaped errors (outermost), then the caller's key.

Errors that aiohttp's HTTP parser finds before any middleware runs (a header
too large, a control character in a header) are answered in the same shape by
``app.JsonErrorRequestHandler``.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from autellix_vllm.protocol.bearer import INVALID_KEY_CODE
from autellix_vllm.protocol.openai_errors import error_answer, status_error_code
from autellix_vllm.router.errors import ApiError
from autellix_vllm.router.keys import ANONYMOUS, Client, KeyRing
from autellix_vllm.router.metrics import RouterMetrics

log = logging.getLogger("autellix.router")

CLIENT = web.RequestKey("autellix_client", Client)
"""The caller of a request, set by :func:`authenticate`; see :func:`caller`."""


def caller(request: web.Request) -> Client:
    """Who sent ``request`` (:data:`ANONYMOUS` on a router without keys)."""
    return request.get(CLIENT, ANONYMOUS)


def openai_errors(metrics: RouterMetrics, max_body_bytes: int) -> Middleware:
    """Answer every error as ``{"error": {...}}`` with its status.

    A client's error is logged as one line; an unexpected exception (a bug in
    the router) as a 500 with its traceback.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as error:
            return _answer(error, request, metrics)
        except web.HTTPException as http_error:
            if http_error.status < 400:
                raise
            return _answer(_from_http_error(http_error, request, max_body_bytes), request, metrics)
        except Exception:
            log.exception("%s %r failed", request.method, request.raw_path[:200])
            failure = ApiError(500, "the router failed to handle the request", "internal_error")
            return _answer(failure, request, metrics)

    return middleware


def authenticate(keys: KeyRing) -> Middleware:
    """Every route needs ``Authorization: Bearer <key>`` with one of ``keys``; the
    key's client is stored on the request (:func:`caller`)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        client = keys.client_for(request.headers.get("Authorization"))
        if client is None:
            raise ApiError(
                401, "a valid API key is needed: Authorization: Bearer <key>", INVALID_KEY_CODE
            )
        request[CLIENT] = client
        return await handler(request)

    return middleware


def _answer(error: ApiError, request: web.Request, metrics: RouterMetrics) -> web.Response:
    metrics.errors.labels(error.code).inc()
    # The raw path, quoted: a client's text never reaches the log unescaped.
    where = f"{request.method} {request.raw_path[:200]!r}"
    if error.status < 500:
        log.info("%s: %d %s", where, error.status, error.code)
    else:
        log.warning("%s: %d %s: %s", where, error.status, error.code, error.message)
    return error_response(error)


def error_response(error: ApiError) -> web.Response:
    """``error`` as the response a client gets (a 401 says how to authenticate)."""
    answer = error_answer(error.status, error.message, error.code, error.param)
    return web.json_response(answer.body, status=answer.status, headers=answer.headers)


def _from_http_error(error: web.HTTPException, request: web.Request, limit: int) -> ApiError:
    code = status_error_code(error.status)
    if error.status == 413:
        message = f"the request body is larger than the limit of {limit} bytes"
    elif error.status == 404:
        message = f"no such route: {request.method} {request.path}"
    elif error.status == 405:
        message = f"{request.method} is not allowed on {request.path}"
    else:
        message = error.text or error.reason
    return ApiError(error.status, message, code)
