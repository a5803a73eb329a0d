"""The router's middlewares: OpenAI-shaped errors (outermost), then the API key."""

from __future__ import annotations

import hmac
import logging

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from autellix_vllm.router.errors import ApiError, error_response
from autellix_vllm.router.metrics import RouterMetrics

log = logging.getLogger("autellix.router")

# aiohttp's own HTTP errors -> the code the router reports for them.
_HTTP_ERROR_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
}


def openai_errors(metrics: RouterMetrics, max_body_bytes: int) -> Middleware:
    """Answer every error the router raises as ``{"error": {...}}`` with its status."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as error:
            metrics.errors.labels(error.code).inc()
            return error_response(error)
        except web.HTTPException as http_error:
            if http_error.status < 400:
                raise
            error = _from_http_error(http_error, request, max_body_bytes)
            metrics.errors.labels(error.code).inc()
            return error_response(error)

    return middleware


def require_api_key(api_key: str) -> Middleware:
    """Every route needs ``Authorization: Bearer <api_key>`` (compared in constant time)."""
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").strip().encode()
        if not hmac.compare_digest(given, expected):
            raise ApiError(
                401, "a valid API key is needed: Authorization: Bearer <key>", "invalid_api_key"
            )
        return await handler(request)

    return middleware


def _from_http_error(error: web.HTTPException, request: web.Request, limit: int) -> ApiError:
    code = _HTTP_ERROR_CODES.get(error.status, "http_error")
    if error.status == 413:
        message = f"the request body is larger than the limit of {limit} bytes"
    elif error.status == 404:
        message = f"no such route: {request.method} {request.path}"
    elif error.status == 405:
        message = f"{request.method} is not allowed on {request.path}"
    else:
        message = error.text or error.reason
    return ApiError(error.status, message, code)
