"""Reading one OpenAI call: its JSON body, model, program identity and prompt size.

Identity is read exactly as the engines read it
(:func:`autellix_vllm.protocol.read_identity`): the ``X-Autellix-*`` headers,
else the body's ``vllm_xargs`` keys; the program id falls back to the session
id. A malformed value is a 400 here, before any engine sees the call.

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
    CHAT_COMPLETIONS_PATH,
    COMPLETIONS_PATH,
    RESPONSES_PATH,
    SESSION_ID_FIELD,
    XARGS_FIELD,
    CallIdentity,
    IdentityError,
    read_identity,
)
from autellix_vllm.router.errors import ApiError

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
    """Parse and check a generation call; raises :class:`ApiError` for bad input."""
    body = parse_json_object(raw)
    model = body.get("model")
    if model is None or model == "":
        raise ApiError(400, "you must provide a model parameter", "missing_model", "model")
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string", "invalid_type", "model")
    if model not in models:
        raise ApiError(404, f"the model {model!r} does not exist", "model_not_found", "model")
    identity = _identity(body, headers)
    call = Call(
        path=path,
        body=body,
        raw=raw,
        model=model,
        stream=body.get("stream") is True,
        program_id=identity.program_id,
        thread_id=identity.thread_id,
        call_id=identity.call_id,
        prompt_tokens=estimate_prompt_tokens(path, body, chars_per_token),
    )
    if call.stream and path != RESPONSES_PATH:
        _ask_for_stream_usage(call)
    return call


def _identity(body: dict[str, Any], headers: Mapping[str, str]) -> CallIdentity:
    try:
        return read_identity(headers.items(), body.get(XARGS_FIELD), body.get(SESSION_ID_FIELD))
    except IdentityError as error:
        raise ApiError(400, str(error), error.code, error.param) from None


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
