"""A minimal OpenAI-compatible upstream, ONLY for measuring the router or the SDK alone.

It answers every call at once with a fixed completion (and opens and ends
programs as the router's program API does), so a benchmark through it
measures the router's or the client's own cost and nothing of an engine. It
is not used to test behaviour: those tests run against real vLLM engines.

    python -m autellix_vllm.bench.fake_upstream --port 0    # prints "PORT <n>"
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys

from aiohttp import web

from autellix_vllm.protocol.paths import (
    CHAT_COMPLETIONS_PATH,
    COMPLETIONS_PATH,
    PROGRAM_PATH,
    PROGRAMS_PATH,
)

MODEL = "fake-model"

COMPLETION_BODY = json.dumps(
    {
        "id": "cmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
    }
).encode()
_MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()


async def _complete(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=COMPLETION_BODY, content_type="application/json")


async def _models(request: web.Request) -> web.Response:
    return web.Response(body=_MODELS, content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    return web.Response()


_program_numbers = itertools.count(1)


async def _open_program(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"program_id": f"prog-{next(_program_numbers)}"})


async def _end_program(request: web.Request) -> web.Response:
    return web.json_response({"program_id": request.match_info["program_id"], "ended": True})


def create_fake_upstream() -> web.Application:
    app = web.Application()
    app.router.add_post(CHAT_COMPLETIONS_PATH, _complete)
    app.router.add_post(COMPLETIONS_PATH, _complete)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_post(PROGRAMS_PATH, _open_program)
    app.router.add_delete(PROGRAM_PATH, _end_program)
    return app


async def _serve(port: int) -> None:
    runner = web.AppRunner(create_fake_upstream(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        try:
            runner.run(_serve(args.port))
        except KeyboardInterrupt:
            sys.exit(0)


if __name__ == "__main__":
    main()
