"""The engine key, and how a bearer key is read from an ``Authorization`` header.

The engine key is the secret a router (or an operator) holds for an engine. An
engine started with one (``autellix engine --api-key``; ``autellix serve``
makes one per run) reads it from :data:`ENGINE_KEY_VARIABLE`, and takes
scheduling fields (the prior service) and its ``/autellix/v1/engine/*``
endpoints only from callers that send it as ``Authorization: Bearer <key>``,
as vLLM's own ``--api-key`` does.
"""

from __future__ import annotations

import hmac

ENGINE_KEY_VARIABLE = "AUTELLIX_ENGINE_KEY"
INVALID_KEY_CODE = "invalid_api_key"
"""The error code of a request that lacks a key the server needs (status 401)."""


def holds_key(authorization: str | bytes | None, key: str) -> bool:
    """Whether an ``Authorization`` header value carries ``key``: ``Bearer <key>``,
    the scheme in any case, as vLLM's ``--api-key`` check reads it.

    Compared in constant time, so the answer's timing tells nothing of the key.
    """
    if not authorization:
        return False
    if isinstance(authorization, str):
        authorization = authorization.encode("utf-8", "surrogateescape")
    scheme, _, given = authorization.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given, key.encode())
