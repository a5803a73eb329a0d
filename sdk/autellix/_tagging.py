"""How identity travels on an LLM call: five HTTP headers.

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


def identity_headers(identity: ThreadIdentity, call_id: str) -> dict[str, str]:
    """The headers that carry `identity` and the call id.

    A main thread has no parent: its calls carry an empty parent header.
    """
    return {
        PROGRAM_ID_HEADER: identity.program_id,
        THREAD_ID_HEADER: identity.thread_id,
        PARENT_THREAD_ID_HEADER: identity.parent_thread_id or "",
        CALL_ID_HEADER: call_id,
        SESSION_ID_HEADER: identity.program_id,
    }


def tagged_headers(
    user_headers: Mapping[str, Any] | None, identity: ThreadIdentity, call_id: str
) -> dict[str, Any]:
    """`user_headers` plus the identity headers whose names the user did not set."""
    ours = identity_headers(identity, call_id)
    if not user_headers:
        return ours
    taken = {name.lower() for name in user_headers}
    merged = dict(user_headers)
    for name, value in ours.items():
        if name.lower() not in taken:
            merged[name] = value
    return merged
