"""The endpoint vLLM plugin (``vllm.endpoint_plugins`` entry point ``autellix_endpoint``).

Loaded only in the API-server process, and only when ``VLLM_PLUGINS`` names it
(together with ``autellix_general``, which installs the engine-side methods it
calls; see :mod:`autellix_vllm.engine.general_plugin`). Routes:

* ``GET /autellix/v1/engine/table``: the process table (programs, threads,
  calls, service, waiting time, level, queue depth per level, counters).
  ``?summary=1``: the same without the programs' rows (``programs_count``
  says how many there are), at a cost that does not grow with the table: what
  the router polls every health interval.
* ``POST /autellix/v1/engine/table`` with ``{"program_ids": [...]}`` (at most
  ``ENGINE_TABLE_MAX_IDS``, 1000): the table with only those programs' rows
  (unknown ids are left out): how the router reads one page's waiting times.
* ``DELETE /autellix/v1/engine/programs/{program_id}``: end a program
  (404 if the engine does not know it).

On an engine with a key (:func:`~autellix_vllm.engine.settings.engine_key`)
both answer 401 to a caller without ``Authorization: Bearer <key>``.

It also puts the table's counters and the engine's holds on vLLM's Prometheus
``/metrics`` as ``autellix_*`` series (:mod:`autellix_vllm.engine.metrics`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from argparse import Namespace
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from autellix_vllm.engine import _vllm_adapter as adapter
from autellix_vllm.engine.general_plugin import END_PROGRAM_METHOD, TABLE_METHOD
from autellix_vllm.engine.metrics import register_metrics
from autellix_vllm.engine.settings import engine_key
from autellix_vllm.protocol.bearer import INVALID_KEY_CODE, holds_key
from autellix_vllm.protocol.identity import IdentityError, validate_id
from autellix_vllm.protocol.openai_errors import error_answer
from autellix_vllm.protocol.paths import (
    ENGINE_PROGRAM_PATH,
    ENGINE_TABLE_MAX_IDS,
    ENGINE_TABLE_PATH,
)

logger = logging.getLogger(__name__)

REFRESH_INTERVAL_S = 1.0
# Error code of a server started without an engine client.
NO_ENGINE = "no_engine"
# Error code of a malformed query (as the router's for its own queries).
INVALID_PARAMETER = "invalid_parameter"


def error_response(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    answer = error_answer(status, message, code, param)
    return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)


class TableCache:
    """The latest table snapshot, for the synchronous Prometheus collector."""

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] = {}

    async def refresh(
        self, engine_client: Any, program_ids: list[str] | None = None
    ) -> dict[str, Any]:
        """The table (with only ``program_ids``' rows, if given), kept for the collector
        (which reads its counters, the same in every form)."""
        self.snapshot = await adapter.call_engine_utility(engine_client, TABLE_METHOD, program_ids)
        return self.snapshot

    async def refresh_forever(self, engine_client: Any) -> None:
        while True:
            try:
                await self.refresh(engine_client, [])  # the summary: counters, no rows
            except asyncio.CancelledError:
                raise
            except Exception:  # the engine may be starting or gone; try again later
                logger.debug("autellix table refresh failed", exc_info=True)
            await asyncio.sleep(REFRESH_INTERVAL_S)


_cache = TableCache()


def build_router(key: str | None = None) -> APIRouter:
    """The routes; with ``key``, only callers sending ``Authorization: Bearer <key>``
    reach them."""
    router = APIRouter()

    def refused(request: Request) -> JSONResponse | None:
        if key is None or holds_key(request.headers.get("authorization"), key):
            return None
        return error_response(
            401, "the engine key is needed: Authorization: Bearer <key>", INVALID_KEY_CODE
        )

    @router.get(ENGINE_TABLE_PATH)
    async def get_table(request: Request) -> JSONResponse:
        if (refusal := refused(request)) is not None:
            return refusal
        summary = request.query_params.get("summary", "0")
        if summary not in ("0", "1"):
            return error_response(400, "summary must be 0 or 1", INVALID_PARAMETER, "summary")
        return await table_answer(request, [] if summary == "1" else None)

    @router.post(ENGINE_TABLE_PATH)
    async def query_table(request: Request) -> JSONResponse:
        if (refusal := refused(request)) is not None:
            return refusal
        try:
            program_ids = read_program_ids(await request.body())
        except IdentityError as exc:
            return error_response(400, str(exc), INVALID_PARAMETER, exc.param)
        return await table_answer(request, program_ids)

    @router.delete(ENGINE_PROGRAM_PATH)
    async def end_program(program_id: str, request: Request) -> JSONResponse:
        if (refusal := refused(request)) is not None:
            return refusal
        try:
            validate_id(program_id, "program_id")
        except IdentityError as exc:
            return error_response(400, str(exc), exc.code, exc.param)
        engine_client = getattr(request.app.state, "autellix_engine_client", None)
        if engine_client is None:
            return error_response(503, "no engine behind this server", NO_ENGINE)
        ended = await adapter.call_engine_utility(engine_client, END_PROGRAM_METHOD, program_id)
        if not ended:
            return error_response(
                404, f"no program {program_id!r} in the table", "program_not_found", "program_id"
            )
        return JSONResponse({"program_id": program_id, "ended": True})

    return router


async def table_answer(request: Request, program_ids: list[str] | None) -> JSONResponse:
    engine_client = getattr(request.app.state, "autellix_engine_client", None)
    if engine_client is None:
        return error_response(503, "no engine behind this server", NO_ENGINE)
    return JSONResponse(await _cache.refresh(engine_client, program_ids))


def read_program_ids(body: bytes) -> list[str]:
    """The ``program_ids`` of a table query's body; :class:`IdentityError` if malformed."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        payload = None
    ids = payload.get("program_ids") if isinstance(payload, dict) else None
    if not isinstance(ids, list) or len(ids) > ENGINE_TABLE_MAX_IDS:
        raise IdentityError(
            f'the body must be {{"program_ids": [...]}}, at most {ENGINE_TABLE_MAX_IDS} ids',
            "program_ids",
        )
    return [validate_id(program_id, "program_ids") for program_id in ids]


class AutellixEndpointPlugin:
    """Factory target of the entry point; vLLM instantiates it with no arguments."""

    name = "autellix_endpoint"
    required_tasks = ("generate",)

    def __init__(self) -> None:
        self._refresher: asyncio.Task[None] | None = None

    def attach_router(self, app: FastAPI) -> None:
        app.include_router(build_router(engine_key(os.environ)))

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        state.autellix_engine_client = engine_client
        if engine_client is None:
            return
        register_metrics(lambda: _cache.snapshot)
        if self._refresher is None:
            self._refresher = asyncio.get_running_loop().create_task(
                _cache.refresh_forever(engine_client), name="autellix-table-refresh"
            )
