"""``autellix ps --all`` and ``top`` against a router (no engine): the router keeps
the final rows of the programs each key ended, a bounded few per key; ``top``
keeps going while the router is away; ``ps`` names the mistake in a wrong key,
an engine's URL, or a URL without a scheme."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from aiohttp import web
from autellix_vllm.cli import main
from autellix_vllm.cli import ps as ps_cli
from autellix_vllm.policy.config import TableBounds
from autellix_vllm.router import admin_client
from autellix_vllm.router.keys import ANONYMOUS, Client
from autellix_vllm.router.programs import ProgramTable
from local_http import serving
from router_http import request

DEAD_ENGINE = "http://127.0.0.1:9"  # nothing listens: the program API needs no engine


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_the_table_keeps_the_last_ended_rows_per_owner_newest_first():
    now = [100.0]
    table = ProgramTable(
        TableBounds(idle_ttl_s=600.0, ended_ids_kept=10), clock=lambda: now[0], ended_rows_kept=2
    )
    alice, bob = Client("alice", "alice"), Client("bob", "bob")
    admin = Client("root", "root", admin=True)
    for number, owner in enumerate((alice, alice, bob, alice)):
        record = table.issue(f"p{number}", owner)
        now[0] += 3.0
        table.end(record.program_id, owner, waiting_time=float(number))
    rows, kept = table.ended_rows(alice, limit=10)
    assert [r["name"] for r in rows] == ["p3", "p1"] and kept == 2  # p0 forgotten: 2 a key
    assert rows[0]["age_s"] == 3.0 and rows[0]["waiting_time"] == 3.0
    assert rows[0]["ended_ago_s"] == 0.0 and rows[1]["ended_ago_s"] == 6.0
    assert [r["name"] for r in table.ended_rows(bob, limit=10)[0]] == ["p2"]
    assert [r["name"] for r in table.ended_rows(admin, limit=2)[0]] == ["p3", "p2"]
    assert table.ended_rows(admin, limit=10)[1] == 3
    assert table.ended_rows(ANONYMOUS, limit=10) == ([], 0)


async def test_ps_all_lists_a_programs_final_row_after_it_ended_to_its_owner_only(
    start_router, tmp_path, capsys
):
    keys = tmp_path / "keys"
    keys.write_text("alice: sk-alice\nbob: sk-bob\n")
    options = {"api_keys_file": str(keys), "admin_key": "sk-admin"}
    async with start_router([DEAD_ENGINE], **options) as router:
        programs = router.url + "/autellix/v1/programs"
        _, short = await request(
            "POST", programs, json={"name": "short"}, headers=bearer("sk-alice")
        )
        _, live = await request("POST", programs, json={"name": "live"}, headers=bearer("sk-alice"))
        ended_id = short["program_id"]
        status, _ = await request("DELETE", f"{programs}/{ended_id}", headers=bearer("sk-alice"))
        assert status == 200

        status, listed = await request("GET", programs + "?ended=1", headers=bearer("sk-alice"))
        assert status == 200 and listed["has_more"] is False and listed["next_after"] is None
        assert [row["program_id"] for row in listed["programs"]] == [ended_id]
        assert listed["programs"][0]["owner"] == "alice"
        _, for_bob = await request("GET", programs + "?ended=1", headers=bearer("sk-bob"))
        assert for_bob["programs"] == [] and for_bob["total"] == 0
        _, for_admin = await request("GET", programs + "?ended=1", headers=bearer("sk-admin"))
        assert [row["program_id"] for row in for_admin["programs"]] == [ended_id]
        status, body = await request("GET", programs + "?ended=yes", headers=bearer("sk-alice"))
        assert status == 400 and body["error"]["param"] == "ended"

        argv = ["ps", "--url", router.url + "/v1", "--api-key", "sk-alice"]
        assert await asyncio.to_thread(main, [*argv, "--all"]) == 0
        text = capsys.readouterr().out
        live_part, keys_part, ended_part = text.split("\n\n")
        assert live["program_id"] in live_part and ended_id not in live_part
        # Her own key's account only: its programs in the table, the ended one not.
        assert [line.split() for line in keys_part.splitlines()[2:]] == [
            ["alice", "interactive", "1", "0.0", "0.0", "1"]
        ]
        ended_lines = ended_part.splitlines()
        assert ended_lines[0] == "1 ended programs, the last ended first"
        assert ended_lines[1].split()[-3:] == ["AGE", "ENDED", "OWNER"]
        assert ended_lines[2].split()[:2] == [ended_id, "short"]
        assert ended_lines[2].split()[-2:] == ["ago", "alice"]
        assert await asyncio.to_thread(main, [*argv, "--all", "--json"]) == 0
        raw = json.loads(capsys.readouterr().out)
        assert [row["program_id"] for row in raw["ended_programs"]] == [ended_id]
        assert await asyncio.to_thread(main, argv) == 0
        assert "ended programs" not in capsys.readouterr().out


@contextlib.asynccontextmanager
async def engine_like_server():
    """Answers like a vLLM engine: 404 on every path it does not serve."""

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_get("/health", health)
    async with serving(web.AppRunner(app, access_log=None)) as url:
        yield url


async def test_ps_names_a_wrong_key_an_engine_url_and_a_missing_scheme(start_router, capsys):
    async def ps_error(*argv: str) -> str:
        assert await asyncio.to_thread(main, ["ps", *argv]) == 2
        error = capsys.readouterr().err
        assert len(error.splitlines()) == 1 and error.startswith("autellix ps: error: ")
        return error

    async with start_router([DEAD_ENGINE], api_key="sk-client") as router:
        assert "needs a key: --api-key" in await ps_error("--url", router.url)
        wrong = await ps_error("--url", router.url, "--api-key", "sk-engine")
        assert "refused the key (401)" in wrong and "not an engine key" in wrong
    async with engine_like_server() as engine_url:
        assert "this looks like an engine" in await ps_error("--url", engine_url)
    assert "needs http:// or https://" in await ps_error("--url", "127.0.0.1:8000")
    assert "needs http:// or https://" in await ps_error("--url", "localhost:8000")


def test_a_router_that_does_not_answer_is_unavailable_not_a_mistake():
    with pytest.raises(admin_client.RouterUnavailable, match="cannot reach the router"):
        admin_client.fetch_table(DEAD_ENGINE, None, timeout_s=2.0)


def test_top_keeps_going_while_the_router_is_away(monkeypatch, capsys):
    table = {"programs": [{"program_id": "prog-a", "age_s": 1}], "engines": [], "total": 1}
    answers = [table, admin_client.RouterUnavailable("cannot reach the router at X"), table]

    def fetch(*args, **kwargs):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(ps_cli, "fetch_table", fetch)
    argv = ["top", "--url", "http://127.0.0.1:1", "--iterations", "3", "--interval", "0.01"]
    assert main(argv) == 0
    frames = capsys.readouterr().out.split(ps_cli.CLEAR_SCREEN)[1:]
    assert ["prog-a" in frame for frame in frames] == [True, False, True]
    assert "cannot reach the router at X (since " in frames[1]
    assert "trying again every 0.01 s" in frames[1]
