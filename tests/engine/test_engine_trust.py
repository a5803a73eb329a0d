"""An engine started with a key (as ``autellix serve`` starts its engines): only
the key's holder states prior service or reaches ``/autellix/v1/engine/*``.

Its own engine (module-scoped), since the shared one of tests/conftest.py has no key.
"""

import uuid

import aiohttp
import pytest

pytestmark = pytest.mark.engine

KEY = "trust-test-" + uuid.uuid4().hex
AUTHORIZED = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def keyed_engine(running_engine):
    # The launcher hands the key to vLLM (--api-key) and to the extension.
    with running_engine("keyed-engine", model="tiny", api_key=KEY) as process:
        yield process


async def request(engine, method, path, headers=None, json=None):
    url = engine.base_url + path
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url, headers=headers, json=json) as response,
    ):
        return response.status, await response.json(content_type=None)


async def table(engine):
    status, body = await request(engine, "GET", "/autellix/v1/engine/table", AUTHORIZED)
    assert status == 200
    return body


def find(snapshot, program_id):
    return next((p for p in snapshot["programs"] if p["program_id"] == program_id), None)


async def chat(engine, headers, **extra):
    body = {
        "model": engine.served_model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        **extra,
    }
    return await request(engine, "POST", "/v1/chat/completions", headers, body)


async def test_the_engine_endpoints_need_the_key(keyed_engine):
    for method, path in [
        ("GET", "/autellix/v1/engine/table"),
        ("DELETE", "/autellix/v1/engine/programs/someone"),
    ]:
        for headers in (None, {"Authorization": "Bearer not-the-key"}):
            status, body = await request(keyed_engine, method, path, headers)
            assert status == 401, (method, path, headers)
            assert body["error"]["type"] == "authentication_error"
            assert body["error"]["code"] == "invalid_api_key"
    assert (await table(keyed_engine))["prior_service_trusted"] is True


async def test_a_forged_prior_service_cannot_reach_the_victim(keyed_engine):
    victim = "victim-" + uuid.uuid4().hex[:8]
    status, _ = await chat(keyed_engine, {**AUTHORIZED, "X-Autellix-Program-Id": victim})
    assert status == 200
    before = find(await table(keyed_engine), victim)["attained_service"]
    forged = {"X-Autellix-Program-Id": victim, "X-Autellix-Prior-Service": "1e308"}
    status, body = await chat(keyed_engine, forged, vllm_xargs={"autellix_prior_service": 1e300})
    assert status == 401  # vLLM's own --api-key guards /v1/*
    assert find(await table(keyed_engine), victim)["attained_service"] == before


async def test_the_key_holder_states_prior_service_within_the_limit(keyed_engine):
    from autellix_vllm.policy import DEFAULT_LIMITS

    program = "routed-" + uuid.uuid4().hex[:8]
    headers = {**AUTHORIZED, "X-Autellix-Program-Id": program, "X-Autellix-Prior-Service": "40"}
    assert (await chat(keyed_engine, headers))[0] == 200
    assert find(await table(keyed_engine), program)["attained_service"] >= 40
    huge = {**headers, "X-Autellix-Prior-Service": "1e308"}
    assert (await chat(keyed_engine, huge))[0] == 200
    entry = find(await table(keyed_engine), program)
    assert entry["attained_service"] < DEFAULT_LIMITS.max_prior_service + 100
    assert entry["attained_service"] >= DEFAULT_LIMITS.max_prior_service


# ---- one error shape: vLLM's own error answers are rewritten into ours ---------------


def assert_error_shape(status, body, expected_status, code):
    assert status == expected_status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code, body
    assert body["error"]["message"], body


async def test_vllms_own_401_has_our_error_shape(keyed_engine):
    # vLLM's --api-key check answers {"error": "Unauthorized"} on its own routes.
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
        for headers in (None, {"Authorization": "Bearer not-the-key"}):
            status, body = await request(keyed_engine, method, path, headers, json={})
            assert_error_shape(status, body, 401, "invalid_api_key")
            assert body["error"]["type"] == "authentication_error"
            assert body["error"]["message"] == "Unauthorized"  # vLLM's text, kept


async def test_vllms_validation_errors_have_a_string_code_and_keep_their_message(keyed_engine):
    # vLLM answers these with {"error": {..., "code": 400}}: an integer code.
    for bad in ({"max_tokens": -1}, {"temperature": -1.0}):
        status, body = await chat(keyed_engine, AUTHORIZED, **bad)
        assert_error_shape(status, body, 400, "invalid_request")
        assert body["error"]["type"] == "invalid_request_error"
        assert next(iter(bad)) in body["error"]["message"], body  # vLLM's message, kept
    status, body = await request(keyed_engine, "GET", "/v1/no-such-route", AUTHORIZED)
    assert_error_shape(status, body, 404, "not_found")
    # A stream passes through unchanged, event by event.
    url = keyed_engine.base_url + "/v1/chat/completions"
    payload = {
        "model": keyed_engine.served_model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": True,
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, headers=AUTHORIZED, json=payload) as response,
    ):
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        text = (await response.read()).decode()
    assert text.rstrip().endswith("data: [DONE]")
