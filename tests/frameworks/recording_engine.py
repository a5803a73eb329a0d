"""An engine stand-in for the framework tests: it records every call the router
sends it and answers by a script, with text or with tool calls.

It serves what the router asks of an engine (``tests/router/router_http.py``'s
``fake_engine_app``: health, models, ending a program) plus the two generation
APIs the frameworks use, ``/v1/chat/completions`` and ``/v1/responses`` (not
streamed: the frameworks' plain runs do not stream). The script sees each call
and returns the reply: a string is the assistant's text, a list of
:class:`ToolCall` asks the framework to run those tools (in one turn, so a
framework that runs tool calls concurrently does so); a script that raises
:class:`EngineFailure` makes the call fail with a 500.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from router_http import fake_engine_app

MODEL = "recorded-model"
USAGE = {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class Recorded:
    """One generation call as the engine received it."""

    path: str
    body: dict[str, Any]
    identity: dict[str, str]
    """Its ``X-Autellix-*`` headers by lower-case name without the prefix
    (``program-id``, ``thread-id``, ``parent-thread-id``, ...)."""

    @property
    def thread(self) -> str:
        return self.identity.get("thread-id", "")

    @property
    def parent(self) -> str:
        return self.identity.get("parent-thread-id", "")

    @property
    def has_tool_results(self) -> bool:
        """Whether the prompt holds the output of a tool call (the model asked for one)."""
        items = self.body.get("messages") or self.body.get("input") or []
        return isinstance(items, list) and any(
            isinstance(item, dict)
            and (item.get("role") == "tool" or item.get("type") == "function_call_output")
            for item in items
        )

    def text(self) -> str:
        """The call's prompt as one string: messages (chat) or input items (responses)."""
        items = self.body.get("messages") or self.body.get("input") or []
        if isinstance(items, str):
            return items
        return "\n".join(_item_text(item) for item in items)


Reply = str | list[ToolCall]
Script = Callable[[Recorded], Reply]


class EngineFailure(Exception):
    """Raised by a script: the engine answers the call with a 500."""


@dataclass
class RecordingEngine:
    url: str = ""
    calls: list[Recorded] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    """Program ids the router ended on this engine, in order."""


@contextlib.asynccontextmanager
async def recording_engine(script: Script) -> AsyncIterator[RecordingEngine]:
    engine = RecordingEngine()
    ids = itertools.count(1)

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        call = Recorded(request.path, body, _identity(request))
        engine.calls.append(call)
        try:
            reply = script(call)
        except EngineFailure as error:
            return web.json_response({"error": {"message": str(error)}}, status=500)
        number = next(ids)
        if request.path == "/v1/responses":
            return web.json_response(_response(reply, number, body))
        return web.json_response(_chat_completion(reply, number))

    @web.middleware
    async def note_ends(request: web.Request, handler):
        if request.method == "DELETE":
            engine.ended.append(request.match_info.get("program_id", ""))
        return await handler(request)

    app = web.Application(middlewares=[note_ends])
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/v1/responses", generate)
    async with fake_engine_app(app, MODEL) as engine.url:
        yield engine


def _identity(request: web.Request) -> dict[str, str]:
    return {
        name.lower().removeprefix("x-autellix-"): value
        for name, value in request.headers.items()
        if name.lower().startswith("x-autellix-")
    }


def _item_text(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    content = item.get("content") or item.get("output") or item.get("arguments") or ""
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def _chat_completion(reply: Reply, number: int) -> dict[str, Any]:
    if isinstance(reply, str):
        message: dict[str, Any] = {"role": "assistant", "content": reply}
        finish = "stop"
    else:
        calls = [
            {
                "id": f"call-{number}-{index}",
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for index, call in enumerate(reply)
        ]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        finish = "tool_calls"
    return {
        "id": f"chat-{number}",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": USAGE,
    }


def _response(reply: Reply, number: int, body: dict[str, Any]) -> dict[str, Any]:
    if isinstance(reply, str):
        text = {"type": "output_text", "text": reply, "annotations": []}
        output: list[dict[str, Any]] = [
            {
                "type": "message",
                "id": f"msg-{number}",
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
        ]
    else:
        output = [
            {
                "type": "function_call",
                "id": f"fc-{number}-{index}",
                "call_id": f"call-{number}-{index}",
                "name": call.name,
                "arguments": json.dumps(call.arguments),
                "status": "completed",
            }
            for index, call in enumerate(reply)
        ]
    return {
        "id": f"resp-{number}",
        "object": "response",
        "created_at": 0,
        "model": MODEL,
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "usage": {
            "input_tokens": 8,
            "output_tokens": 2,
            "total_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
