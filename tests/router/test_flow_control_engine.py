"""The router's flow-control gate in front of a real engine.

One engine with two seats, behind a router whose gate keeps the whole pool in
reserve for each interactive call: while an interactive call is in flight, or
ended less than ``linger_s`` ago, a batch key's flood (more calls than seats)
waits at the router, where the held gauge counts it and the engine has none
of it; then it goes, never more calls at once than the engine has seats, and
every call is answered. A held call whose client leaves never reaches the
engine. Without the gate the same flood goes to the engine beside the
interactive call, so the first test fails if the gate holds nothing.

What the router sent is read from its engines listing (``in_flight``: calls
sent to the engine and not yet answered); what the engine saw, from its table
afterwards: when each program's one call arrived at the engine core and when
it finished there, on the core's clock. The gate lets a held call go only
after the calls it waits on ended at the router, which is after they finished
on the engine, so these times bound its decisions however slowly a loaded
machine relays them (the engine core may take its inputs late, so nothing
here asks the engine to run calls side by side).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from autellix_vllm.policy.flow_control import FlowControlConfig
from polling import eventually
from router_http import (
    completion,
    engine_table,
    held_gauge,
    keys_file_with,
    program_row,
    request,
    unique,
)

pytestmark = pytest.mark.engine

ENGINE_KEY = "flow-control-engine-key"
KEYS = "chat: sk-chat\nnightly: sk-nightly class=batch\n"
ADMIN_KEY = "sk-flow-admin"
SEATS = 2
FLOOD = 5  # batch calls, more than the seats
LINGER_S = 5.0
# A reserve of the whole pool: one interactive call in flight or lingering holds
# every batch call, however late the flood arrives on a loaded machine.
GATE = FlowControlConfig(seat_share=1.0, reserve_share=1.0, linger_s=LINGER_S)
# The tiny model makes a token in a few milliseconds: seconds of interactive
# work, so that it is still in flight when the flood has been sent, and batch
# calls long enough that without the gate several are in flight at once.
MAX_MODEL_LEN = 2048
INTERACTIVE_TOKENS = 1536
BATCH_TOKENS = 400
# The engine's time.time() against the router's monotonic clock.
CLOCK_SLACK_S = 0.05


@pytest.fixture(scope="module")
def engine(running_engine):
    """Two seats; an engine key, as ``autellix serve`` starts them, so that it
    takes the calls' bands from the router."""
    with running_engine(
        "flow-engine", api_key=ENGINE_KEY, max_num_seqs=SEATS, max_model_len=MAX_MODEL_LEN
    ) as process:
        yield process


@pytest.fixture
def keys_file(tmp_path: Path) -> str:
    return keys_file_with(tmp_path, KEYS)


async def call(url: str, model: str, key: str, program_id: str, max_tokens: int) -> int:
    """One completion through the router at ``url``; its status (200 asserted)."""
    status, answer = await request(
        "POST", url + "/v1/completions", json=completion(model, max_tokens=max_tokens),
        headers={"Authorization": f"Bearer {key}", "X-Autellix-Program-Id": program_id},
    )  # fmt: skip
    assert status == 200, answer
    return status


async def engine_entry(url: str) -> dict[str, Any]:
    """The router's entry for its one engine (``/autellix/v1/engines``)."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    status, listing = await request("GET", url + "/autellix/v1/engines", headers=headers)
    assert status == 200 and isinstance(listing, dict), listing
    return listing["engines"][0]


async def interactive_call(url: str, engine) -> tuple[str, asyncio.Task[int]]:
    """Start an interactive call once the router knows the engine's seats, and wait
    until it has passed the gate; its program and its task."""
    # Until the router has read the engine's seats from its table, the gate holds nothing.
    await eventually(lambda: engine_entry(url), lambda e: e["seats"] == SEATS, timeout_s=30)
    agent = unique("agent")
    model = engine.served_model_name
    task = asyncio.create_task(call(url, model, "sk-chat", agent, INTERACTIVE_TOKENS))
    # Sent, or already answered on a machine that starved the test (it then lingers).
    await eventually(lambda: engine_entry(url), lambda e: e["in_flight"] == 1 or task.done())
    return agent, task


@dataclass
class Flood:
    """An interactive call that passed the gate and a batch key's calls sent after it."""

    agent: str  # the interactive call's program
    interactive: asyncio.Task[int]
    programs: list[str]  # one batch call each
    batch: list[asyncio.Task[int]]

    async def answers(self) -> list[int]:
        return await asyncio.gather(self.interactive, *self.batch)


async def flood(url: str, engine) -> Flood:
    """An interactive call, then ``FLOOD`` batch calls at once."""
    agent, interactive = await interactive_call(url, engine)
    model = engine.served_model_name
    programs = [unique("batch") for _ in range(FLOOD)]
    batch = [asyncio.create_task(call(url, model, "sk-nightly", p, BATCH_TOKENS)) for p in programs]
    return Flood(agent, interactive, programs, batch)


def on_engine(table: dict, program_ids: list[str]) -> list[tuple[float, float]]:
    """(arrived, finished) of each program's call on the engine core's clock."""
    rows = [program_row(table, p) for p in program_ids]
    assert all(rows), rows
    return [(row["last_arrival_s"], row["last_completion_s"]) for row in rows]  # type: ignore[index]


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most of ``spans`` (arrived, finished) that were on the engine at one time."""
    # At equal times a finish comes first: a call that went as another ended
    # did not share the seat with it.
    events = sorted([(end, -1) for _, end in spans] + [(start, 1) for start, _ in spans])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


async def test_a_batch_flood_waits_at_the_router_while_an_interactive_call_runs(
    engine, start_router, keys_file
):
    async with start_router(
        [engine], api_keys_file=keys_file, admin_key=ADMIN_KEY, flow_control=GATE
    ) as router:
        url = router.url
        sent = await flood(url, engine)
        await eventually(lambda: held_gauge(url, ADMIN_KEY), lambda held: held == {"batch": FLOOD})
        assert (await engine_entry(url))["in_flight"] <= 1  # the interactive call, if any
        table = await engine_table(engine)
        assert [program_row(table, p) for p in sent.programs] == [None] * FLOOD
        assert await sent.answers() == [200] * (1 + FLOOD)  # nothing held is lost
        assert await held_gauge(url, ADMIN_KEY) == {"batch": 0.0}
    table = await engine_table(engine)
    [(_, agent_done)] = on_engine(table, [sent.agent])
    spans = on_engine(table, sent.programs)
    first = min(arrived for arrived, _ in spans)
    # Held while the interactive call ran and for linger_s after it ended.
    assert first - agent_done >= LINGER_S - CLOCK_SLACK_S, (agent_done, spans)
    # Then no better call is about: the batch calls may fill the seats, no more.
    assert most_at_once(spans) <= SEATS, spans


async def test_a_held_call_whose_client_leaves_never_reaches_the_engine(
    engine, start_router, keys_file
):
    model = engine.served_model_name
    async with start_router(
        [engine], api_keys_file=keys_file, admin_key=ADMIN_KEY, flow_control=GATE
    ) as router:
        url = router.url

        async def held(count: float) -> None:
            await eventually(
                lambda: held_gauge(url, ADMIN_KEY), lambda seen: seen == {"batch": count}
            )

        _, interactive = await interactive_call(url, engine)
        gone, later = unique("gone"), unique("later")
        leaving = asyncio.create_task(call(url, model, "sk-nightly", gone, BATCH_TOKENS))
        await held(1)
        leaving.cancel()  # closes its connection: the router cancels its handler
        await held(0)
        # A call of the same key after it: had the gone call stayed, it would go first.
        staying = asyncio.create_task(call(url, model, "sk-nightly", later, BATCH_TOKENS))
        await held(1)
        assert await asyncio.gather(interactive, staying) == [200, 200]
        await held(0)
    table = await engine_table(engine)
    assert program_row(table, later) is not None, table
    assert program_row(table, gone) is None, table


async def test_without_the_gate_the_flood_goes_to_the_engine(engine, start_router, keys_file):
    async with start_router([engine], api_keys_file=keys_file, admin_key=ADMIN_KEY) as router:
        sent = await flood(router.url, engine)
        # More calls sent to the engine than it has seats.
        await eventually(
            lambda: engine_entry(router.url), lambda e: e["in_flight"] > SEATS, timeout_s=60
        )
        assert await sent.answers() == [200] * (1 + FLOOD)
        assert await held_gauge(router.url, ADMIN_KEY) == {}
    on_engine(await engine_table(engine), sent.programs)  # each reached the engine
