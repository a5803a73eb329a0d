"""OpenTelemetry traces of programs (router.tracing): the router in front of the shared
real engine (tests/conftest.py ``engine``) exports over OTLP/HTTP to a real
receiver started here (otlp_receiver), as the standard ``OTEL_*`` variables say."""

from __future__ import annotations

import os
import secrets

import aiohttp
import autellix
import pytest
from otlp_receiver import otlp_receiver
from router_http import PROGRAMS, completion, request, unique

pytestmark = pytest.mark.engine


@pytest.fixture
def otel_environment(monkeypatch):
    """No OTEL_* variable of the machine's; ``set(endpoint)`` asks for traces there,
    exported at once (a batch every 50 ms)."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)

    def ask_for_traces(endpoint: str) -> None:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")

    return ask_for_traces


async def test_an_sdk_program_is_one_trace_of_a_program_span_and_its_call_spans(
    engine, start_router, otel_environment
):
    model = engine.served_model_name
    async with otlp_receiver() as receiver:
        otel_environment(receiver.url)
        async with (
            start_router([engine]) as router,
            autellix.AsyncOpenAI(base_url=router.url + "/v1", api_key="-") as client,
            autellix.session("traced", client=client) as identity,
        ):
            await client.completions.create(model=model, prompt="one", max_tokens=3,
                                            extra_body={"ignore_eos": True})  # fmt: skip
            stream = await client.completions.create(
                model=model, prompt="two", max_tokens=4, stream=True,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            async for _ in stream:
                pass
        # The router stopped: its tracer was shut down, every span exported.

    (program,) = [s for s in receiver.named("autellix.program")
                  if s.attributes["autellix.program.id"] == identity.program_id]  # fmt: skip
    assert program.parent_span_id == ""  # no client trace: the program's own
    assert program.resource["service.name"] == "autellix-router"
    assert program.attributes["autellix.program.name"] == "traced"
    assert program.attributes["autellix.owner"] == "anonymous"
    assert program.attributes["autellix.program.calls_completed"] == 2
    assert program.attributes["autellix.program.engines"] == ["engine-0"]
    assert program.attributes["autellix.program.service"] > 0

    calls = [s for s in receiver.named("autellix.call") if s.trace_id == program.trace_id]
    assert len(calls) == 2
    first, second = sorted(calls, key=lambda s: s.attributes["autellix.program.service"])
    for call, output_tokens in ((first, 3), (second, 4)):
        attributes = call.attributes
        assert call.parent_span_id == program.span_id
        assert attributes["autellix.program.id"] == identity.program_id
        assert attributes["autellix.thread.id"] == identity.thread_id
        assert attributes["autellix.owner"] == "anonymous"
        assert attributes["autellix.engine"] == "engine-0"
        assert attributes["autellix.call.completed"] is True
        assert attributes["autellix.call.service"] > 0
        assert attributes["autellix.call.wait_s"] >= 0 and attributes["autellix.call.decode_s"] > 0
        assert attributes["gen_ai.operation.name"] == "text_completion"
        assert attributes["gen_ai.request.model"] == model
        assert attributes["gen_ai.usage.output_tokens"] == output_tokens
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["http.response.status_code"] == 200
    # The second call's program had the first call's service when it arrived.
    assert first.attributes["autellix.program.service"] == 0
    assert second.attributes["autellix.program.service"] == pytest.approx(
        first.attributes["autellix.call.service"]
    )


async def test_a_call_with_a_client_traceparent_joins_the_clients_trace(
    engine, start_router, otel_environment
):
    client_trace, client_span = secrets.token_hex(16), secrets.token_hex(8)
    program_id = unique("joined")
    headers = {"traceparent": f"00-{client_trace}-{client_span}-01",
               "X-Autellix-Program-Id": program_id, "X-Autellix-Thread-Id": "main"}  # fmt: skip
    async with otlp_receiver() as receiver:
        otel_environment(receiver.url)
        async with start_router([engine]) as router, aiohttp.ClientSession() as http:
            body = completion(engine.served_model_name)
            async with http.post(router.url + "/v1/completions", json=body,
                                 headers=headers) as answer:  # fmt: skip
                assert answer.status == 200, await answer.text()
                answered_with = answer.headers["traceparent"]
            status, _ = await request("DELETE", f"{router.url}{PROGRAMS}/{program_id}")
            assert status == 200

    (call,) = [s for s in receiver.named("autellix.call")
               if s.attributes.get("autellix.program.id") == program_id]  # fmt: skip
    assert (call.trace_id, call.parent_span_id) == (client_trace, client_span)
    assert answered_with == f"00-{client_trace}-{call.span_id}-01"
    (program,) = [s for s in receiver.named("autellix.program")
                  if s.attributes["autellix.program.id"] == program_id]  # fmt: skip
    # The program began under the client's span too, and the call links to it.
    assert (program.trace_id, program.parent_span_id) == (client_trace, client_span)
    assert call.links == [(client_trace, program.span_id)]


async def test_without_the_otel_variables_the_router_has_no_tracer_and_exports_nothing(
    engine, start_router, otel_environment, monkeypatch
):
    async with otlp_receiver() as receiver:
        # An endpoint, but the SDK disabled: the specification's off switch.
        otel_environment(receiver.url)
        monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
        async with start_router([engine]) as router, aiohttp.ClientSession() as http:
            assert router.state.dispatcher.tracer is None
            headers = {"X-Autellix-Program-Id": unique("untraced")}
            body = completion(engine.served_model_name)
            async with http.post(router.url + "/v1/completions", json=body,
                                 headers=headers) as answer:  # fmt: skip
                assert answer.status == 200
                assert "traceparent" not in answer.headers
    assert receiver.requests == 0
