"""How identity travels on an LLM call: HTTP headers plus `vllm_xargs` in the body.

Headers are for routers and our middleware, which should not parse bodies. The
body copy (`extra_body["vllm_xargs"]`) reaches a bare vLLM engine, which drops
unknown headers but hands `vllm_xargs` to the scheduler as flat scalars.

Whatever the user set wins: their headers (compared case-insensitively, including
an explicit `openai.Omit`) and their `vllm_xargs` keys are never overwritten.
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

VLLM_XARGS_KEY = "vllm_xargs"


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


def identity_vllm_xargs(identity: ThreadIdentity, call_id: str) -> dict[str, str]:
    """The flat `vllm_xargs` keys that carry `identity` and the call id in the body.

    A main thread's calls carry no parent key (vLLM's flat values cannot be null).
    """
    xargs = {
        "autellix_program_id": identity.program_id,
        "autellix_thread_id": identity.thread_id,
        "autellix_call_id": call_id,
    }
    if identity.parent_thread_id is not None:
        xargs["autellix_parent_thread_id"] = identity.parent_thread_id
    return xargs


def merge_headers(user_headers: Mapping[str, Any], ours: Mapping[str, str]) -> dict[str, Any]:
    """`user_headers` plus those of `ours` whose names the user did not set."""
    taken = {name.lower() for name in user_headers}
    merged = dict(user_headers)
    for name, value in ours.items():
        if name.lower() not in taken:
            merged[name] = value
    return merged


def merge_extra_body(
    json_body: Mapping[str, Any], extra_body: Mapping[str, Any] | None, ours: Mapping[str, str]
) -> dict[str, Any]:
    """`extra_body` with our keys added under `vllm_xargs`.

    User `vllm_xargs` may come from `extra_body` or (for low-level `client.post`)
    from the body itself; openai merges the two shallowly, so both are folded in
    here and the user's keys win over ours.
    """
    body_xargs = json_body.get(VLLM_XARGS_KEY)
    extra_xargs = extra_body.get(VLLM_XARGS_KEY) if extra_body else None
    xargs = {**ours, **(body_xargs or {}), **(extra_xargs or {})}
    return {**(extra_body or {}), VLLM_XARGS_KEY: xargs}


def tag_request_options(
    options: Mapping[str, Any],
    identity: ThreadIdentity,
    call_id: str,
    *,
    json_body: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """A copy of openai's per-call `RequestOptions` that tags one call with `identity`.

    `json_body` is the request's JSON object body (every LLM call has one);
    requests without one (uploads, raw content) get the headers alone.
    """
    headers: dict[str, Any] = identity_headers(identity, call_id)
    user_headers = options.get("headers")
    if user_headers:
        headers = merge_headers(user_headers, headers)
    tagged = {**options, "headers": headers}
    if json_body is not None:
        tagged["extra_json"] = merge_extra_body(
            json_body, options.get("extra_json"), identity_vllm_xargs(identity, call_id)
        )
    return tagged
