"""A small OpenAI-compatible server with the autellix program API, for SDK tests.

It runs a real aiohttp server on 127.0.0.1 in a background thread (so blocking
clients work too) and records every request it receives. Switches inject the
failures the SDK must survive: error statuses, connection resets, a server
without the program API (404), and a program end that never answers.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Received:
    """One request as the server saw it; header names are lower case."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def vllm_xargs(self) -> dict[str, Any] | None:
        return self.body.get("vllm_xargs") if isinstance(self.body, dict) else None

    @property
    def program_id(self) -> str | None:
        return self.header("X-Autellix-Program-Id")

    @property
    def thread_id(self) -> str | None:
        return self.header("X-Autellix-Thread-Id")

    @property
    def parent_thread_id(self) -> str | None:
        """None for a main thread, whose calls send the header empty."""
        return self.header("X-Autellix-Parent-Thread-Id") or None

    @property
    def call_id(self) -> str | None:
        return self.header("X-Autellix-Call-Id")

    @property
    def tag(self) -> str | None:
        """The test's own label for a call (header `X-Test-Tag`)."""
        return self.header("X-Test-Tag")


@dataclass
class Failure:
    """What the next generation requests get instead of an answer."""

    status: int | None  # None: reset the connection
    retry_after: str | None = None


@dataclass
class FakeServerState:
    received: list[Received] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    programs_api: bool = True
    hang_program_end: bool = False
    opened_programs: list[str] = field(default_factory=list)
    ended_programs: list[str] = field(default_factory=list)


class FakeOpenAIServer:
    """The server, its switches and its record of requests."""

    def __init__(self) -> None:
        self.state = FakeServerState()
        self._program_numbers = count(1)
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---- lifecycle -------------------------------------------------------

    def start(self, port: int = 0) -> FakeOpenAIServer:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(port, ready), name="fake-openai", daemon=True
        )
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        """Stop answering; later connections are refused."""
        if self._runner is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    # ---- switches --------------------------------------------------------

    def fail_next(self, status: int, times: int = 1, retry_after: str | None = None) -> None:
        """Answer the next `times` generation requests with `status`."""
        self.state.failures.extend(Failure(status, retry_after) for _ in range(times))

    def reset_next(self, times: int = 1) -> None:
        """Drop the connection of the next `times` generation requests without answering."""
        self.state.failures.extend(Failure(None) for _ in range(times))

    # ---- what was received -----------------------------------------------

    @property
    def received(self) -> list[Received]:
        return list(self.state.received)

    def generation_calls(self) -> list[Received]:
        return [r for r in self.state.received if r.path.startswith("/v1/")]

    def program_calls(self) -> list[Received]:
        return [r for r in self.state.received if r.path.startswith("/autellix/")]

    def call_tagged(self, tag: str) -> Received:
        """The one generation call made with `X-Test-Tag: tag`."""
        [call] = [r for r in self.generation_calls() if r.tag == tag]
        return call

    # ---- the server ------------------------------------------------------

    def _serve(self, port: int, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start_site(port))
        ready.set()
        self._loop.run_forever()

    async def _start_site(self, port: int) -> None:
        app = web.Application(middlewares=[self._record])
        app.router.add_post("/v1/chat/completions", self._generation(chat_completion))
        app.router.add_post("/v1/completions", self._generation(text_completion))
        app.router.add_post("/v1/responses", self._generation(response_object))
        app.router.add_post("/autellix/v1/programs", self._open_program)
        app.router.add_delete("/autellix/v1/programs/{program_id}", self._end_program)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    @web.middleware
    async def _record(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        headers = {name.lower(): value for name, value in request.headers.items()}
        self.state.received.append(Received(request.method, request.path, headers, body))
        return await handler(request)

    def _generation(self, answer: Callable[[dict[str, Any]], Any]) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            if self.state.failures:
                return await self._fail(request, self.state.failures.pop(0))
            body = await request.json()
            if body.get("stream"):
                return await stream_events(request, answer(body))
            return web.json_response(answer(body))

        return handle

    async def _fail(self, request: web.Request, failure: Failure) -> web.StreamResponse:
        if failure.status is None:
            assert request.transport is not None
            request.transport.abort()
            return web.Response()  # never sent: the connection is gone
        headers = {"Retry-After": failure.retry_after} if failure.retry_after else None
        error = {"error": {"message": "injected failure", "code": failure.status}}
        return web.json_response(error, status=failure.status, headers=headers)

    async def _open_program(self, request: web.Request) -> web.Response:
        if not self.state.programs_api:
            raise web.HTTPNotFound()
        program_id = f"prog-{next(self._program_numbers)}"
        self.state.opened_programs.append(program_id)
        return web.json_response({"program_id": program_id})

    async def _end_program(self, request: web.Request) -> web.Response:
        if not self.state.programs_api:
            raise web.HTTPNotFound()
        if self.state.hang_program_end:
            await asyncio.sleep(3600)
        program_id = request.match_info["program_id"]
        self.state.ended_programs.append(program_id)
        return web.json_response({"program_id": program_id, "ended": True})


# ---- answers -------------------------------------------------------------


def chat_completion(body: dict[str, Any]) -> dict[str, Any]:
    if body.get("stream"):
        return [
            {"type": None, "data": _chat_chunk(body, {"role": "assistant", "content": "ok"}, None)},
            {"type": None, "data": _chat_chunk(body, {}, "stop")},
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", "fake"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _chat_chunk(body: dict[str, Any], delta: dict[str, Any], finish: str | None) -> dict:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": body.get("model", "fake"),
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def text_completion(body: dict[str, Any]) -> Any:
    answer = {
        "id": "cmpl-fake",
        "object": "text_completion",
        "created": 0,
        "model": body.get("model", "fake"),
        "choices": [{"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}],
    }
    return [{"type": None, "data": answer}] if body.get("stream") else answer


def response_object(body: dict[str, Any]) -> Any:
    answer = {
        "id": "resp_fake",
        "object": "response",
        "created_at": 0,
        "model": body.get("model", "fake"),
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_fake",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            }
        ],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }
    if not body.get("stream"):
        return answer
    completed = {"type": "response.completed", "sequence_number": 0, "response": answer}
    return [{"type": "response.completed", "data": completed}]


async def stream_events(request: web.Request, events: list[dict[str, Any]]) -> web.StreamResponse:
    """Send `events` as server-sent events, then `data: [DONE]`."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        prefix = f"event: {event['type']}\n" if event["type"] else ""
        await response.write(f"{prefix}data: {json.dumps(event['data'])}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
