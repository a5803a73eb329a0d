"""A minimal OpenAI-compatible upstream, ONLY for measuring the router alone.

It answers every call at once with a fixed completion, so a benchmark through
the router measures the router's own cost and nothing of an engine. It is not
used to test behaviour: those tests run against real vLLM engines.

    python -m autellix_vllm.bench.fake_upstream --port 0    # prints "PORT <n>"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from aiohttp import web

MODEL = "fake-model"

_COMPLETION = json.dumps(
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
    return web.Response(body=_COMPLETION, content_type="application/json")


async def _models(request: web.Request) -> web.Response:
    return web.Response(body=_MODELS, content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    return web.Response()


def create_fake_upstream() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _complete)
    app.router.add_post("/v1/completions", _complete)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
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
