"""Reading one OpenAI call: its JSON body, model, program identity and prompt size.

Identity is read exactly as the engines read it
(:func:`autellix_vllm.protocol.identity.read_identity`): the ``X-Autellix-*``
headers, else the body's ``vllm_xargs`` keys; the program id falls back to the
session id. A malformed value is a 400 here, before any engine sees the call.
The call record (:class:`Call`) carries the accepted
:class:`~autellix_vllm.protocol.identity.CallIdentity` whole, and the session
headers a program may be derived from; neither changes after: the process
table takes the identity, and the dispatcher keeps what it adds (a derived
program, the owner) in a record of its own (``admission.Admitted``).

Then every scheduling field the client put in the body (the ``autellix_*``
keys of ``vllm_xargs``, the prior service among them, and the body's own
``priority``) is removed, and what only the router states
(:data:`~autellix_vllm.protocol.trust.ROUTER_STATED`) is not kept from the
client (:func:`autellix_vllm.protocol.trust.accepted`: the router's edge takes
them from no one), but for the band the client asked for (its
``X-Autellix-Priority``, else its ``vllm_xargs`` key, else the body's
``priority``, vLLM's field): ``admission`` bounds that by the client's key.
The router sends the engine the identity it accepted, with the program's
prior service, owner, band and weight (and, for a call its gate held, the
router wait), as headers of its own (``dispatch``),
so the engine has one source for each. A body ``priority`` never reaches an
engine as sent: vLLM would order calls by it under its priority policy, which
the engines run. The client's retention hint
(``X-Autellix-Retention-Ttl``, its ``vllm_xargs`` key, or
``agent_hint.cache_control.ttl``) is passed on the same way, as the client
sent it: the engine clamps it to its residency bounds. It says how long to
keep the program's context, never how it ranks. The body's ``agent_hint``
itself is passed on as it came.

Prompt size, for the locality threshold, is a cheap estimate that needs no
tokenizer: the characters of the prompt text (message contents, text parts,
tool-call arguments, tool definitions as JSON; a completion prompt; a response
input and instructions) divided by ``chars_per_token`` (default 4, typical of
BPE tokenizers on English; 1 for a character-level tokenizer), rounded up,
plus one token per element of a prompt given as token ids.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from autellix_vllm.protocol.identity import (
    AGENT_HINT_FIELD,
    IDENTITY_XARGS,
    PRIORITY_FIELD,
    SESSION_ID_FIELD,
    XARGS_FIELD,
    CallIdentity,
    IdentityError,
    read_identity,
)
from autellix_vllm.protocol.paths import CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, RESPONSES_PATH
from autellix_vllm.protocol.trust import accepted
from autellix_vllm.router.derived import session_headers
from autellix_vllm.router.errors import ApiError

# Keys of chat messages and response input items that hold prompt text.
_TEXT_KEYS = ("content", "text", "tool_calls", "function", "arguments", "output")
# JSON values the prompt-size estimate looks at, at most: it is an estimate, and
# a body of a million tiny parts must not hold the router up walking them.
_MAX_PROMPT_NODES = 10_000


@dataclass
class Call:
    """One generation call as the router accepted it."""

    path: str
    body: dict[str, Any]
    raw: bytes  # what is sent to the engine
    model: str
    stream: bool
    identity: CallIdentity
    """As accepted, never changed after: no prior service or owner (the router
    states the program's own, ``dispatch``), the retention hint as sent, the
    band the client asked for (``admission`` states the one its key allows)."""
    prompt_tokens: int
    # Its session headers (router.derived.session_headers), what a program is
    # derived from besides the body when the call names none.
    session_headers: dict[str, str] = field(default_factory=dict)
    # The router asked for stream usage the client did not: drop that chunk.
    usage_injected: bool = False


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ApiError(400, f"the body is not valid JSON: {error}", "invalid_json") from None
    except RecursionError:
        raise _too_deep() from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", "invalid_json")
    return body


def dump_json(value: Any) -> bytes:
    """``value`` as JSON; a body nested too deeply to write again is a 400."""
    try:
        return json.dumps(value).encode()
    except RecursionError:
        raise _too_deep() from None


def _too_deep() -> ApiError:
    return ApiError(400, "the body is nested too deeply", "invalid_json")


def read_call(
    path: str,
    raw: bytes,
    headers: Mapping[str, str],
    models: Collection[str],
    chars_per_token: float,
) -> Call:
    """Parse and check a generation call; raises :class:`ApiError` for bad input."""
    body = parse_json_object(raw)
    model = body.get("model")
    if model is None or model == "":
        raise ApiError(400, "you must provide a model parameter", "missing_model", "model")
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string", "invalid_type", "model")
    if model not in models:
        raise ApiError(404, _unknown_model(model, models), "model_not_found", "model")
    # A client never states the router's fields: the router's edge trusts no one.
    # The band it asks for is kept as a request: admission bounds it by the key's.
    sent = _identity(body, headers)
    identity = replace(accepted(sent, may_state=False), priority=sent.priority)
    call = Call(
        path=path,
        body=body,
        raw=raw,
        model=model,
        stream=body.get("stream") is True,
        identity=identity,
        prompt_tokens=estimate_prompt_tokens(path, body, chars_per_token),
        session_headers=session_headers(headers),
    )
    changed = _strip_scheduling_fields(body)
    if call.stream and path != RESPONSES_PATH:
        changed |= _ask_for_stream_usage(call)
    if changed:
        call.raw = dump_json(body)
    return call


def _unknown_model(model: str, models: Collection[str]) -> str:
    """The 404's message: the names a client may use instead."""
    if not models:
        return f"the model {model!r} does not exist; no healthy engine serves a model now"
    served = ", ".join(repr(name) for name in sorted(models))
    return f"the model {model!r} does not exist; this router serves {served}"


def _identity(body: dict[str, Any], headers: Mapping[str, str]) -> CallIdentity:
    try:
        return read_identity(
            headers.items(),
            body.get(XARGS_FIELD),
            body.get(SESSION_ID_FIELD),
            agent_hint=body.get(AGENT_HINT_FIELD),
            priority=body.get(PRIORITY_FIELD),
        )
    except IdentityError as error:
        raise ApiError(400, str(error), error.code, error.param) from None


def _strip_scheduling_fields(body: dict[str, Any]) -> bool:
    """Remove the body's ``priority`` and the ``autellix_*`` keys of its
    ``vllm_xargs``; True if any was there."""
    had_priority = PRIORITY_FIELD in body
    body.pop(PRIORITY_FIELD, None)
    xargs = body.get(XARGS_FIELD)
    if not isinstance(xargs, dict):
        return had_priority
    found = [key for key in IDENTITY_XARGS.values() if key in xargs]
    for key in found:
        del xargs[key]
    if found and not xargs:
        del body[XARGS_FIELD]
    return had_priority or bool(found)


def _ask_for_stream_usage(call: Call) -> bool:
    """Streams report token usage only when asked; the router needs it for service.
    True if the body was changed."""
    options = call.body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    if options is not None and not isinstance(options, dict):
        return False  # malformed: the engine answers with its own 400
    call.body["stream_options"] = {**(options or {}), "include_usage": True}
    call.usage_injected = True
    return True


def estimate_prompt_tokens(path: str, body: dict[str, Any], chars_per_token: float) -> int:
    chars = 0
    token_ids = 0
    if path == CHAT_COMPLETIONS_PATH:
        chars = _text_chars(body.get("messages"))
    elif path == COMPLETIONS_PATH:
        prompt = body.get("prompt")
        token_ids = _token_ids(prompt)
        if token_ids == 0:
            chars = _text_chars(prompt)
    else:
        chars = _text_chars(body.get("input")) + _text_chars(body.get("instructions"))
    tools = body.get("tools")
    if tools:
        chars += len(dump_json(tools))
    return token_ids + math.ceil(chars / chars_per_token)


def _text_chars(value: Any) -> int:
    """Characters of prompt text in ``value``: its strings, in lists and under
    :data:`_TEXT_KEYS`, walked without recursion and up to :data:`_MAX_PROMPT_NODES`."""
    chars = 0
    pending = [value]
    for _ in range(_MAX_PROMPT_NODES):
        if not pending:
            break
        item = pending.pop()
        if isinstance(item, str):
            chars += len(item)
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item[key] for key in _TEXT_KEYS if key in item)
    return chars


def _token_ids(prompt: Any) -> int:
    """Tokens of a prompt given as token ids (one list, or a batch of lists); else 0."""
    if not isinstance(prompt, list) or not prompt:
        return 0
    if all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
        return sum(len(p) for p in prompt)
    return 0
