"""`autellix.priority(...)` and `@program(priority=...)`: calls ask for a class."""

from __future__ import annotations

import asyncio

import autellix
import pytest
from fake_server import FakeOpenAIServer

MESSAGES = [{"role": "user", "content": "hi"}]
PRIORITY = "X-Autellix-Priority"


async def ask(client: autellix.AsyncOpenAI) -> None:
    await client.chat.completions.create(model="m", messages=MESSAGES)


async def test_calls_ask_for_the_class_set_where_they_run(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    @autellix.program(priority="batch")
    async def nightly() -> None:
        await ask(client)
        with autellix.priority(3):
            await asyncio.gather(ask(client), ask(client))  # tasks inherit it
        await ask(client)

    @autellix.program
    async def chat() -> None:
        await ask(client)

    await nightly()
    await chat()
    calls = server.generation_calls()
    assert [c.header(PRIORITY) for c in calls] == ["batch", "3", "3", "batch", None]
    assert all(c.program_id for c in calls)
    assert autellix.PRIORITY_HEADER == PRIORITY


def test_sync_programs_ask_for_it_too(
    server: FakeOpenAIServer, sync_client: autellix.OpenAI
) -> None:
    @autellix.program(priority="interactive")
    def agent() -> None:
        sync_client.chat.completions.create(model="m", messages=MESSAGES)

    agent()
    assert [c.header(PRIORITY) for c in server.generation_calls()] == ["interactive"]


@pytest.mark.parametrize("value", ["urgent", -1, 10, 1.5, True, None])
def test_a_class_is_a_name_or_a_band_from_0_to_9(value) -> None:
    with pytest.raises(ValueError), autellix.priority(value):
        pass
    with pytest.raises(ValueError):
        autellix.program(priority=value if value is not None else "x")
