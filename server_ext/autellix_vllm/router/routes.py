"""The router's HTTP routes.

OpenAI-compatible (proxied to an engine): ``POST /v1/chat/completions``,
``/v1/completions``, ``/v1/responses``; ``GET /v1/models`` (the models of the
healthy engines).

Autellix: ``POST /autellix/v1/programs`` (open a program, optional ``name``),
``DELETE /autellix/v1/programs/{id}`` (end it, here and on its engines),
``GET /autellix/v1/programs/{id}/timeline`` (its calls' parts and its own
time, for its owner),
``GET /autellix/v1/programs?limit=N&after=C`` (the global process table, one
page at a time, oldest first: the caller's programs, or every program for the
admin key; each row with its program's ``class``; ``keys``: the accounts of
the keys the caller may see, each with its class, weight, service and share;
with ``ended=1``, the final rows of the programs ended last, newest first, no
further pages), ``GET /autellix/v1/engines`` (engines, health and load).

Operations: ``GET /metrics`` (Prometheus), ``GET /health`` (200 while an
engine is in rotation, else 503).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from autellix_vllm.protocol.identity import IdentityError, validate_id
from autellix_vllm.protocol.paths import (
    ENGINE_PROGRAM_PATH,
    ENGINES_PATH,
    GENERATION_PATHS,
    PROGRAM_PATH,
    PROGRAM_TIMELINE_PATH,
    PROGRAMS_PATH,
)
from autellix_vllm.router.calls import parse_json_object, read_call
from autellix_vllm.router.errors import ApiError
from autellix_vllm.router.keys import Client
from autellix_vllm.router.middlewares import caller
from autellix_vllm.router.params import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    Default,
    program_name,
    query_int,
)
from autellix_vllm.router.state import STATE, RouterState

END_ON_ENGINE_TIMEOUT_S = 5.0


def add_routes(app: web.Application) -> None:
    for path in GENERATION_PATHS:
        app.router.add_post(path, generate)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post(PROGRAMS_PATH, open_program)
    app.router.add_get(PROGRAMS_PATH, list_programs)
    app.router.add_delete(PROGRAM_PATH, end_program)
    app.router.add_get(PROGRAM_TIMELINE_PATH, program_timeline)
    app.router.add_get(ENGINES_PATH, list_engines)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)


async def generate(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    state = request.app[STATE]
    if not state.pool.healthy():
        raise ApiError(503, "no engine is healthy", "no_healthy_engine")
    raw = await request.read()  # over the size limit: aiohttp raises 413
    call = read_call(
        request.path,
        raw,
        request.headers,
        state.pool.models(),
        state.config.chars_per_token,
    )
    client = caller(request)
    response = await state.dispatcher.handle(request, call, started, client)
    band = client.band_for(call.identity.priority)  # the band admission stated
    state.metrics.answered(client.name, band, time.perf_counter() - started)
    return response


async def list_models(request: web.Request) -> web.Response:
    models = request.app[STATE].pool.models()
    return web.json_response({"object": "list", "data": list(models.values())})


async def open_program(request: web.Request) -> web.Response:
    raw = await request.read()
    body = parse_json_object(raw) if raw.strip() else {}
    name = program_name(body.get("name"))
    record = request.app[STATE].programs.issue(name, caller(request))
    return web.json_response(
        {"program_id": record.program_id, "name": record.name, "created": record.created_s}
    )


def program_id_in_path(request: web.Request) -> str:
    """The ``{program_id}`` of the request's path; a 400 if it is not a valid id."""
    program_id = request.match_info["program_id"]
    try:
        return validate_id(program_id, "program_id")
    except IdentityError as error:
        raise ApiError(400, str(error), error.code, error.param) from None


async def end_program(request: web.Request) -> web.Response:
    state = request.app[STATE]
    program_id = program_id_in_path(request)
    await end_everywhere(state, program_id, caller(request))
    return web.json_response({"program_id": program_id, "ended": True})


async def program_timeline(request: web.Request) -> web.Response:
    """Where the time of the program's calls went, and its own time between them
    (``router.timeline``); 404 for a program the caller may not see."""
    program_id = program_id_in_path(request)
    return web.json_response(request.app[STATE].programs.timeline(program_id, caller(request)))


async def end_everywhere(
    state: RouterState, program_id: str, by: Client, if_idle: bool = False
) -> bool:
    """End ``program_id`` for ``by``: in the table (which may refuse) and on its
    engines. With ``if_idle``, only if no call of it is in flight once its
    engines have reported its waits; False if it was not ended for that."""
    waits = await state.pool.program_waits([program_id])  # for its final row
    if if_idle and (record := state.programs.get(program_id)) is not None and record.busy:
        return False
    record = state.programs.end(program_id, by, waits.get(program_id, 0.0))
    engines = [state.pool.by_name[name] for name in record.calls_per_engine]
    await asyncio.gather(*(_end_on_engine(state, e.url, program_id) for e in engines))
    return True


async def end_idle_derived_forever(state: RouterState, interval_s: float) -> None:
    """Every ``interval_s``, end the derived programs idle for ``derived_idle_end_s``
    (their clients never end them; ``router.derived``)."""
    deriver = state.dispatcher.deriver
    assert deriver is not None
    while True:
        await asyncio.sleep(interval_s)
        for program_id in deriver.idle(state.programs.clock()):
            record = state.programs.get(program_id)
            if record is None:
                continue
            owner = Client(owner=record.owner, name=record.owner_name)
            try:
                ended = await end_everywhere(state, program_id, owner, if_idle=True)
            except ApiError:  # ended or dropped meanwhile
                continue
            if not ended:
                deriver.watch(record)  # a call came meanwhile: idle again later


async def _end_on_engine(state: RouterState, url: str, program_id: str) -> None:
    """Best effort: an engine that is down or never kept the program is fine."""
    timeout = aiohttp.ClientTimeout(total=END_ON_ENGINE_TIMEOUT_S)
    path = ENGINE_PROGRAM_PATH.format(program_id=quote(program_id, safe=""))
    try:
        async with state.session.delete(url + path, timeout=timeout) as answer:
            await answer.read()
    except (TimeoutError, aiohttp.ClientError):
        pass


async def list_programs(request: web.Request) -> web.Response:
    """One page of the caller's programs, oldest first. ``next_after`` (null on
    the last page) is the ``after`` that asks for the next one. With ``ended=1``:
    the newest ``limit`` final rows of the caller's ended programs, in one page."""
    state = request.app[STATE]
    limit = _query_int(request, "limit", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    after = _query_int(request, "after", None, 0, None)
    next_after: int | None = None
    if _query_int(request, "ended", 0, 0, 1):
        rows, total = state.programs.ended_rows(caller(request), limit)
        has_more = len(rows) < total
    else:
        page = state.programs.page(caller(request), after, limit)
        waits = await state.pool.program_waits([r.program_id for r in page.records])
        rows = [state.programs.row(r, waits.get(r.program_id, 0.0)) for r in page.records]
        total, next_after = page.total, page.next_after
        has_more = next_after is not None
    return web.json_response(
        {
            "programs": rows,
            "total": total,
            "has_more": has_more,
            "next_after": None if next_after is None else str(next_after),
            "keys": state.programs.key_rows(caller(request)),
            "engines": [engine.describe() for engine in state.pool.engines],
            "balancer": state.config.balancer,
            "locality_threshold": state.config.locality_threshold,
        }
    )


def _query_int(
    request: web.Request, name: str, default: Default, low: int, high: int | None
) -> int | Default:
    return query_int(request.query.get(name), name, default, low, high)


async def list_engines(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"engines": [engine.describe() for engine in state.pool.engines]})


async def metrics(request: web.Request) -> web.Response:
    router_metrics = request.app[STATE].metrics
    return web.Response(
        body=router_metrics.render(), headers={"Content-Type": router_metrics.content_type}
    )


async def health(request: web.Request) -> web.Response:
    healthy = request.app[STATE].pool.healthy()
    body: dict[str, Any] = {"healthy_engines": [e.name for e in healthy]}
    return web.json_response(body, status=200 if healthy else 503)
