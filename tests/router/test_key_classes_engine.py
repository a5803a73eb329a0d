"""A key's class and weight on the real engine behind a real router.

The keys file gives ``nightly`` the batch class and weight 3 and ``chat`` the
defaults; their calls must reach the engine with those bands and weights (read
back from the engine's table), a body ``priority`` must ask for a band by the
header's rule on the router and on the engine reached directly, and with one
seat a batch key's queued calls must wait behind an interactive call that
arrived after them.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from autellix_vllm.router.keys import owner_of
from router_http import (
    PROGRAMS,
    completion,
    engine_request,
    engine_table,
    keys_file_with,
    program_row,
    request,
    unique,
)

pytestmark = pytest.mark.engine

ENGINE_KEY = "key-classes-engine-key"
KEYS = "chat: sk-chat\nnightly: sk-nightly class=batch weight=3\n"
ADMIN_KEY = "sk-classes-admin"
# Room for batch calls long enough that they are still queued when the
# interactive call comes: on a loaded machine the API server hands the engine
# its calls slowly, and its table answers slowly.
MAX_MODEL_LEN = 1024
BATCH_TOKENS = 960
# For the order: the batch key by its class alone, the chat key's share 20 times
# its service, so that the share between keys does not put the agent first.
ORDER_KEYS = "chat: sk-chat weight=0.05\nnightly: sk-nightly class=batch\n"


@pytest.fixture(scope="module")
def engine(running_engine):
    """One seat, so that calls queue at the engine; an engine key, as ``autellix
    serve`` starts them, so that it takes the band and weight from the router."""
    with running_engine(
        "classes-engine", api_key=ENGINE_KEY, max_num_seqs=1, max_model_len=MAX_MODEL_LEN
    ) as process:
        yield process


@pytest.fixture
def keys_file(tmp_path: Path) -> str:
    return keys_file_with(tmp_path, KEYS)


def as_key(key: str, program_id: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"}
    return headers | ({"X-Autellix-Program-Id": program_id} if program_id else {})


async def test_each_keys_calls_reach_the_engine_with_its_band_and_weight(
    engine, start_router, keys_file
):
    model = engine.served_model_name
    # (key, what the body asks for, the band the engine must rank the program in)
    cases = [
        ("sk-chat", None, 0),
        ("sk-chat", 1, 1),  # lowered by the body's priority
        ("sk-chat", "batch", 1),
        ("sk-nightly", None, 1),  # its key's class
        ("sk-nightly", 0, 1),  # never raised past its key's
    ]
    async with start_router([engine], api_keys_file=keys_file, admin_key=ADMIN_KEY) as router:
        programs = []
        for key, priority, band in cases:
            program_id = unique("classes")
            extra = {} if priority is None else {"priority": priority}
            status, answer = await request(
                "POST", router.url + "/v1/completions",
                json=completion(model, **extra), headers=as_key(key, program_id),
            )  # fmt: skip
            assert status == 200, answer
            programs.append((program_id, key, band))

        table = await engine_table(engine)
        for program_id, key, band in programs:
            row = program_row(table, program_id)
            assert (row["band"], row["owner"]) == (band, owner_of(key)), (key, row)
        owners = table["owners"]
        assert owners[owner_of("sk-nightly")]["weight"] == 3.0
        assert owners[owner_of("sk-chat")]["weight"] == 1.0

        # The router lists the same: each program's class, each key's share.
        status, listing = await request("GET", router.url + PROGRAMS, headers=as_key(ADMIN_KEY))
        assert status == 200, listing
        for program_id, _, band in programs:
            assert program_row(listing, program_id)["class"] == ("interactive", "batch")[band]
        by_name = {row["name"]: row for row in listing["keys"]}
        nightly = by_name["nightly"]
        assert (nightly["class"], nightly["weight"], nightly["programs"]) == ("batch", 3.0, 2)
        assert nightly["service"] > 0 and nightly["share"] == pytest.approx(nightly["service"] / 3)
        assert by_name["chat"]["share"] == by_name["chat"]["service"] > 0

        # Latency by key and class.
        status, metrics = await request("GET", router.url + "/metrics", headers=as_key(ADMIN_KEY))
        assert status == 200 and isinstance(metrics, str)
        for key, name, count in (("chat", "interactive", 1), ("chat", "batch", 2),
                                 ("nightly", "batch", 2)):  # fmt: skip
            series = f'autellix_router_call_seconds_count{{class="{name}",key="{key}"}}'
            assert f"{series} {count:.1f}" in metrics, series


async def test_a_body_priority_means_the_same_on_the_engine_reached_directly(
    engine, start_router, keys_file
):
    """The router's key (the engine key) may state a band in the body as in the
    header; a priority that is no band gets the same 400 on both hops."""
    model = engine.served_model_name
    program_id = unique("direct")
    status, answer = await engine_request(
        engine, "POST", "/v1/completions", json=completion(model, priority=2),
        headers={"X-Autellix-Program-Id": program_id},
    )  # fmt: skip
    assert status == 200, answer
    assert program_row(await engine_table(engine), program_id)["band"] == 2

    bad = completion(model, priority=-1)
    direct = await engine_request(engine, "POST", "/v1/completions", json=bad)
    async with start_router([engine], api_keys_file=keys_file) as router:
        routed = await request(
            "POST", router.url + "/v1/completions", json=bad, headers=as_key("sk-chat")
        )
    assert routed == direct
    status, body = direct
    assert status == 400 and body["error"]["code"] == "invalid_identity", body
    assert body["error"]["param"] == "priority"


async def test_an_interactive_call_goes_before_a_batch_keys_queued_calls(
    engine, start_router, tmp_path
):
    """One seat: the batch key's calls queue; an interactive call sent after them
    goes first (preempting the running one, or taking the seat when it ends),
    although its program and its key have attained more service than theirs:
    without classes it would wait behind them (its program ranks at a worse
    level, and its key's share stays the larger until the batch key has been
    served 20 times the agent's service: its weight is 1/20).

    Who went first is read from the engine: when each program's call finished, on
    the engine core's clock. The clients' clocks cannot tell on a loaded machine,
    where the API server may relay several finished calls at once.
    """
    model = engine.served_model_name
    keys_file = keys_file_with(tmp_path, ORDER_KEYS)

    async def call(url: str, key: str, program_id: str, max_tokens: int) -> None:
        status, answer = await request(
            "POST", url + "/v1/completions",
            json=completion(model, max_tokens=max_tokens), headers=as_key(key, program_id),
        )  # fmt: skip
        assert status == 200, answer

    async def queue_formed(timeout_s: float = 60) -> None:
        """Wait until two calls wait at the engine, or give up (the try then
        likely decides nothing, and another comes)."""
        deadline = time.monotonic() + timeout_s
        while (await engine_table(engine))["waiting"] < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def attempt() -> tuple[list[str], dict[str, float], str, dict[str, Any]]:
        """One try: the batch calls at the engine when the interactive call arrived,
        when each call ended, the interactive program and what to show."""
        agent = unique("agent")
        batch_programs = [unique("batch") for _ in range(6)]
        async with start_router([engine], api_keys_file=keys_file) as router:
            await call(router.url, "sk-chat", agent, 200)  # the agent's service so far
            batch = [
                asyncio.create_task(call(router.url, "sk-nightly", p, BATCH_TOKENS))
                for p in batch_programs
            ]
            await queue_formed()
            await call(router.url, "sk-chat", agent, 4)
            await asyncio.gather(*batch)
        table = await engine_table(engine)
        rows = {p: program_row(table, p) for p in [agent, *batch_programs]}
        arrived = rows[agent]["last_arrival_s"]
        done = {p: row["last_completion_s"] for p, row in rows.items()}
        # On a loaded machine the client's view of the queue is late and the API
        # server hands the engine its calls slowly: some batch calls may have ended
        # before the interactive call arrived, some arrive after it.
        there = [p for p in batch_programs if rows[p]["last_arrival_s"] < arrived < done[p]]
        return there, done, agent, {"arrived": arrived, **done}

    # Until a try finds at least two batch calls at the engine when the interactive
    # call arrives (else nothing was decided), at most three.
    for _ in range(3):
        there, done, agent, report = await attempt()
        if len(there) >= 2:
            break
    assert len(there) >= 2, report
    # Of those, only the one on the seat may end first, in the step that admitted
    # the interactive call.
    assert sum(1 for p in there if done[p] < done[agent]) <= 1, report
