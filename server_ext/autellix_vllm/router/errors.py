"""Errors the router answers itself, in OpenAI's shape.

Every error body is ``{"error": {"message", "type", "param", "code"}}``. ``type``
follows OpenAI (``invalid_request_error``, ``authentication_error``,
``server_error``); ``code`` is a short machine-readable name such as
``model_not_found`` or ``program_ended``. Errors from an engine are not made
here: they pass through with the engine's status and body.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web


class ApiError(Exception):
    """Raised anywhere in a handler; the error middleware turns it into a response."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


def error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(status: int, message: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def error_response(error: ApiError) -> web.Response:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return web.json_response(
        error_body(error.status, error.message, error.code, error.param),
        status=error.status,
        headers=headers,
    )
