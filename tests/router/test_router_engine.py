"""The router in front of the shared real engine (tests/conftest.py ``engine``), over HTTP."""

from __future__ import annotations

import asyncio
import uuid

import aiohttp
import autellix
import openai
import pytest
from autellix_vllm.engine.launcher import free_port
from autellix_vllm.policy.config import ServiceMeter
from polling import eventually
from router_http import (
    PROGRAMS,
    assert_openai_error,
    completion,
    engine_request,
    engine_table,
    program_row,
    request,
    unique,
)

pytestmark = pytest.mark.engine


async def test_session_api_opens_lists_and_ends_programs(engine, start_router):
    model = engine.served_model_name
    async with start_router([engine]) as router:
        url = router.url
        status, opened = await request("POST", url + PROGRAMS, json={"name": "demo"})
        assert status == 200 and opened["name"] == "demo"
        program_id = opened["program_id"]
        headers = {"X-Autellix-Program-Id": program_id, "X-Autellix-Call-Id": "c1"}
        status, answer = await request(
            "POST", url + "/v1/completions", json=completion(model), headers=headers
        )
        assert status == 200, answer
        usage = answer["usage"]

        status, table = await request("GET", url + PROGRAMS)
        row = program_row(table, program_id)
        assert row["name"] == "demo" and row["engines"] == {"engine-0": 1}
        assert row["calls_completed"] == 1 and row["threads"] == 1 and row["calls_active"] == 0
        expected = ServiceMeter().amount(usage["completion_tokens"], usage["prompt_tokens"])
        assert row["service"] == pytest.approx(expected)
        assert row["last_arrival_s"] <= row["last_completion_s"]
        assert {"waiting_time", "age_s", "engine", "rebinds"} <= set(row)

        on_engine = await engine_table(engine)
        assert program_row(on_engine, program_id) is not None
        # Asked of the engine for the listed programs (an idle program's wait stays put).
        assert row["waiting_time"] == program_row(on_engine, program_id)["waiting_time"]
        status, ended = await request("DELETE", f"{url}{PROGRAMS}/{program_id}")
        assert status == 200 and ended == {"program_id": program_id, "ended": True}
        on_engine = await engine_table(engine)
        assert program_row(on_engine, program_id) is None  # ended on the engine too
        assert program_row((await request("GET", url + PROGRAMS))[1], program_id) is None

        status, body = await request(
            "POST", url + "/v1/completions", json=completion(model), headers=headers
        )
        assert_openai_error(status, body, 404, "program_ended")
        assert_openai_error(*await request("DELETE", f"{url}{PROGRAMS}/{program_id}"), 404,
                            "program_ended")  # fmt: skip
        assert_openai_error(*await request("DELETE", f"{url}{PROGRAMS}/never-issued"), 404,
                            "program_not_found")  # fmt: skip

        # An id the router never issued (the SDK's local fallback) opens a program.
        local = unique("local")
        status, _ = await request(
            "POST", url + "/v1/completions", json=completion(model),
            headers={"X-Autellix-Program-Id": local},
        )  # fmt: skip
        assert status == 200
        assert program_row((await request("GET", url + PROGRAMS))[1], local) is not None


async def test_bad_input_gets_openai_errors_and_the_router_keeps_serving(engine, start_router):
    model = engine.served_model_name
    url_path = "/v1/chat/completions"
    good = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with start_router([engine], max_body_bytes=4096) as router:
        url = router.url
        post = url + url_path
        checks = [
            (await request("POST", post, data=b"{oops", headers={"Content-Type":
                                                                 "application/json"}),
             400, "invalid_json"),
            (await request("POST", post, json={"messages": []}), 400, "missing_model"),
            (await request("POST", post, json={**good, "model": "nope"}), 404,
             "model_not_found"),
            (await request("POST", post, json={**good, "pad": "x" * 5000}), 413,
             "body_too_large"),
            (await request("POST", post, json=good, headers={"X-Autellix-Program-Id":
                                                             "x" * 200}),
             400, "invalid_identity"),
            (await request("POST", post, json=good, headers={"X-Autellix-Prior-Service":
                                                             "lots"}),
             400, "invalid_identity"),
            (await request("GET", url + "/v1/nothing"), 404, "not_found"),
            (await request("GET", post), 405, "method_not_allowed"),
            (await request("POST", url + PROGRAMS, json={"name": 5}), 400, "invalid_name"),
        ]  # fmt: skip
        for (status, body), expected_status, code in checks:
            assert_openai_error(status, body, expected_status, code)
        bad_header = checks[4][0][1]
        assert bad_header["error"]["param"] == "X-Autellix-Program-Id"

        # An engine's own error passes through with its status and body.
        status, body = await request("POST", post, json={**good, "max_tokens": -1})
        assert status == 400 and "error" in body and body["error"]["code"] != "invalid_json"

        # The model may sample its end of text first: the answer's text can be empty.
        status, answer = await request("POST", post, json=good)
        assert status == 200 and answer["choices"][0]["message"]["role"] == "assistant"
        assert 1 <= answer["usage"]["completion_tokens"] <= 2


async def test_with_an_api_key_every_route_needs_it(engine, start_router):
    key = "sk-test-" + uuid.uuid4().hex
    async with start_router([engine], api_key=key) as router:
        url = router.url
        routes = [
            ("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
            ("POST", PROGRAMS), ("GET", PROGRAMS), ("DELETE", PROGRAMS + "/x"),
            ("GET", "/autellix/v1/engines"), ("GET", "/metrics"), ("GET", "/health"),
        ]  # fmt: skip
        for method, path in routes:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": key}):
                status, body = await request(method, url + path, headers=headers, json={})
                assert_openai_error(status, body, 401, "invalid_api_key")
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=key) as client:
            models = await client.models.list()
            assert [m.id for m in models.data] == [engine.served_model_name]
            # ignore_eos: the tiny random-weight model may end after one token.
            answer = await client.completions.create(
                model=engine.served_model_name, prompt="hi", max_tokens=2,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            assert answer.usage.completion_tokens == 2
        auth = {"Authorization": f"Bearer {key}"}
        assert (await request("GET", url + PROGRAMS, headers=auth))[0] == 200


async def test_streams_pass_through_chunk_by_chunk_and_are_charged(engine, start_router):
    model = engine.served_model_name
    async with (
        start_router([engine]) as router,
        openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="-", max_retries=0) as client,
    ):
        url = router.url
        for include_usage in (False, True):
            program_id = unique("stream")
            stream = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "count"}],
                max_tokens=12,
                stream=True,
                stream_options={"include_usage": True} if include_usage else None,
                extra_body={"ignore_eos": True},
                extra_headers={"X-Autellix-Program-Id": program_id},
            )
            chunks = [chunk async for chunk in stream]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert len(chunks) >= 3 and len(text) >= 6
            usage_chunks = [c for c in chunks if c.usage is not None]
            assert len(usage_chunks) == (1 if include_usage else 0)
            row = program_row((await request("GET", url + PROGRAMS))[1], program_id)
            assert row["calls_completed"] == 1 and row["service"] >= 12


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_that_disconnects_aborts_its_engine_call(engine, start_router, stream):
    """The client leaves while the engine runs its call: the router closes the
    engine's connection and the engine aborts the call. A call can still finish
    between the look at the engine's table and the router seeing the client go
    (a 480-token call lasts ~2 s on an idle machine); then the attempt is made
    again with a fresh call."""
    model = engine.served_model_name
    program_id = unique("gone")
    body = completion(model, max_tokens=480, stream=stream)

    async def running() -> bool:
        row = program_row(await engine_table(engine), program_id)
        return row is not None and row["active_calls"] == 1

    async def idle() -> bool:
        row = program_row(await engine_table(engine), program_id)
        return row is None or row["active_calls"] == 0

    async with start_router([engine]) as router, aiohttp.ClientSession() as http:

        def call():
            headers = {"X-Autellix-Program-Id": program_id}
            return http.post(router.url + "/v1/completions", json=body, headers=headers)

        async def leave_mid_call() -> bool:
            """One attempt; False if the call ended before the engine showed it running."""
            if stream:
                async with call() as answer:
                    assert answer.status == 200
                    await answer.content.readany()  # the stream has started
                    return await running()  # leaving the block closes the connection
            task = asyncio.ensure_future(call())

            async def running_or_done() -> bool:
                return task.done() or await running()

            await eventually(running_or_done, timeout_s=20, poll_s=0.02)
            if task.done():
                (await task).close()
                return False
            task.cancel()
            return True

        for _ in range(5):
            before = (await engine_table(engine))["calls_aborted"]
            left = await leave_mid_call()
            await eventually(idle, timeout_s=20, poll_s=0.2)
            if left and (await engine_table(engine))["calls_aborted"] > before:
                break
        else:
            pytest.fail("the engine finished every call before its client left")


async def test_the_sdk_opens_and_ends_its_program_on_the_router(engine, start_router):
    async with (
        start_router([engine]) as router,
        autellix.AsyncOpenAI(base_url=router.url + "/v1", api_key="-") as client,
    ):
        url = router.url
        async with autellix.session("sdk-demo", client=client) as identity:
            await client.completions.create(
                model=engine.served_model_name, prompt="hi", max_tokens=2
            )
            row = program_row((await request("GET", url + PROGRAMS))[1],
                              identity.program_id)  # fmt: skip
            assert row["name"] == "sdk-demo" and row["calls_completed"] == 1
        table = (await request("GET", url + PROGRAMS))[1]
        assert program_row(table, identity.program_id) is None


async def test_metrics_and_a_dead_upstream(engine, start_router):
    dead = f"http://127.0.0.1:{free_port()}"
    async with start_router([engine, dead], balancer="round-robin") as router:
        url = router.url
        status, health = await request("GET", url + "/health")
        assert status == 200 and health == {"healthy_engines": ["engine-0"]}
        for i in range(3):  # round-robin over one healthy engine: no call fails
            status, _ = await request(
                "POST", url + "/v1/completions", json=completion(engine.served_model_name),
                headers={"X-Autellix-Program-Id": f"metrics-{i}"},
            )  # fmt: skip
            assert status == 200
        status, engines = await request("GET", url + "/autellix/v1/engines")
        assert [e["healthy"] for e in engines["engines"]] == [True, False]
        assert "refused" in engines["engines"][1]["last_error"]
        status, text = await request("GET", url + "/metrics")
        for line in (
            'autellix_router_engine_healthy{engine="engine-0"} 1.0',
            'autellix_router_engine_healthy{engine="engine-1"} 0.0',
            'autellix_router_calls_total{engine="engine-0",reason="round-robin"} 3.0',
            "autellix_router_programs_active 3.0",
            "autellix_router_proxy_overhead_seconds_count 3.0",
            'autellix_router_call_seconds_count{class="interactive",key="anonymous"} 3.0',
        ):
            assert line in text, line


async def test_calls_an_engine_drops_before_answering_are_retried_on_another(engine, start_router):
    """engine-0 is a closed port that the router believes healthy (as right after a
    crash, before any probe noticed): every call routed there is retried on engine-1."""
    dead = f"http://127.0.0.1:{free_port()}"
    model = engine.served_model_name
    async with start_router([dead, engine], balancer="round-robin") as router:
        pool = router.state.pool
        crashed = pool.engines[0]
        async with openai.AsyncOpenAI(
            base_url=router.url + "/v1", api_key="-", max_retries=0
        ) as client:
            for stream in (False, True, False, True):
                crashed.models = dict(pool.engines[1].models)
                pool.mark_up(crashed)
                program_id = unique("retried")
                answer = await client.completions.create(
                    model=model, prompt="hi", max_tokens=3, stream=stream,
                    extra_body={"ignore_eos": True},
                    extra_headers={"X-Autellix-Program-Id": program_id},
                )  # fmt: skip
                if stream:
                    text = "".join([chunk.choices[0].text async for chunk in answer
                                    if chunk.choices])  # fmt: skip
                    assert len(text) >= 1
                else:
                    assert answer.usage.completion_tokens == 3
                assert not crashed.healthy  # the refused connection took it out at once
                row = program_row((await request("GET", router.url + PROGRAMS))[1], program_id)
                assert row["calls_completed"] == 1 and row["calls_failed"] == 0
                assert row["engines"] == {"engine-0": 0, "engine-1": 1}
        metrics = (await request("GET", router.url + "/metrics"))[1]
        assert 'autellix_router_retries_total{engine="engine-0"} 4.0' in metrics


async def test_responses_pass_through_like_the_engine_answers_them(engine, start_router):
    body = {"model": engine.served_model_name, "input": "hello", "max_output_tokens": 4}
    direct_status, direct = await engine_request(engine, "POST", "/v1/responses", json=body)
    async with start_router([engine]) as router:
        status, routed = await request(
            "POST", router.url + "/v1/responses", json=body,
            headers={"X-Autellix-Program-Id": "responses-demo"},
        )  # fmt: skip
        assert status == direct_status
        assert type(routed) is type(direct)
        if status == 200:
            row = program_row((await request("GET", router.url + PROGRAMS))[1], "responses-demo")
            assert row["calls_completed"] == 1 and row["service"] > 0
