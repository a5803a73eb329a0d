"""What the router asks of its engines: a summary each health interval (its cost
does not grow with the engines' tables), and the waiting times of the programs a
listing shows, when it shows them."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web
from autellix_vllm.policy.config import PolicyConfig
from autellix_vllm.policy.core import ProgramScheduler
from autellix_vllm.policy.policies import PLAS
from router_http import PROGRAMS, fake_engine_app, request

MODEL = "fake-model"
WAIT = 7.0


@dataclass
class TableEngine:
    """Healthy, one model, an Autellix table that knows every program it is asked of."""

    url: str = ""
    table_gets: list[str] = field(default_factory=list)  # the query strings
    table_posts: list[list[str]] = field(default_factory=list)  # the ids asked for
    failing: bool = False


@contextlib.asynccontextmanager
async def table_engine() -> AsyncIterator[TableEngine]:
    engine = TableEngine()
    summary = {"enabled": True, "service_unit": "tokens", "waiting": 2, "running": 1}

    async def get_table(request: web.Request) -> web.Response:
        engine.table_gets.append(request.query_string)
        rows = [] if request.query.get("summary") == "1" else [{"program_id": "x"}] * 10_000
        return web.json_response({**summary, "programs": rows, "programs_count": 10_000})

    async def query_table(request: web.Request) -> web.Response:
        ids = (await request.json())["program_ids"]
        engine.table_posts.append(ids)
        if engine.failing:
            return web.json_response({"error": {}}, status=500)
        rows = [{"program_id": i, "waiting_time": WAIT} for i in ids]
        return web.json_response({**summary, "programs": rows, "programs_count": 10_000})

    app = web.Application()
    app.router.add_get("/autellix/v1/engine/table", get_table)
    app.router.add_post("/autellix/v1/engine/table", query_table)
    async with fake_engine_app(app, MODEL) as engine.url:
        yield engine


async def test_each_probe_fetches_a_summary_and_a_listing_asks_only_for_its_page(start_router):
    async with (
        table_engine() as first,
        table_engine() as second,
        start_router([first.url, second.url], health_interval_s=0.02) as router,
    ):
        await asyncio.sleep(0.2)  # several health intervals
        assert len(first.table_gets) >= 3
        assert set(first.table_gets) == set(second.table_gets) == {"summary=1"}
        assert first.table_posts == []  # nothing asks for program rows until a listing
        status, engines = await request("GET", router.url + "/autellix/v1/engines")
        assert [e["waiting"] for e in engines["engines"]] == [2, 2]  # the load signal still works

        opened = []
        for name in ("a", "b", "c"):
            status, body = await request("POST", router.url + PROGRAMS, json={"name": name})
            opened.append(body["program_id"])
        status, page = await request("GET", router.url + PROGRAMS + "?limit=2")
        assert status == 200 and [p["program_id"] for p in page["programs"]] == opened[:2]
        assert [p["waiting_time"] for p in page["programs"]] == [2 * WAIT, 2 * WAIT]  # summed
        assert first.table_posts == second.table_posts == [opened[:2]]  # the page, only

        # An engine that cannot answer counts nothing; the listing still answers.
        second.failing = True
        status, page = await request("GET", router.url + PROGRAMS + "?limit=1")
        assert status == 200 and page["programs"][0]["waiting_time"] == WAIT

        # Ending a program asks for its waiting time, for its final row.
        second.failing = False
        status, _ = await request("DELETE", f"{router.url}{PROGRAMS}/{opened[2]}")
        assert status == 200 and first.table_posts[-1] == [opened[2]]
        status, ended = await request("GET", router.url + PROGRAMS + "?ended=1")
        assert ended["programs"][0]["waiting_time"] == 2 * WAIT


def test_the_engine_snapshot_has_the_rows_asked_for_and_always_the_count():
    core = ProgramScheduler(PLAS(), PolicyConfig())
    for i in range(5):
        core.table.open(f"p{i}", now_s=0.0)
    full = core.snapshot(1.0)
    assert [p["program_id"] for p in full["programs"]] == [f"p{i}" for i in range(5)]
    summary = core.snapshot(1.0, [])
    assert summary["programs"] == [] and summary["programs_count"] == 5
    assert {k: v for k, v in summary.items() if k != "programs"} == {
        k: v for k, v in full.items() if k != "programs"
    }
    asked = core.snapshot(1.0, ["p3", "nobody", "p1"])
    assert [p["program_id"] for p in asked["programs"]] == ["p3", "p1"]
    assert json.dumps(asked)  # plain data
