"""Errors the router answers itself, in OpenAI's shape.

The body is :func:`autellix_vllm.protocol.openai_errors.error_body`, the same the engines
send: ``{"error": {"message", "type", "param", "code"}}`` with ``type`` derived
from the status and ``code`` a short machine-readable name such as
``model_not_found`` or ``program_ended``. Plain Python (the Ray Serve ingress
raises the same errors); ``middlewares.error_response`` writes one as aiohttp's
response. Errors from an engine are not made
here: they pass through with the engine's status and message, their body put
in this shape (``dispatch``, :func:`autellix_vllm.protocol.openai_errors.normalized_error`).
"""

from __future__ import annotations

from autellix_vllm.protocol.openai_errors import error_body

__all__ = ["ApiError", "error_body"]


class ApiError(Exception):
    """Raised anywhere in a handler; the error middleware turns it into a response."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
