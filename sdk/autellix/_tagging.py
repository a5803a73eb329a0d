"""How identity travels on an LLM call: five HTTP headers (and a retention hint
and a priority class when they are set).

Headers, not body fields: every OpenAI-compatible server ignores headers it does
not know, while strict ones (OpenAI's own API among them) reject unknown body
fields, which would break the plain-client fallback. On the autellix path the
router reads the headers, and the engine's middleware copies them into the
body's `vllm_xargs`, where vLLM hands them to the scheduler. A vLLM engine
without our middleware still reads `X-Session-ID` (the program id).

Whatever the user set wins: their headers (compared case-insensitively, including
an explicit `openai.Omit`) are never overwritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._identity import ThreadIdentity

PROGRAM_ID_HEADER = "X-Autellix-Program-Id"
THREAD_ID_HEADER = "X-Autellix-Thread-Id"
PARENT_THREAD_ID_HEADER = "X-Autellix-Parent-Thread-Id"
CALL_ID_HEADER = "X-Autellix-Call-Id"
SESSION_ID_HEADER = "X-Session-ID"
"""Read by vLLM (`Request.session_id`) and session-aware routers; carries the program id."""
RETENTION_TTL_HEADER = "X-Autellix-Retention-Ttl"
"""Seconds the server should keep the program's context after this call (`expect_tool`)."""
PRIORITY_HEADER = "X-Autellix-Priority"
"""The priority class the call asks for (`autellix.priority`)."""


def identity_headers(
    identity: ThreadIdentity,
    call_id: str,
    retention_ttl_s: float | None = None,
    priority: str | None = None,
) -> dict[str, str]:
    """The headers that carry `identity`, the call id, and a retention hint and a
    priority class, if any.

    A main thread has no parent: its calls carry an empty parent header.
    """
    headers = {
        PROGRAM_ID_HEADER: identity.program_id,
        THREAD_ID_HEADER: identity.thread_id,
        PARENT_THREAD_ID_HEADER: identity.parent_thread_id or "",
        CALL_ID_HEADER: call_id,
        SESSION_ID_HEADER: identity.program_id,
    }
    if retention_ttl_s is not None:
        headers[RETENTION_TTL_HEADER] = repr(retention_ttl_s)
    if priority is not None:
        headers[PRIORITY_HEADER] = priority
    return headers


def tagged_headers(
    user_headers: Mapping[str, Any] | None,
    identity: ThreadIdentity,
    call_id: str,
    retention_ttl_s: float | None = None,
    priority: str | None = None,
) -> dict[str, Any]:
    """`user_headers` plus our headers whose names the user did not set."""
    ours = identity_headers(identity, call_id, retention_ttl_s, priority)
    if not user_headers:
        return ours
    taken = {name.lower() for name in user_headers}
    merged = dict(user_headers)
    for name, value in ours.items():
        if name.lower() not in taken:
            merged[name] = value
    return merged
