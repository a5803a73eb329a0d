"""The router's security and fault suite: every router-side case of the hardening
issue (issue 11), replayed against a real router on 127.0.0.1.

Malformed HTTP and JSON, forged scheduling fields, owners and keys, call-id
reuse, program limits, a flood of programs, a stream the client drops, a
reset engine connection. Tests that need an engine's answers use a real
engine (``engine`` marker): this module's own, with an engine key, as
``autellix serve`` starts them. A fake engine stands in only to inject a
fault (a reset connection, an engine that holds its calls, a stream that never
ends) or to record what the router sends (the engine key), which a real engine
does not show.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from autellix_vllm.cli.ps import format_table
from autellix_vllm.policy.config import ProgramLimits, ServiceMeter, TableBounds
from autellix_vllm.router import RouterConfig
from autellix_vllm.router.keys import load_api_keys, owner_of
from polling import eventually
from router_http import (
    PROGRAMS,
    assert_openai_error,
    completion,
    engine_request,
    engine_table,
    fake_engine_app,
    program_row,
    request,
    unique,
)

MODEL = "fake-model"
USAGE = {"prompt_tokens": 16, "completion_tokens": 2, "total_tokens": 18}
USAGE_SERVICE = ServiceMeter().amount(2, 16)


def dead_upstream() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def while_running(condition: Callable[[], bool], calls: list[asyncio.Future]) -> None:
    """Wait until ``condition()`` holds while ``calls`` are still running."""

    def ended() -> list[object]:
        return [call.result() for call in calls if call.done()]

    await eventually(lambda: condition() or ended(), timeout_s=60, poll_s=0.005)
    assert condition(), f"a call ended before the condition held: {ended()}"


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    logged = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not logged, logged[0].getMessage()


# ---- a fake engine, for fault injection and for recording what the router sends ----


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Answer = Callable[[web.Request, int], Awaitable[web.StreamResponse]]


async def answer_with_usage(request: web.Request, number: int) -> web.StreamResponse:
    choice = {"index": 0, "text": "ok", "finish_reason": "length"}
    return web.json_response({"object": "text_completion", "choices": [choice], "usage": USAGE})


@dataclass
class FakeEngine:
    """Healthy, one model, no Autellix table; ``answer`` decides each generation call."""

    answer: Answer
    url: str = ""
    received: list[Received] = field(default_factory=list)
    calls: int = 0

    def posts(self) -> list[Received]:
        return [r for r in self.received if r.method == "POST"]


@contextlib.asynccontextmanager
async def fake_engine(answer: Answer = answer_with_usage) -> AsyncIterator[FakeEngine]:
    engine = FakeEngine(answer)

    @web.middleware
    async def record(request: web.Request, handler):
        body = await request.read()
        engine.received.append(Received(request.method, request.path, dict(request.headers), body))
        return await handler(request)

    async def generate(request: web.Request) -> web.StreamResponse:
        number, engine.calls = engine.calls, engine.calls + 1
        return await engine.answer(request, number)

    app = web.Application(middlewares=[record])
    app.router.add_post("/v1/completions", generate)
    async with fake_engine_app(app, MODEL) as engine.url:
        yield engine


# ---- malformed HTTP and JSON: a JSON 4xx, one log line, no traceback ----------------


async def raw_http(url: str, request_bytes: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are; (status, headers, body) of the answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request_bytes)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), {k.lower(): v for k, v in headers.items()}, body


MALFORMED_HTTP = {
    "oversized header": (b"X-Big: " + b"a" * 9000 + b"\r\n", "request_too_large"),
    "too many headers": (b"".join(b"X-%d: a\r\n" % i for i in range(200)), "request_too_large"),
    "control character": (b"X-Autellix-Program-Id: a\x01b\r\n", "invalid_http_request"),
    "ANSI escape": (b"X-Name: \x1b[31mred\r\n", "invalid_http_request"),
    "NUL in a name": (b"X-A\x00: b\r\n", "invalid_http_request"),
}


async def test_malformed_http_gets_a_json_400_and_one_log_line(start_router, caplog):
    caplog.set_level(logging.INFO)
    async with start_router([dead_upstream()]) as router:
        for what, (header, code) in MALFORMED_HTTP.items():
            sent = b"GET /health HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n"
            status, headers, body = await raw_http(router.url, sent)
            assert status == 400, what
            assert headers["content-type"].startswith("application/json"), what
            assert_openai_error(status, json.loads(body), 400, code)
        status, body = await request("GET", router.url + "/health")  # still serving
        assert status == 503 and body == {"healthy_engines": []}
    refused = [r for r in caplog.records if "malformed HTTP request" in r.getMessage()]
    assert len(refused) == len(MALFORMED_HTTP)
    no_tracebacks(caplog)


async def test_deep_json_and_bad_program_names_are_json_400s(start_router, caplog):
    caplog.set_level(logging.INFO)
    async with start_router([dead_upstream()]) as router:
        url = router.url + PROGRAMS
        deep = b"[" * 100_000
        for _ in range(3):
            status, body = await request("POST", url, data=deep)
            assert_openai_error(status, body, 400, "invalid_json")
        for name in ("a\x00b", "\x1b[2J\x1b[31mred", "x" * 257, "bidi \u202e", 7):
            status, body = await request("POST", url, json={"name": name})
            assert_openai_error(status, body, 400, "invalid_name")
        for query in ("limit=0", "limit=1001", "limit=x", "after=-1"):
            status, body = await request("GET", f"{url}?{query}")
            assert_openai_error(status, body, 400, "invalid_parameter")
        status, opened = await request("POST", url, json={"name": "plain name é"})
        assert status == 200 and opened["name"] == "plain name é"
    no_tracebacks(caplog)


def test_ps_and_top_escape_what_a_terminal_would_act_on():
    hostile = "\x1b[2J\x1b]0;pwned\x07evil\x00\u202e"
    table = {
        "balancer": "locality",
        "engines": [{"name": "engine-0", "healthy": True, "load": 0}],
        "programs": [{"program_id": "p\x1b[1m", "name": hostile, "owner": "a\nb", "age_s": 1}],
    }
    for sort_by in ("age", "service"):
        text = format_table(table, sort_by=sort_by)
        assert not any(ch in text for ch in "\x1b\x07\x00\u202e")
        assert "\\x1b[2J" in text and "evil" in text and "\\x00" in text
        assert len(text.splitlines()) == 3  # the owner's newline did not add a line


# ---- forged scheduling fields; the engine key -----------------------------------


async def test_the_engine_gets_the_engine_key_and_only_the_routers_scheduling_fields(
    start_router,
):
    async with (
        fake_engine() as engine,
        start_router([engine.url], api_key="client-key", engine_key="engine-key") as router,
    ):
        forged = {
            "Authorization": "Bearer client-key",
            "X-Autellix-Program-Id": "mine",
            "X-Autellix-Prior-Service": "1e300",
            "X-Autellix-Owner": "key-someone-else",
            "X-Autellix-Weight": "1e6",
            "X-Autellix-Priority": "batch",  # a request: the key allows it
            "X-Vllm-Priority": "-5",  # vLLM's own: never passed on
        }
        body = completion(
            MODEL,
            vllm_xargs={"autellix_prior_service": 1e300, "autellix_owner": "key-x",
                        "autellix_thread_id": "t1", "top_k": 5},
            priority=3,  # the header wins
        )  # fmt: skip
        for _ in range(2):
            status, _ = await request(
                "POST", router.url + "/v1/completions", json=body, headers=forged
            )
            assert status == 200
        router.state.programs.get("mine").service = 1e300  # as if it had run forever
        status, _ = await request("POST", router.url + "/v1/completions", json=body, headers=forged)
        assert status == 200
        status, _ = await request("DELETE", f"{router.url}{PROGRAMS}/mine", headers=forged)
        assert status == 200

    assert {r.path for r in engine.received} >= {
        "/health",
        "/v1/models",
        "/v1/completions",
        "/autellix/v1/engine/programs/mine",
    }
    for received in engine.received:  # probes, calls, the end of the program
        assert received.headers["Authorization"] == "Bearer engine-key", received.path
    first, second, third = engine.posts()
    for sent in (first, second, third):
        assert json.loads(sent.body)["vllm_xargs"] == {"top_k": 5}  # the forged keys are gone
        assert "priority" not in json.loads(sent.body)
        assert sent.headers["X-Autellix-Priority"] == "1"  # the band the router states
        assert "X-Autellix-Weight" not in sent.headers and "X-Vllm-Priority" not in sent.headers
        assert sent.headers["X-Autellix-Program-Id"] == "mine"
        assert sent.headers["X-Autellix-Thread-Id"] == "t1"  # what the router accepted
        assert sent.headers["X-Autellix-Owner"] == owner_of("client-key")  # the router's
    assert "X-Autellix-Prior-Service" not in first.headers  # no service yet: none sent
    assert float(second.headers["X-Autellix-Prior-Service"]) == USAGE_SERVICE
    assert float(third.headers["X-Autellix-Prior-Service"]) == ProgramLimits().max_prior_service


async def test_a_forged_priority_is_stripped_but_the_retention_hint_passes(start_router):
    """The retention TTL is not a priority field: the router passes a client's hint on
    as sent (the engine clamps it to its residency bounds) next to the identity it
    accepted, while the client's prior service still never reaches the engine."""
    async with fake_engine() as engine, start_router([engine.url]) as router:
        hinted = {"X-Autellix-Program-Id": "hinted", "X-Autellix-Prior-Service": "1e300"}
        sent = [
            ({**hinted, "X-Autellix-Retention-Ttl": "20"}, {}),
            ({**hinted, "X-Autellix-Retention-Ttl": "3h"}, {}),
            (hinted, {"vllm_xargs": {"autellix_retention_ttl_s": 1e9,
                                     "autellix_prior_service": 1e300}}),
            (hinted, {"agent_hint": {"session_id": "s", "cache_control": {"ttl": "45s"}}}),
            (hinted, {}),
        ]  # fmt: skip
        for headers, extra in sent:
            body = {**completion(MODEL), **extra}
            status, _ = await request(
                "POST", router.url + "/v1/completions", json=body, headers=headers
            )
            assert status == 200

    posts = engine.posts()
    ttls = [p.headers.get("X-Autellix-Retention-Ttl") for p in posts]
    assert ttls == ["20.0", "10800.0", "1000000000.0", "45.0", None]
    assert "X-Autellix-Prior-Service" not in posts[0].headers  # forged, and no service yet
    for number, post in enumerate(posts):  # later: the router's own count, never 1e300
        service = float(post.headers.get("X-Autellix-Prior-Service", 0))
        assert service == pytest.approx(number * USAGE_SERVICE)
        assert "autellix_prior_service" not in json.loads(post.body).get("vllm_xargs", {})
        assert "autellix_retention_ttl_s" not in json.loads(post.body).get("vllm_xargs", {})
        assert post.headers["X-Autellix-Program-Id"] == "hinted"


# ---- owners and keys --------------------------------------------------------------


def test_a_keys_file_names_its_keys_and_its_errors_never_show_a_key(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# team keys\n\nalice: sk-alice-1\nbob : sk-bob:2  \nsk-bare-3\n")
    loaded = load_api_keys(keys)
    assert loaded["sk-alice-1"].name == "alice" and loaded["sk-bob:2"].name == "bob"
    assert loaded["sk-bare-3"].name.startswith("key-")  # named after its hash
    bad_files = {
        "alice: sk-1\nbob: sk-1\n": "line 2: the same key is on line 1",
        "# only a comment\n": "no keys in it",
        "carol: sk with space\n": "line 1: the key must not contain spaces",
        ": sk-no-name\n": "line 1: a name must be",
        "alice:\n": "line 1: the key must not be empty",
    }
    for text, message in bad_files.items():
        keys.write_text(text)
        with pytest.raises(ValueError, match=message) as caught:
            load_api_keys(keys)
        assert "sk-" not in str(caught.value)
    with pytest.raises(ValueError, match="cannot read it"):
        load_api_keys(tmp_path / "missing")
    keys.write_text("alice: sk-alice-1\n")
    config = RouterConfig(
        upstreams=("http://127.0.0.1:1",),
        api_key="sk-solo",
        api_keys_file=str(keys),
        admin_key="sk-admin",
        engine_key="sk-engine",
    )
    assert "sk-" not in repr(config) and len(config.keys) == 3
    with pytest.raises(ValueError, match="admin key must differ"):
        RouterConfig(
            upstreams=("http://127.0.0.1:1",), api_keys_file=str(keys), admin_key="sk-alice-1"
        )


async def test_programs_belong_to_the_key_that_opened_them(start_router, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alice: sk-alice\nbob: sk-bob\n")
    options = {"api_keys_file": str(keys), "api_key": "sk-solo", "admin_key": "sk-admin"}
    async with start_router([dead_upstream()], **options) as router:
        url = router.url + PROGRAMS

        async def open_as(key: str) -> str:
            status, body = await request("POST", url, json={"name": key}, headers=bearer(key))
            assert status == 200
            return body["program_id"]

        async def listed(key: str) -> dict[str, str]:
            status, table = await request("GET", url, headers=bearer(key))
            assert status == 200 and table["total"] == len(table["programs"])
            return {row["program_id"]: row["owner"] for row in table["programs"]}

        alice = [await open_as("sk-alice"), await open_as("sk-alice")]
        bob = await open_as("sk-bob")
        assert await listed("sk-alice") == dict.fromkeys(alice, "alice")
        assert await listed("sk-bob") == {bob: "bob"}
        assert await listed("sk-solo") == {}
        assert await listed("sk-admin") == {**dict.fromkeys(alice, "alice"), bob: "bob"}

        # Another key's program does not exist for it: not listed, not ended.
        end = f"{url}/{alice[0]}"
        assert_openai_error(
            *await request("DELETE", end, headers=bearer("sk-bob")), 404, "program_not_found"
        )
        assert alice[0] in await listed("sk-alice")
        assert (await request("DELETE", end, headers=bearer("sk-alice")))[0] == 200
        assert_openai_error(
            *await request("DELETE", end, headers=bearer("sk-alice")), 404, "program_ended"
        )
        assert_openai_error(
            *await request("DELETE", end, headers=bearer("sk-bob")), 404, "program_not_found"
        )  # not even that it has ended
        # The admin key ends anyone's.
        assert (await request("DELETE", f"{url}/{bob}", headers=bearer("sk-admin")))[0] == 200
        assert await listed("sk-bob") == {}
        for headers in ({}, bearer("sk-wrong"), {"Authorization": "sk-alice"}):
            assert_openai_error(*await request("GET", url, headers=headers), 401, "invalid_api_key")


# ---- a flood of programs: capped, paged, and the router keeps answering ----------


async def test_a_flood_of_programs_is_capped_and_paged_without_stalling_the_router(start_router):
    cap, flood = 10_000, 20_000
    async with start_router(
        [dead_upstream()], table=TableBounds(max_programs_per_key=cap)
    ) as router:
        loop = asyncio.get_running_loop()
        # Per health probe: the loop's CPU time while it waited (the router and this
        # test share one thread, so that is the longest the router kept it waiting,
        # whatever else the machine runs), and its wall time.
        health_cpu_s: list[float] = []
        health_s: list[float] = []
        statuses: Counter[int] = Counter()
        refusal: list[object] = []

        async def probe_health(http: aiohttp.ClientSession) -> None:
            while True:
                began, began_cpu = time.perf_counter(), time.thread_time()
                async with http.get(router.url + "/health") as answer:
                    await answer.read()
                health_cpu_s.append(time.thread_time() - began_cpu)
                health_s.append(time.perf_counter() - began)
                await asyncio.sleep(0.01)

        async def create(http: aiohttp.ClientSession, numbers: range) -> None:
            for i in numbers:
                async with http.post(router.url + PROGRAMS, json={"name": f"f{i}"}) as answer:
                    statuses[answer.status] += 1
                    if answer.status == 429 and not refusal:
                        refusal.append(await answer.json())

        async with aiohttp.ClientSession() as http, aiohttp.ClientSession() as prober:
            probing = loop.create_task(probe_health(prober))
            workers = 16
            await asyncio.gather(*(create(http, range(w, flood, workers)) for w in range(workers)))
            seen: list[str] = []
            after = None
            pages = 0
            while True:
                query = f"?limit=1000&after={after}" if after else "?limit=1000"
                async with http.get(router.url + PROGRAMS + query) as answer:
                    page = await answer.json()
                seen.extend(row["program_id"] for row in page["programs"])
                pages += 1
                assert page["total"] == cap and page["has_more"] == (page["next_after"] is not None)
                after = page["next_after"]
                if after is None:
                    break
            default_page = await (await http.get(router.url + PROGRAMS)).json()
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing

        assert statuses == {200: cap, 429: flood - cap}
        assert_openai_error(429, refusal[0], 429, "too_many_programs")
        assert pages == 10 and len(set(seen)) == cap
        assert len(default_page["programs"]) == 100 and default_page["has_more"]
        assert len(health_s) > 50 and max(health_cpu_s) < 0.1, max(health_cpu_s)
        assert max(health_s) < 2.0, max(health_s)


async def test_a_running_router_keeps_what_existed_at_start_out_of_full_collections(
    start_router,
):
    # A full collection walks every object the process holds: in a process that
    # imported vLLM that is a pause of the loop near half a second.
    gc.unfreeze()
    async with start_router([dead_upstream()]):
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


# ---- call limits and call ids, on the real engine -------------------------------


ENGINE_KEY = "security-suite-engine-key"


@pytest.fixture(scope="module")
def engine(running_engine):
    """This module's real engine has an engine key, as ``autellix serve`` starts
    them: it takes a prior service only from the key's holder, the router."""
    with running_engine("security-engine", api_key=ENGINE_KEY) as process:
        yield process


@pytest.mark.engine
async def test_only_the_routers_prior_service_reaches_the_engine(engine, start_router):
    model = engine.served_model_name
    program_id = unique("forged")
    forged = {"X-Autellix-Program-Id": program_id, "X-Autellix-Prior-Service": "1e300"}
    body = completion(model, max_tokens=8, vllm_xargs={"autellix_prior_service": 1e300})
    async with start_router([engine]) as router:
        post = router.url + "/v1/completions"
        for _ in range(2):
            status, answer = await request("POST", post, json=body, headers=forged)
            assert status == 200, answer
        service = program_row((await request("GET", router.url + PROGRAMS))[1], program_id)[
            "service"
        ]
        attained = program_row(await engine_table(engine), program_id)["attained_service"]
        assert attained == pytest.approx(service, rel=0.05)  # its work; never the forged 1e300
        # The engine forgets the program (as if its calls had run elsewhere) ...
        path = f"/autellix/v1/engine/programs/{program_id}"
        assert (await engine_request(engine, "DELETE", path))[0] == 200
        # ... and learns its service again from the router's X-Autellix-Prior-Service.
        status, _ = await request("POST", post, json=body, headers=forged)
        assert status == 200
        attained = program_row(await engine_table(engine), program_id)["attained_service"]
        assert service + 8 <= attained < 1000


@pytest.mark.engine
async def test_calls_of_another_key_get_404_and_call_ids_are_used_once(
    engine, start_router, tmp_path
):
    model = engine.served_model_name
    keys = tmp_path / "keys"
    keys.write_text("alice: sk-alice\nbob: sk-bob\n")
    options = {"api_keys_file": str(keys), "admin_key": "sk-admin"}
    async with start_router([engine], **options) as router:
        post = router.url + "/v1/completions"
        status, opened = await request("POST", router.url + PROGRAMS, headers=bearer("sk-alice"))
        program_id = opened["program_id"]

        def call(call_id: str, key: str = "sk-alice") -> dict[str, str]:
            return {
                "X-Autellix-Program-Id": program_id,
                "X-Autellix-Call-Id": call_id,
                **bearer(key),
            }

        assert_openai_error(
            *await request("POST", post, json=completion(model), headers=call("c0", "sk-bob")),
            404,
            "program_not_found",
        )
        status, by_admin = await request(
            "POST", post, json=completion(model), headers=call("c0", "sk-admin")
        )
        assert status == 200  # the admin key may act for any program
        usage = by_admin["usage"]
        charged = ServiceMeter().amount(usage["completion_tokens"], usage["prompt_tokens"])

        # Reuse after completion: 409, and nothing charged.
        status, first = await request("POST", post, json=completion(model), headers=call("c1"))
        assert status == 200
        usage = first["usage"]
        charged += ServiceMeter().amount(usage["completion_tokens"], usage["prompt_tokens"])
        for _ in range(3):
            assert_openai_error(
                *await request("POST", post, json=completion(model), headers=call("c1")),
                409,
                "call_id_reused",
            )

        # A retry of an attempt that did not complete is allowed, and charged once.
        status, body = await request(
            "POST", post, json=completion(model, max_tokens=-1), headers=call("c3")
        )
        assert status == 400  # the engine refused it
        status, third = await request("POST", post, json=completion(model), headers=call("c3"))
        assert status == 200
        usage = third["usage"]
        charged += ServiceMeter().amount(usage["completion_tokens"], usage["prompt_tokens"])

        table = (await request("GET", router.url + PROGRAMS, headers=bearer("sk-alice")))[1]
        row = program_row(table, program_id)
        assert row["calls_completed"] == 3 and row["calls_failed"] == 1
        assert row["service"] == pytest.approx(charged)


@pytest.mark.engine
async def test_thread_limits_are_400s_that_name_the_limit(engine, start_router):
    model = engine.served_model_name
    limits = ProgramLimits(max_threads=4, max_fork_depth=2)
    program_id = unique("limits")
    async with start_router([engine], table=TableBounds(limits=limits)) as router:
        post = router.url + "/v1/completions"

        async def call_on(thread: str, parent: str | None = None) -> tuple[int, object]:
            headers = {"X-Autellix-Program-Id": program_id, "X-Autellix-Thread-Id": thread}
            if parent:
                headers["X-Autellix-Parent-Thread-Id"] = parent
            return await request("POST", post, json=completion(model), headers=headers)

        for thread, parent in (("main", None), ("t1", "main"), ("t2", "t1")):
            assert (await call_on(thread, parent))[0] == 200
        status, body = await call_on("t3", "t2")  # 3 forks below main
        assert_openai_error(status, body, 400, "fork_too_deep")
        assert "max_fork_depth" in body["error"]["message"]
        assert (await call_on("t4", "main"))[0] == 200
        status, body = await call_on("t5")  # a fifth thread
        assert_openai_error(status, body, 400, "too_many_threads")
        assert "max_threads" in body["error"]["message"]


@pytest.mark.engine
async def test_deep_bodies_are_json_4xx_and_the_router_keeps_serving(engine, start_router, caplog):
    caplog.set_level(logging.INFO)
    model = engine.served_model_name
    async with start_router([engine]) as router:
        post = router.url + "/v1/chat/completions"
        for _ in range(3):
            status, body = await request("POST", post, data=b"[" * 100_000)
            assert_openai_error(status, body, 400, "invalid_json")
        # Written out: Python's json module cannot write 950 levels either.
        messages = "[" * 950 + '{"role": "user", "content": "hi"}' + "]" * 950
        deep = f'{{"model": "{model}", "messages": {messages}}}'.encode()
        status, body = await request("POST", post, data=deep)
        assert 400 <= status < 500 and isinstance(body, dict) and "error" in body, body
        good = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        status, answer = await request("POST", post, json=good)
        assert status == 200, answer
    no_tracebacks(caplog)


class Gate:
    """An engine answer that holds every call until :attr:`opened` is set."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.holding = 0

    async def answer(self, request: web.Request, number: int) -> web.StreamResponse:
        self.holding += 1
        await self.opened.wait()
        return await answer_with_usage(request, number)


async def test_calls_in_flight_bound_the_program_and_their_ids(start_router):
    """The engine holds two calls of a program: a third is past max_live_calls, and
    a call with the id of a held one is a duplicate; both complete afterwards."""
    gate = Gate()
    limits = ProgramLimits(max_live_calls=2)
    async with (
        fake_engine(gate.answer) as engine,
        start_router([engine.url], table=TableBounds(limits=limits)) as router,
    ):
        post = router.url + "/v1/completions"

        def call(call_id: str) -> dict[str, str]:
            return {"X-Autellix-Program-Id": "p", "X-Autellix-Call-Id": call_id}

        held = [
            asyncio.ensure_future(request("POST", post, json=completion(MODEL), headers=call(c)))
            for c in ("c1", "c2")
        ]
        await while_running(lambda: gate.holding == 2, held)
        status, body = await request("POST", post, json=completion(MODEL), headers=call("c1"))
        assert_openai_error(status, body, 409, "call_id_reused")
        status, body = await request("POST", post, json=completion(MODEL), headers=call("c3"))
        assert_openai_error(status, body, 400, "too_many_live_calls")
        assert "max_live_calls" in body["error"]["message"]
        gate.opened.set()
        assert [status for status, _ in await asyncio.gather(*held)] == [200, 200]
        status, body = await request("POST", post, json=completion(MODEL), headers=call("c1"))
        assert_openai_error(status, body, 409, "call_id_reused")  # completed: not again
        assert (await request("POST", post, json=completion(MODEL), headers=call("c3")))[0] == 200
        row = program_row((await request("GET", router.url + PROGRAMS))[1], "p")
        assert row["calls_completed"] == 3 and row["service"] == 3 * USAGE_SERVICE
        assert len(engine.posts()) == 3


# ---- dropped streams and reset connections -------------------------------------


class EndlessStream:
    """An engine answer that streams one token event every 10 ms until the router
    closes the connection, which is how vLLM learns to abort a request."""

    def __init__(self) -> None:
        self.aborted = asyncio.Event()

    async def answer(self, request: web.Request, number: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        choice = {"index": 0, "text": "x", "finish_reason": None}
        event = b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"
        try:
            while True:
                await response.write(event)
                await asyncio.sleep(0.01)
        except ConnectionResetError:  # aiohttp's "cannot write to closing transport" too
            self.aborted.set()
        return response


async def test_a_stream_the_client_drops_is_charged_and_not_completed(start_router):
    """The engine never ends the stream: only the router noticing that the client
    left can end the call, which then counts as failed, is charged what was relayed,
    and is aborted on the engine."""
    stream = EndlessStream()
    program_id = unique("dropped")
    body = completion(MODEL, stream=True)
    async with fake_engine(stream.answer) as engine, start_router([engine.url]) as router:
        async with aiohttp.ClientSession() as http:
            headers = {"X-Autellix-Program-Id": program_id}
            async with http.post(
                router.url + "/v1/completions", json=body, headers=headers
            ) as answer:
                assert answer.status == 200
                for _ in range(5):
                    assert (await answer.content.readline()).startswith(b"data: ")
                    await answer.content.readline()  # the blank line that ends the event
        await asyncio.wait_for(stream.aborted.wait(), 30)
        records = router.state.programs

        async def settled() -> None:
            while records.get(program_id).calls_active:
                await asyncio.sleep(0.02)

        await asyncio.wait_for(settled(), 30)
        row = program_row((await request("GET", router.url + PROGRAMS))[1], program_id)
    assert row["calls_completed"] == 0 and row["calls_failed"] == 1
    assert row["service"] > 0  # the prompt and the tokens relayed before the client left


async def reset_first_call(request: web.Request, number: int) -> web.StreamResponse:
    """The first call's connection is closed before any answer (a stale pooled
    connection looks the same to the router); the others are answered."""
    if number == 0:
        assert request.transport is not None
        request.transport.close()
        raise ConnectionResetError("closed before answering")
    return await answer_with_usage(request, number)


async def reset_every_call(request: web.Request, number: int) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.close()
    raise ConnectionResetError("closed before answering")


async def test_a_reset_engine_connection_is_retried_on_the_same_engine(start_router):
    async with fake_engine(reset_first_call) as engine, start_router([engine.url]) as router:
        headers = {"X-Autellix-Program-Id": "p", "X-Autellix-Call-Id": "c1"}
        status, body = await request(
            "POST", router.url + "/v1/completions", json=completion(MODEL), headers=headers
        )
        assert status == 200, body
        assert len(engine.posts()) == 2 and router.state.pool.engines[0].healthy
        row = program_row((await request("GET", router.url + PROGRAMS))[1], "p")
        assert row["calls_completed"] == 1 and row["calls_failed"] == 0
        assert row["service"] == USAGE_SERVICE
        metrics = (await request("GET", router.url + "/metrics"))[1]
        assert 'autellix_router_retries_total{engine="engine-0"} 1.0' in metrics

    # Once: an engine that resets every call is not tried forever.
    async with fake_engine(reset_every_call) as engine, start_router([engine.url]) as router:
        status, body = await request("POST", router.url + "/v1/completions", json=completion(MODEL))
        assert_openai_error(status, body, 502, "engine_unreachable")
        assert len(engine.posts()) == 2


# ---- one error shape: what the engines answer is relayed in the router's shape -------


@pytest.mark.engine
async def test_the_engines_validation_errors_reach_the_client_in_our_shape(engine, start_router):
    model = engine.served_model_name
    async with start_router([engine]) as router:
        for stream in (False, True):
            for bad in ({"max_tokens": -1}, {"temperature": -1.0}):
                body = {**completion(model), **bad, "stream": stream}
                status, answer = await request("POST", router.url + "/v1/completions", json=body)
                assert_openai_error(status, answer, 400, "invalid_request")
                assert answer["error"]["type"] == "invalid_request_error"
                assert next(iter(bad)) in answer["error"]["message"], answer  # the engine's text


# What vLLM has answered, or might, in other shapes than ours -> (status, code, message).
FOREIGN_ERRORS = [
    (401, b'{"error": "Unauthorized"}', "invalid_api_key", "Unauthorized"),
    (400, b'{"error": {"message": "bad n", "type": "BadRequestError", "code": 400}}',
     "invalid_request", "bad n"),
    (422, b'{"detail": [{"loc": ["body"], "msg": "field required"}]}', "invalid_request",
     '[{"loc": ["body"], "msg": "field required"}]'),
    (503, b"Service Unavailable", "service_unavailable", "Service Unavailable"),
    (400, b'{"error": {"message": "ours", "type": "x", "param": "p", "code": "kept"}}', "kept",
     "ours"),
]  # fmt: skip


async def test_an_engine_error_in_any_shape_is_relayed_in_ours(start_router):
    async def foreign(request: web.Request, number: int) -> web.StreamResponse:
        status, body, _, _ = FOREIGN_ERRORS[number % len(FOREIGN_ERRORS)]
        return web.Response(status=status, body=body, content_type="application/json")

    async with fake_engine(foreign) as engine, start_router([engine.url]) as router:
        for stream in (False, True):
            for status, _, code, message in FOREIGN_ERRORS:
                body = completion(MODEL, stream=stream)
                got, answer = await request("POST", router.url + "/v1/completions", json=body)
                assert_openai_error(got, answer, status, code)
                assert answer["error"]["message"] == message
