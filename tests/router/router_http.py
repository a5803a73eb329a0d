"""HTTP helpers the router's tests share: one request, an OpenAI error check, table rows."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web
from local_http import serving

PROGRAMS = "/autellix/v1/programs"


@contextlib.asynccontextmanager
async def fake_engine_app(app: web.Application, model: str) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 and a free port, with what the router probes
    (``/health``, ``/v1/models`` listing ``model``, ending a program); yields its URL."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    app.router.add_get("/health", ok)
    app.router.add_get("/v1/models", models)
    app.router.add_delete("/autellix/v1/engine/programs/{program_id}", ok)
    async with serving(web.AppRunner(app, access_log=None)) as url:
        yield url


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def request(method: str, url: str, **kwargs) -> tuple[int, object]:
    """(status, body as JSON, or as text when it is not JSON)."""
    async with aiohttp.ClientSession() as http, http.request(method, url, **kwargs) as answer:
        text = await answer.text()
        try:
            return answer.status, json.loads(text)
        except json.JSONDecodeError:
            return answer.status, text


async def engine_request(engine, method: str, path: str, **kwargs) -> tuple[int, object]:
    """A request straight to an engine of tests/conftest.py, with its key if it has one."""
    key = engine.config.api_key
    headers = {**kwargs.pop("headers", {}), **({"Authorization": f"Bearer {key}"} if key else {})}
    return await request(method, engine.base_url + path, headers=headers, **kwargs)


async def engine_table(engine) -> dict:
    status, table = await engine_request(engine, "GET", "/autellix/v1/engine/table")
    assert status == 200, table
    return table


def completion(model: str, prompt: str = "hello", max_tokens: int = 4, **extra) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            **extra}  # fmt: skip


def program_row(table: dict, program_id: str) -> dict | None:
    return next((p for p in table["programs"] if p["program_id"] == program_id), None)


def assert_openai_error(status: int, body: object, expected_status: int, code: str) -> None:
    assert status == expected_status, body
    assert isinstance(body, dict) and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code, body


def keys_file_with(folder: Path, text: str) -> str:
    """A keys file in ``folder`` holding ``text``: what ``api_keys_file`` takes."""
    path = folder / "keys"
    path.write_text(text)
    return str(path)


async def held_gauge(url: str, key: str) -> dict[str, float]:
    """The router at ``url``'s calls held at its flow-control gate, by class
    (``autellix_router_calls_held``), read from its /metrics with ``key``."""
    headers = {"Authorization": f"Bearer {key}"}
    status, metrics = await request("GET", url + "/metrics", headers=headers)
    assert status == 200 and isinstance(metrics, str), metrics
    pattern = r'^autellix_router_calls_held\{class="(\w+)"\} (\S+)$'
    return {name: float(value) for name, value in re.findall(pattern, metrics, re.M)}
