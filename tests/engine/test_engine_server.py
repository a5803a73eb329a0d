"""Against one real vLLM CPU engine (tests/conftest.py ``engine``), over real HTTP."""

import asyncio
import uuid
from urllib.parse import quote

import aiohttp
import openai
import pytest
from autellix_vllm.policy import ALONE_PREFIX

pytestmark = pytest.mark.engine

PREFILL_WEIGHT = 0.0625  # the policy's default token-equivalent of a prefilled token


@pytest.fixture
async def client(engine):
    base_url = engine.base_url + "/v1"
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        yield client


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def get_table(engine) -> dict:
    url = engine.base_url + "/autellix/v1/engine/table"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        return await response.json()


def find(table, program_id):
    return next((p for p in table["programs"] if p["program_id"] == program_id), None)


async def run_program(client, model, program_id, threads, calls_per_thread, max_tokens):
    """Sequential calls per thread, threads concurrent; returns the expected service."""

    async def thread(thread_id):
        service = 0.0
        for n in range(calls_per_thread):
            headers = {
                "X-Autellix-Program-Id": program_id,
                "X-Autellix-Thread-Id": thread_id,
                "X-Autellix-Call-Id": f"{thread_id}-{n}",
            }
            answer = await client.completions.create(
                model=model,
                prompt=f"step {n} of {thread_id}: think",
                max_tokens=max_tokens,
                extra_body={"ignore_eos": True},
                extra_headers=headers,
            )
            usage = answer.usage
            assert usage.completion_tokens == max_tokens
            # One token is sampled per step; every other computed token is prefill
            # (prompts are shorter than one 128-token block: no prefix-cache hits).
            service += usage.completion_tokens + PREFILL_WEIGHT * (usage.prompt_tokens - 1)
        return service

    return sum(await asyncio.gather(*(thread(t) for t in threads)))


async def test_concurrent_programs_appear_in_the_table_with_their_service(engine, client):
    programs = {unique("solo"): ["main"], unique("duo"): ["main", "side"], unique("trio"): ["t"]}
    expected = await asyncio.gather(
        *(
            run_program(client, engine.served_model_name, pid, threads, 2, max_tokens=12)
            for pid, threads in programs.items()
        )
    )
    table = await get_table(engine)
    assert table["enabled"] is True and table["scheduler"] == "AutellixScheduler"
    for (pid, threads), service in zip(programs.items(), expected, strict=True):
        entry = find(table, pid)
        assert entry is not None, pid
        assert entry["calls_completed"] == 2 * len(threads)
        assert entry["threads"] == len(threads)
        assert entry["active_calls"] == 0
        assert entry["attained_service"] == pytest.approx(service)
    assert table["calls_finished"] >= 8
    assert len(table["queue_depth"]) >= 2


async def test_ending_a_program_removes_it(engine, client):
    pid = unique("ending")
    await run_program(client, engine.served_model_name, pid, ["main"], 1, max_tokens=2)
    assert find(await get_table(engine), pid) is not None
    url = f"{engine.base_url}/autellix/v1/engine/programs/{pid}"
    async with aiohttp.ClientSession() as http:
        async with http.delete(url) as response:
            assert response.status == 200
            assert await response.json() == {"program_id": pid, "ended": True}
        async with http.delete(url) as response:
            assert response.status == 404
            error = (await response.json())["error"]
            assert (error["param"], error["code"]) == ("program_id", "program_not_found")
    assert find(await get_table(engine), pid) is None


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("X-Autellix-Prior-Service", "-1"),
        ("X-Autellix-Prior-Service", "lots"),
        ("X-Autellix-Program-Id", "p" * 129),
        # (HTTP itself forbids most control characters in headers; tab gets through.)
        ("X-Autellix-Thread-Id", "tab\there"),
    ],
)
async def test_malformed_identity_headers_get_an_openai_400(engine, client, header, value):
    pid = unique("rejected")
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(
            model=engine.served_model_name,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            extra_headers={"X-Autellix-Program-Id": pid, header: value},
        )
    assert info.value.status_code == 400
    error = info.value.body
    assert error["type"] == "invalid_request_error" and error["param"] == header
    assert error["code"] == "invalid_identity"
    assert find(await get_table(engine), pid) is None  # never reached the engine


async def test_malformed_identity_in_the_body_gets_an_openai_400(engine, client):
    pid = unique("rejected")
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(
            model=engine.served_model_name,
            prompt="hi",
            max_tokens=2,
            extra_body={"vllm_xargs": {"autellix_program_id": pid, "autellix_call_id": "a\x00b"}},
        )
    assert info.value.body["param"] == "vllm_xargs.autellix_call_id"
    assert find(await get_table(engine), pid) is None


async def test_calls_without_identity_are_served_and_counted(engine, client):
    before = (await get_table(engine))["calls_without_identity"]
    answer = await client.chat.completions.create(
        model=engine.served_model_name,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
    )
    assert answer.choices[0].message.content is not None
    table = await get_table(engine)
    assert table["calls_without_identity"] == before + 1
    assert not any(p["program_id"].startswith(ALONE_PREFIX) for p in table["programs"])


async def test_table_counters_are_on_prometheus_metrics(engine, client):
    await run_program(client, engine.served_model_name, unique("metered"), ["m"], 1, 2)
    finished = (await get_table(engine))["calls_finished"]
    async with aiohttp.ClientSession() as http:
        for _ in range(20):  # refreshed from the engine about once a second
            async with http.get(engine.base_url + "/metrics") as response:
                text = await response.text()
            values = [
                float(line.split()[-1])
                for line in text.splitlines()
                if line.startswith("autellix_calls_finished_total ")
            ]
            if values and values[0] >= finished:
                break
            await asyncio.sleep(0.25)
    assert values and values[0] >= finished
    assert 'autellix_queue_depth{level="0"}' in text
    assert "autellix_preemptions_total" in text


# ---- an engine without a key: identity groups calls, prior service is ignored ------


async def post_chat(engine, headers=None, body=None, **extra):
    """POST a chat completion; returns (status, JSON answer)."""
    payload = body or {
        "model": engine.served_model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        **extra,
    }
    url = engine.base_url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json=payload, headers=headers) as r:
        return r.status, await r.json()


async def test_a_forged_prior_service_does_not_move_a_victim(engine, client):
    victim = unique("victim")
    await run_program(client, engine.served_model_name, victim, ["main"], 1, max_tokens=4)
    before = find(await get_table(engine), victim)["attained_service"]
    forged = {"X-Autellix-Program-Id": victim, "X-Autellix-Prior-Service": "1e308"}
    status, _ = await post_chat(engine, forged, vllm_xargs={"autellix_prior_service": 1e300})
    assert status == 200
    table = await get_table(engine)
    assert table["prior_service_trusted"] is False
    # Only the forged call's own few tokens were added.
    assert before < find(table, victim)["attained_service"] < before + 10


async def test_a_utf8_program_id_is_stored_as_sent_and_ends_by_that_id(engine):
    pid = unique("ï-é🙂")
    status, _ = await post_chat(engine, {"X-Autellix-Program-Id": pid})
    assert status == 200
    assert find(await get_table(engine), pid) is not None
    url = f"{engine.base_url}/autellix/v1/engine/programs/{quote(pid)}"
    async with aiohttp.ClientSession() as http, http.delete(url) as response:
        assert response.status == 200 and (await response.json())["program_id"] == pid
    assert find(await get_table(engine), pid) is None


async def test_a_body_nested_too_deeply_is_a_json_400(engine):
    url = engine.base_url + "/v1/chat/completions"
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=b"[" * 100_000, headers=headers) as response:
            assert response.status == 400
            error = (await response.json())["error"]
            assert error["code"] == "invalid_json"
        async with http.get(engine.base_url + "/health") as response:
            assert response.status == 200


async def test_a_dropped_stream_is_charged_what_it_computed_and_counted_aborted(engine):
    """The client leaves mid-stream; the engine aborts the call, charges what it
    computed and counts it aborted.

    A precondition the test cannot force: the engine must still be running the
    call when the abort reaches it. The tiny model generates its 480 tokens in
    ~0.3 s after the first, and the abort leaves vLLM's API server only when it
    next writes to the closed connection, so on a loaded machine the engine had
    sometimes finished before (then it rightly counts the call completed). That
    is told apart for sure from the table (completed, charged in full: checked
    too), and a fresh call is made; every check of a dropped call is unchanged."""
    url = engine.base_url + "/v1/completions"
    for _ in range(5):
        pid = unique("dropped")
        payload = {
            "model": engine.served_model_name,
            "prompt": "tell me everything",
            "max_tokens": 480,
            "ignore_eos": True,
            "stream": True,
        }
        headers = {"X-Autellix-Program-Id": pid}
        tokens_seen = 0
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, json=payload, headers=headers) as r,
        ):
            assert r.status == 200
            async for line in r.content:
                tokens_seen += line.startswith(b"data: {")
                if tokens_seen == 3:
                    break  # the client goes away mid-stream
        for _ in range(300):
            entry = find(await get_table(engine), pid)
            if entry is not None and entry["active_calls"] == 0:
                break
            await asyncio.sleep(0.1)
        assert entry is not None and entry["active_calls"] == 0, entry
        if entry["calls_completed"] == 0:
            break
        # The engine had generated every token before the abort reached it.
        assert (entry["calls_aborted"], entry["calls_completed"]) == (0, 1)
        assert entry["attained_service"] >= 480
    else:
        pytest.fail("the engine finished all 5 calls before the client's abort reached it")
    assert (entry["calls_aborted"], entry["calls_completed"]) == (1, 0)
    # Its prefill and the tokens decoded so far: at least those the client saw, not all.
    assert tokens_seen + 1 <= entry["attained_service"] < 480


async def test_the_issue_chain_of_1101_threads_leaves_the_engine_up(engine):
    pid = unique("chain")
    url = engine.base_url + "/v1/completions"

    async def call(http, thread, parent):
        headers = {"X-Autellix-Program-Id": pid, "X-Autellix-Thread-Id": thread}
        if parent:
            headers["X-Autellix-Parent-Thread-Id"] = parent
        body = {"model": engine.served_model_name, "prompt": "x", "max_tokens": 1}
        async with http.post(url, json=body, headers=headers) as response:
            assert response.status == 200, await response.text()

    before = await get_table(engine)
    async with aiohttp.ClientSession() as http:
        for k in range(1101):
            await call(http, f"t{k}", f"t{k - 1}" if k else None)
        await call(http, "t0", None)  # the call whose join walked the whole chain
        async with http.get(engine.base_url + "/health") as response:
            assert response.status == 200
    table = await get_table(engine)
    over_limit = table["calls_over_limit"].get("max_fork_depth", 0)
    over_limit -= before.get("calls_over_limit", {}).get("max_fork_depth", 0)
    assert find(table, pid)["calls_completed"] + over_limit == 1102
    assert over_limit == 1100 // 65
    assert table["hook_failures"] == {}


async def test_the_table_answers_a_summary_or_the_rows_asked_for(engine):
    pid = unique("asked")
    url = engine.base_url + "/autellix/v1/engine/table"
    body = {"model": engine.served_model_name, "prompt": "x", "max_tokens": 2}
    async with aiohttp.ClientSession() as http:
        headers = {"X-Autellix-Program-Id": pid}
        async with http.post(engine.base_url + "/v1/completions", json=body, headers=headers) as r:
            assert r.status == 200
        async with http.get(url, params={"summary": "1"}) as r:
            summary = await r.json()
        assert summary["programs"] == [] and summary["programs_count"] >= 1
        assert {"waiting", "running", "service_unit", "queue_depth"} <= set(summary)
        async with http.post(url, json={"program_ids": [pid, unique("nobody")]}) as r:
            asked = await r.json()
        assert [p["program_id"] for p in asked["programs"]] == [pid]
        assert asked["programs"][0]["calls_completed"] == 1
        for bad in ({"program_ids": "p"}, {"program_ids": ["x"] * 1001}, {"program_ids": [""]}):
            async with http.post(url, json=bad) as r:
                assert r.status == 400
                assert (await r.json())["error"]["code"] == "invalid_parameter"
        async with http.get(url, params={"summary": "yes"}) as r:
            assert r.status == 400
