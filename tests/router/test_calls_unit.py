"""Reading calls, counting prompt tokens and service, relaying streams (no HTTP)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from autellix_vllm.cli.ps import format_keys, format_table, human_duration
from autellix_vllm.policy.config import ServiceMeter
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.router.calls import estimate_prompt_tokens, read_call
from autellix_vllm.router.errors import ApiError
from autellix_vllm.router.usage import SseRelay, service_from_usage
from multidict import CIMultiDict

CHAT = "/v1/chat/completions"
MODELS = {"m"}


def read(body: object, headers: dict[str, str] | None = None, path: str = CHAT, raw=None):
    raw = raw if raw is not None else json.dumps(body).encode()
    return read_call(path, raw, CIMultiDict(headers or {}), MODELS, chars_per_token=4.0)


def api_error(body: object, headers: dict[str, str] | None = None, raw=None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        read(body, headers, raw=raw)
    return caught.value


def test_bad_bodies_are_4xx_with_a_param():
    assert api_error(None, raw=b"{not json").code == "invalid_json"
    assert api_error(None, raw=b"[1, 2]").code == "invalid_json"
    missing = api_error({"messages": []})
    assert (missing.status, missing.code, missing.param) == (400, "missing_model", "model")
    unknown = api_error({"model": "gpt-9"})
    assert (unknown.status, unknown.code) == (404, "model_not_found")
    assert unknown.message == "the model 'gpt-9' does not exist; this router serves 'm'"
    assert api_error({"model": 7}).status == 400


@pytest.mark.parametrize(
    ("headers", "param"),
    [
        ({"X-Autellix-Program-Id": ""}, "X-Autellix-Program-Id"),
        ({"X-Autellix-Thread-Id": "x" * 129}, "X-Autellix-Thread-Id"),
        ({"X-Autellix-Call-Id": "a\x01b"}, "X-Autellix-Call-Id"),
        ({"X-Autellix-Prior-Service": "-1"}, "X-Autellix-Prior-Service"),
        ({"X-Session-ID": ""}, "X-Session-ID"),
        ({"X-Autellix-Retention-Ttl": "-5"}, "X-Autellix-Retention-Ttl"),
    ],
)
def test_malformed_identity_headers_are_400(headers, param):
    error = api_error({"model": "m"}, headers)
    assert (error.status, error.code, error.param) == (400, "invalid_identity", param)


def test_malformed_identity_in_the_body_is_400():
    error = api_error({"model": "m", "vllm_xargs": {"autellix_program_id": 5}})
    assert error.param == "vllm_xargs.autellix_program_id"
    assert api_error({"model": "m", "session_id": ""}).param == "session_id"
    # As on the engines: a malformed body value is refused even where a header wins.
    body = {"model": "m", "vllm_xargs": {"autellix_call_id": "x" * 200}}
    error = api_error(body, {"X-Autellix-Call-Id": "c1"})
    assert (error.code, error.param) == ("invalid_identity", "vllm_xargs.autellix_call_id")


def test_identity_comes_from_headers_then_body_then_session():
    body = {"model": "m", "vllm_xargs": {"autellix_program_id": "body", "autellix_call_id": "c"}}
    assert read(body, {"X-Autellix-Program-Id": "header"}).identity.program_id == "header"
    from_body = read(body, {"X-Session-ID": "session"})
    assert (from_body.identity.program_id, from_body.identity.call_id) == ("body", "c")
    assert read({"model": "m"}, {"x-session-id": "session"}).identity.program_id == "session"
    assert read({"model": "m", "session_id": "s2"}).identity.program_id == "s2"
    assert read({"model": "m"}).identity.program_id is None


def test_an_agent_hint_names_the_program_last_and_stays_in_the_body():
    hint = {"session_id": "sub-7", "parent_session_id": "sess-1"}
    call = read({"model": "m", "agent_hint": hint})
    assert call.identity == CallIdentity("sess-1", "sub-7", "main")
    assert json.loads(call.raw)["agent_hint"] == hint
    assert (
        read({"model": "m", "agent_hint": hint}, {"X-Session-ID": "s"}).identity.program_id == "s"
    )
    error = api_error({"model": "m", "agent_hint": {"cache_control": {"ttl": "later"}}})
    assert (error.status, error.param) == (400, "agent_hint.cache_control.ttl")


def test_the_call_carries_the_identity_without_the_clients_prior_service_or_owner():
    headers = {"X-Autellix-Program-Id": "p", "X-Autellix-Prior-Service": "1e9",
               "X-Autellix-Owner": "key-someone-else"}  # fmt: skip
    body = {"model": "m", "vllm_xargs": {"autellix_owner": "key-x", "mine": 1}}
    call = read(body, headers)
    assert call.identity == CallIdentity("p")
    assert json.loads(call.raw)["vllm_xargs"] == {"mine": 1}


def test_the_retention_hint_is_read_as_sent_and_its_body_key_stripped():
    """The engine clamps the hint to its own residency bounds; the router keeps no copy."""
    body = {"model": "m", "vllm_xargs": {"autellix_retention_ttl_s": 30, "top_k": 5}}
    call = read(body)
    assert call.identity.retention_ttl_s == 30.0
    assert json.loads(call.raw)["vllm_xargs"] == {"top_k": 5}  # the router restates it
    hinted = read({"model": "m"}, {"X-Autellix-Retention-Ttl": "1h"})
    assert hinted.identity.retention_ttl_s == 3600.0
    assert read({"model": "m"}, {"X-Autellix-Retention-Ttl": "0"}).identity.retention_ttl_s == 0
    hint = {"model": "m", "agent_hint": {"cache_control": {"ttl": "10s"}}}
    assert read(hint).identity.retention_ttl_s == 10.0
    assert read({"model": "m"}).identity.retention_ttl_s is None


def test_prompt_tokens_are_estimated_from_characters_or_counted_from_ids():
    chat = {
        "messages": [
            {"role": "system", "content": "x" * 400},
            {"role": "user", "content": [{"type": "text", "text": "y" * 399}]},
        ]
    }
    assert estimate_prompt_tokens(CHAT, chat, 4.0) == 200
    assert estimate_prompt_tokens(CHAT, chat, 1.0) == 799
    assert estimate_prompt_tokens("/v1/completions", {"prompt": [1] * 3000}, 4.0) == 3000
    assert estimate_prompt_tokens("/v1/completions", {"prompt": [[1, 2], [3]]}, 4.0) == 3
    assert estimate_prompt_tokens("/v1/completions", {"prompt": "z" * 10}, 4.0) == 3
    responses = {"input": [{"role": "user", "content": "a" * 8}], "instructions": "b" * 4}
    assert estimate_prompt_tokens("/v1/responses", responses, 4.0) == 3
    tools = {"messages": [], "tools": [{"type": "function", "function": {"name": "f" * 40}}]}
    assert estimate_prompt_tokens(CHAT, tools, 1.0) > 40


def test_a_stream_asks_for_usage_unless_the_client_did():
    injected = read({"model": "m", "stream": True})
    assert injected.usage_injected
    assert json.loads(injected.raw)["stream_options"] == {"include_usage": True}
    asked = read({"model": "m", "stream": True, "stream_options": {"include_usage": True}})
    assert not asked.usage_injected
    assert not read({"model": "m"}).usage_injected


def test_service_is_the_service_meters_token_equivalents():
    meter = ServiceMeter()
    chat = {"prompt_tokens": 160, "completion_tokens": 10}
    assert service_from_usage(chat, meter) == meter.amount(10, 160)
    cached = {**chat, "prompt_tokens_details": {"cached_tokens": 128}}
    assert service_from_usage(cached, meter) == meter.amount(10, 32)
    assert service_from_usage({"input_tokens": 16, "output_tokens": 2}, meter) == 3.0
    assert service_from_usage(None, meter) is None
    assert service_from_usage({"prompt_tokens": "x"}, meter) is None


class FakeResponse:
    def __init__(self) -> None:
        self.written = b""

    async def write(self, data: bytes) -> None:
        self.written += data


def sse(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


async def test_the_relay_forwards_events_and_drops_only_the_usage_it_asked_for():
    usage = {"prompt_tokens": 16, "completion_tokens": 2}
    chunks = [
        sse({"choices": [{"delta": {"content": "a"}}], "usage": None}),
        sse({"choices": [], "usage": usage}),
        b"data: [DONE]\n\n",
    ]
    stream = b"".join(chunks)
    for drop in (True, False):
        response = FakeResponse()
        relay = SseRelay(response, ServiceMeter(), drop_usage=drop)  # type: ignore[arg-type]
        for i in range(0, len(stream), 7):  # events split across chunks
            await relay.feed(stream[i : i + 7])
        await relay.finish()
        assert relay.service == 3.0
        expected = chunks[0] + chunks[2] if drop else stream
        assert response.written == expected


async def test_the_relay_reads_a_response_streams_usage_and_crlf_events():
    response = FakeResponse()
    relay = SseRelay(response, ServiceMeter(), drop_usage=False)  # type: ignore[arg-type]
    done = {"type": "response.completed", "response": {"usage": {"input_tokens": 32,
                                                                 "output_tokens": 4}}}  # fmt: skip
    event = b"event: response.completed\r\ndata: " + json.dumps(done).encode() + b"\r\n\r\n"
    await relay.feed(event + b"data: tail")
    await relay.finish()
    assert relay.service == 6.0 and response.written == event + b"data: tail"


def test_ps_prints_one_row_per_program_and_marks_dead_engines():
    table = {
        "balancer": "locality",
        "engines": [
            {"name": "engine-0", "healthy": True, "load": 2},
            {"name": "engine-1", "healthy": False, "load": 0},
        ],  # fmt: skip
        "programs": [
            {
                "program_id": "young",
                "name": "agent",
                "engine": "engine-0",
                "threads": 2,
                "calls_active": 1,
                "calls_completed": 5,
                "service": 12.5,
                "waiting_time": 3.0,
                "age_s": 5,
                "owner": "alice",
                "class": "batch",
            },  # fmt: skip
            {"program_id": "old", "name": None, "engine": "engine-1", "age_s": 4000},
            # Short prompts bind to no engine: ENGINE names where its calls ran.
            {"program_id": "short", "engine": None, "engines": {"engine-1": 1, "engine-0": 2},
             "age_s": 3},
            {"program_id": "new", "engine": None, "engines": {}, "age_s": 1},
        ],
    }
    lines = format_table(table).splitlines()
    assert lines[0].startswith("4 programs  locality  engine-0 up load 2  engine-1 DOWN")
    assert lines[1].split() == [
        "PROGRAM", "NAME", "CLASS", "ENGINE", "THR", "RUN", "CALLS", "SERVICE", "WAIT", "AGE",
        "OWNER",
    ]  # fmt: skip
    assert lines[2].split() == [
        "old", "-", "-", "engine-1!", "0", "0", "0", "0.0", "0.0", "1h06m", "-",
    ]  # fmt: skip
    assert lines[3].split() == [
        "young", "agent", "batch", "engine-0", "2", "1", "5", "12.5", "3.0", "5s", "alice",
    ]  # fmt: skip
    assert lines[4].split()[:4] == ["short", "-", "-", "engine-0*,engine-1*!"]
    assert lines[5].split()[:4] == ["new", "-", "-", "-"]
    assert format_table(table, sort_by="service").splitlines()[2].startswith("young")
    assert [human_duration(s) for s in (0, 59, 61, 7322)] == ["0s", "59s", "1m01s", "2h02m"]


def test_ps_prints_each_keys_class_weight_and_share():
    keys = [
        {"name": "chat", "class": "interactive", "weight": 1.0, "service": 30.0, "share": 30.0,
         "programs": 2},
        {"name": "nightly", "class": "batch", "weight": 2.5, "service": 50.0, "share": 20.0,
         "programs": 7},
    ]  # fmt: skip
    lines = format_keys(keys).splitlines()
    assert lines[1].split() == ["KEY", "CLASS", "WEIGHT", "SERVICE", "SHARE", "PROGRAMS"]
    assert lines[2].split() == ["chat", "interactive", "1", "30.0", "30.0", "2"]
    assert lines[3].split() == ["nightly", "batch", "2.5", "50.0", "20.0", "7"]


def test_the_overhead_benchmark_reads_a_histograms_median():
    from autellix_vllm.bench.router_overhead import histogram_median_ms
    from autellix_vllm.router.metrics import RouterMetrics

    metrics = RouterMetrics()
    for seconds in (0.0002, 0.0002, 0.0004, 0.004):
        metrics.proxy_overhead.observe(seconds)
    text = metrics.render().decode()
    median = histogram_median_ms(text, "autellix_router_proxy_overhead_seconds")
    assert 0.1 <= median <= 0.25  # two of four samples lie in (0.1 ms, 0.25 ms]
    assert histogram_median_ms("", "autellix_router_proxy_overhead_seconds") is None


def test_reading_calls_loads_no_aiohttp_until_the_app_is_asked_for():
    """The plain modules the Ray ingress shares load without the HTTP server's
    library; the package's ``create_app`` still imports it on first use."""
    check = (
        "import sys\n"
        "import autellix_vllm.router.calls, autellix_vllm.router.params\n"
        "import autellix_vllm.router.admission, autellix_vllm.router.usage\n"
        "assert 'aiohttp' not in sys.modules, 'aiohttp loaded early'\n"
        "from autellix_vllm.router import create_app\n"
        "assert 'aiohttp' in sys.modules and callable(create_app)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
