"""A plain OpenAI-compatible chat server whose replies the test writes.

It has ``GET /v1/models`` and ``POST /v1/chat/completions`` and nothing else: no
autellix program API and no process table (both answer 404), like any other
OpenAI-compatible server. ``reply(body)`` gets each chat request's JSON body and
returns the reply's text, or ``(text, finish_reason)``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from local_http import serving

MODEL = "scripted"
Reply = Callable[[dict[str, Any]], str | tuple[str, str]]


@dataclass
class ScriptedServer:
    base_url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    identities: list[dict[str, str]] = field(default_factory=list)
    """Per request, its `X-Autellix-*` headers by lower-case name without the prefix."""

    def prompts(self) -> list[str]:
        return ["\n".join(m["content"] for m in body["messages"]) for body in self.requests]


@contextlib.asynccontextmanager
async def scripted_server(reply: Reply) -> AsyncIterator[ScriptedServer]:
    server = ScriptedServer("")

    async def models(request: web.Request) -> web.Response:
        model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "tests"}
        return web.json_response({"object": "list", "data": [model]})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        server.requests.append(body)
        server.identities.append(
            {
                name.lower().removeprefix("x-autellix-"): value
                for name, value in request.headers.items()
                if name.lower().startswith("x-autellix-")
            }
        )
        answer = reply(body)
        text, finish = answer if isinstance(answer, tuple) else (answer, "stop")
        return web.json_response(
            {
                "id": f"chat-{len(server.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": finish,
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    async with serving(web.AppRunner(app, access_log=None)) as url:
        server.base_url = f"{url}/v1"
        yield server


def schema_of(body: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema a request asks its reply to follow."""
    return body["response_format"]["json_schema"]["schema"]


def schema_name(body: dict[str, Any]) -> str:
    return body["response_format"]["json_schema"]["name"]


def as_json(value: Any) -> str:
    return json.dumps(value)
