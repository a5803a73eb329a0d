"""One contract, every path a call takes to an engine (``conftest.py``'s paths):
owners are isolated, a client's scheduling fields have no effect, a program past
a limit gets the same answer, a client without our SDK still has its calls
grouped, retention hints are checked and passed on the same way, and so is
the body's own ``priority`` (a band asked for).

What each path is allowed to differ in is stated once, on the path
(``CallPath.router``, ``CallPath.stranger_refusal``); everything else must be
the same bytes on every path.
"""

from __future__ import annotations

import uuid
from typing import Any

import aiohttp
import pytest
from autellix_vllm.policy.forks import NewThread, limit_crossed
from autellix_vllm.protocol.identity import IdentityError, read_identity
from autellix_vllm.protocol.openai_errors import error_body
from autellix_vllm.router.keys import owner_of
from call_paths import ALICE_KEY, BOB_KEY, ENGINE_KEY, LIMITS, CallPath, bearer
from polling import eventually

pytestmark = pytest.mark.engine

FORGED = 1e300


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def request(
    method: str, url: str, authorization: str, headers: dict[str, str] | None = None,
    json: Any = None,
) -> tuple[int, Any]:  # fmt: skip
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method, url, headers={"Authorization": authorization, **(headers or {})}, json=json
        ) as answer,
    ):
        return answer.status, await answer.json(content_type=None)


async def chat(
    path: CallPath, authorization: str, headers: dict[str, str] | None = None, **extra: Any
) -> tuple[int, Any]:
    body = {"model": path.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2, **extra}  # fmt: skip
    return await request("POST", path.url + "/v1/chat/completions", authorization, headers, body)


async def engine_tables(path: CallPath) -> list[dict[str, Any]]:
    """Every engine's table behind ``path``, read with the engine key."""
    tables = []
    for url in path.engines:
        status, table = await request("GET", url + "/autellix/v1/engine/table", bearer(ENGINE_KEY))
        assert status == 200, table
        tables.append(table)
    return tables


async def engine_rows(path: CallPath, program_id: str) -> list[dict[str, Any]]:
    """The rows of ``program_id`` in the engines' tables."""
    tables = await engine_tables(path)
    return [row for table in tables for row in table["programs"] if row["program_id"] == program_id]


async def over_limit(path: CallPath, limit: str) -> int:
    """Calls the engines ran alone because they would cross ``limit``."""
    return sum(table["calls_over_limit"].get(limit, 0) for table in await engine_tables(path))


def assert_error(status: int, body: Any, expected_status: int, code: str) -> None:
    assert status == expected_status, body
    assert set(body) == {"error"} and body["error"]["code"] == code, body


async def test_a_key_cannot_see_or_touch_another_keys_program(path: CallPath) -> None:
    program_id = unique("alices")
    named = {"X-Autellix-Program-Id": program_id}
    assert (await chat(path, path.alice, named))[0] == 200
    stranger_status, stranger_code = path.stranger_refusal
    assert_error(*await chat(path, path.bob, named), stranger_status, stranger_code)
    assert_error(*await request("DELETE", path.end_url(program_id), path.bob),
                 stranger_status, stranger_code)  # fmt: skip
    status, listing = await request("GET", path.programs_url, path.bob)
    if status == 200:
        assert program_id not in {row["program_id"] for row in listing["programs"]}
    else:
        assert_error(status, listing, stranger_status, stranger_code)
    # Alice's program is as she left it: one call, not ended.
    rows = await eventually(lambda: engine_rows(path, program_id), lambda rows: rows)
    assert sum(row["calls_completed"] for row in rows) == 1
    assert (await chat(path, path.alice, named))[0] == 200


async def test_a_clients_prior_service_and_owner_have_no_effect(path: CallPath) -> None:
    """A client (a router's key holder, or an engine's caller without its key)
    states a huge prior service and another key's owner, in headers and body."""
    program_id = unique("forged")
    client = path.alice if path.router else bearer("not-the-key")
    forged = {"X-Autellix-Program-Id": program_id, "X-Autellix-Prior-Service": str(FORGED),
              "X-Autellix-Owner": owner_of(BOB_KEY)}  # fmt: skip
    xargs = {"autellix_prior_service": FORGED, "autellix_owner": owner_of(BOB_KEY)}
    status, body = await chat(path, client, forged, vllm_xargs=xargs)
    if path.router:
        assert status == 200, body
        rows = await eventually(lambda: engine_rows(path, program_id), lambda rows: rows)
        assert all(row["attained_service"] < 1000 for row in rows), rows
        # The program is the caller's, not the owner it named: on the engines too.
        assert {row["owner"] for row in rows} == {owner_of(ALICE_KEY)}
        bobs = (await request("GET", path.programs_url, path.bob))[1]["programs"]
        assert program_id not in {row["program_id"] for row in bobs}
    else:
        assert_error(status, body, 401, "invalid_api_key")  # vLLM's key check comes first
        assert await engine_rows(path, program_id) == []


async def test_a_program_past_a_limit_gets_the_same_answer(path: CallPath) -> None:
    program_id = unique("threads")

    async def on_thread(thread: str) -> tuple[int, Any]:
        headers = {"X-Autellix-Program-Id": program_id, "X-Autellix-Thread-Id": thread}
        return await chat(path, path.alice, headers)

    for n in range(LIMITS.max_threads):
        assert (await on_thread(f"t{n}"))[0] == 200
    before = await over_limit(path, "max_threads")
    status, body = await on_thread("one-too-many")
    crossed = limit_crossed(LIMITS, LIMITS.max_threads, 0, (NewThread("one-too-many", None, 0),))
    assert crossed is not None
    if path.router:
        expected = error_body(400, crossed.message, crossed.code, "X-Autellix-Thread-Id")
        assert (status, body) == (400, expected)
    else:  # the engine's own table refuses it the program: it runs alone
        assert status == 200, body
        assert await over_limit(path, "max_threads") == before + 1


async def test_the_engines_hold_the_same_limits_as_their_router(path: CallPath) -> None:
    """Reached directly with the engine key, every engine behind the path runs a
    call past the routers' thread limit alone: the limits have one source."""
    for url in path.engines:
        engine = CallPath(path.name, url, path.model, bearer(ENGINE_KEY), "", [url], router=False)
        program_id = unique("direct")
        before = await over_limit(engine, "max_threads")
        for n in range(LIMITS.max_threads + 1):
            headers = {"X-Autellix-Program-Id": program_id, "X-Autellix-Thread-Id": f"t{n}"}
            assert (await chat(engine, engine.alice, headers))[0] == 200
        assert await over_limit(engine, "max_threads") == before + 1


async def test_a_client_without_our_headers_still_has_its_calls_grouped(path: CallPath) -> None:
    """An agent harness sends its session header and nothing of ours: a router names
    one program for its calls; an engine alone derives none (it reads the SDK's
    headers, ``X-Session-ID`` and ``agent_hint``), so each call runs alone there."""
    session = unique("harness")
    for _ in range(2):
        assert (await chat(path, path.alice, {"session-id": session}))[0] == 200
    if not path.router:
        tables = await engine_tables(path)
        assert not any(session in row["program_id"] for t in tables for row in t["programs"])
        return
    listing = (await request("GET", path.programs_url, path.alice))[1]["programs"]
    (row,) = [row for row in listing if row["name"] == f"session-id={session}"]
    assert row["program_id"].startswith("derived-") and row["calls_completed"] == 2
    rows = await eventually(lambda: engine_rows(path, row["program_id"]), lambda rows: rows)
    assert sum(r["calls_completed"] for r in rows) == 2


async def test_retention_hints_pass_and_a_malformed_one_gets_the_same_400(path: CallPath) -> None:
    """A hint past the residency bounds is taken (the engine clamps it to them,
    ``ResidencyConfig.bounded_ttl_s``); a malformed one is refused with one body."""
    program_id = unique("hinted")
    for hint in ({"X-Autellix-Retention-Ttl": "3h"}, {"X-Autellix-Retention-Ttl": "0"}):
        status, body = await chat(path, path.alice, {"X-Autellix-Program-Id": program_id, **hint})
        assert status == 200, body
    status, body = await chat(path, path.alice, vllm_xargs={"autellix_retention_ttl_s": 1e9})
    assert status == 200, body
    with pytest.raises(IdentityError) as malformed:
        read_identity([("X-Autellix-Retention-Ttl", "5d")])
    error = malformed.value
    expected = error_body(400, str(error), error.code, error.param)
    status, body = await chat(path, path.alice, {"X-Autellix-Retention-Ttl": "5d"})
    assert (status, body) == (400, expected)


async def test_a_body_priority_asks_for_a_band_and_one_that_is_no_band_gets_one_400(
    path: CallPath,
) -> None:
    """vLLM's own ``priority`` field: alice (a key of the default class on a router,
    the engine key's holder on an engine) lowers her call's class with it, and the
    engines rank the program in that band; bob's key weighs 2 (the keys file), which
    a router states to the engines. A priority that is no band: one 400 body."""
    program_id = unique("prioritized")
    status, body = await chat(path, path.alice, {"X-Autellix-Program-Id": program_id}, priority=1)
    assert status == 200, body
    rows = await eventually(lambda: engine_rows(path, program_id), lambda rows: rows)
    assert {row["band"] for row in rows} == {1}
    if path.router:
        assert (await chat(path, path.bob))[0] == 200
        weights = [t["owners"].get(owner_of(BOB_KEY), {}).get("weight") for t in
                   await engine_tables(path)]  # fmt: skip
        assert 2.0 in weights and set(weights) <= {2.0, None}, weights
    with pytest.raises(IdentityError) as malformed:
        read_identity(priority=-1)
    error = malformed.value
    expected = error_body(400, str(error), error.code, error.param)
    assert await chat(path, path.alice, priority=-1) == (400, expected)
