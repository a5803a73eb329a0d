"""Reading one OpenAI call: its JSON body, model, program identity and prompt size.

Identity is read exactly as the engines read it (:mod:`autellix_vllm.protocol`):
the ``X-Autellix-*`` headers, else the body's ``vllm_xargs`` keys; the program
id falls back to ``X-Session-ID``. A malformed value is a 400 here, before any
engine sees the call.

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
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any

from autellix_vllm.protocol import (
    CALL_ID,
    HEADER_TO_KEY,
    PROGRAM_ID,
    THREAD_ID,
    IdentityError,
    validate_id,
    validate_xargs,
    xargs_from_headers,
)
from autellix_vllm.router.errors import ApiError

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
RESPONSES_PATH = "/v1/responses"
GENERATION_PATHS = (CHAT_PATH, COMPLETIONS_PATH, RESPONSES_PATH)
SESSION_HEADER = "X-Session-ID"
_IDENTITY_HEADERS = tuple(HEADER_TO_KEY)
# Keys of chat messages and response input items that hold prompt text.
_TEXT_KEYS = ("content", "text", "tool_calls", "function", "arguments", "output")


@dataclass
class Call:
    path: str
    body: dict[str, Any]
    raw: bytes  # what is sent to the engine
    model: str
    stream: bool
    program_id: str | None
    thread_id: str | None
    call_id: str | None
    prompt_tokens: int
    # The router asked for stream usage the client did not: drop that chunk.
    usage_injected: bool = False


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ApiError(400, f"the body is not valid JSON: {error}", "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", "invalid_json")
    return body


def read_call(
    path: str,
    raw: bytes,
    headers: Mapping[str, str],
    models: Container[str],
    chars_per_token: float,
) -> Call:
    """Parse and check a generation call; raises :class:`ApiError` for bad input.

    ``headers`` must look names up case-insensitively (aiohttp's request headers do).
    """
    body = parse_json_object(raw)
    model = body.get("model")
    if model is None or model == "":
        raise ApiError(400, "you must provide a model parameter", "missing_model", "model")
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string", "invalid_type", "model")
    if model not in models:
        raise ApiError(404, f"the model {model!r} does not exist", "model_not_found", "model")
    program_id, thread_id, call_id = _identity(body, headers)
    call = Call(
        path=path,
        body=body,
        raw=raw,
        model=model,
        stream=body.get("stream") is True,
        program_id=program_id,
        thread_id=thread_id,
        call_id=call_id,
        prompt_tokens=estimate_prompt_tokens(path, body, chars_per_token),
    )
    if call.stream and path != RESPONSES_PATH:
        _ask_for_stream_usage(call)
    return call


def _identity(
    body: dict[str, Any], headers: Mapping[str, str]
) -> tuple[str | None, str | None, str | None]:
    try:
        present = [(name, headers[name]) for name in _IDENTITY_HEADERS if name in headers]
        from_headers = xargs_from_headers(present)
        body_xargs = body.get("vllm_xargs")
        if not isinstance(body_xargs, dict):
            body_xargs = {}  # not ours to judge: the engine rejects a malformed vllm_xargs
        elif body_xargs:
            validate_xargs(body_xargs)
        session_id = headers.get(SESSION_HEADER)
        if session_id is not None:
            session_id = validate_id(session_id.strip(), SESSION_HEADER)
        elif body.get("session_id") is not None:
            session_id = validate_id(body["session_id"], "session_id")
    except IdentityError as error:
        raise ApiError(400, str(error), "invalid_identity", error.param) from None

    def pick(key: str) -> str | None:
        value = from_headers.get(key, body_xargs.get(key))
        return value if isinstance(value, str) else None

    return pick(PROGRAM_ID) or session_id, pick(THREAD_ID), pick(CALL_ID)


def _ask_for_stream_usage(call: Call) -> None:
    """Streams report token usage only when asked; the router needs it for service."""
    options = call.body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return
    if options is not None and not isinstance(options, dict):
        return  # malformed: the engine answers with its own 400
    call.body["stream_options"] = {**(options or {}), "include_usage": True}
    call.raw = json.dumps(call.body).encode()
    call.usage_injected = True


def estimate_prompt_tokens(path: str, body: dict[str, Any], chars_per_token: float) -> int:
    chars = 0
    token_ids = 0
    if path == CHAT_PATH:
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
        chars += len(json.dumps(tools))
    return token_ids + math.ceil(chars / chars_per_token)


def _text_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(item) for item in value)
    if isinstance(value, dict):
        return sum(_text_chars(value.get(key)) for key in _TEXT_KEYS)
    return 0


def _token_ids(prompt: Any) -> int:
    """Tokens of a prompt given as token ids (one list, or a batch of lists); else 0."""
    if not isinstance(prompt, list) or not prompt:
        return 0
    if all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
        return sum(len(p) for p in prompt)
    return 0
