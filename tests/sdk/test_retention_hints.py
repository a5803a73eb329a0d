"""`autellix.expect_tool(seconds)`: calls made inside the block carry a retention hint."""

from __future__ import annotations

import asyncio
import math

import autellix
import pytest
from fake_server import FakeOpenAIServer

MESSAGES = [{"role": "user", "content": "hi"}]
HINT = "X-Autellix-Retention-Ttl"


async def ask(client: autellix.AsyncOpenAI) -> None:
    await client.chat.completions.create(model="m", messages=MESSAGES)


async def test_calls_carry_the_hint_only_while_it_is_set(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    @autellix.program
    async def agent() -> None:
        await ask(client)
        with autellix.expect_tool(45):
            await ask(client)  # its answer starts a 45 s tool call
            with autellix.expect_tool(2.5):
                await ask(client)  # the innermost block wins
            await asyncio.gather(ask(client), ask(client))  # tasks inherit it
        await ask(client)

    await agent()
    calls = server.generation_calls()
    assert [c.header(HINT) for c in calls] == [None, "45.0", "2.5", "45.0", "45.0", None]
    assert all(c.program_id for c in calls)  # next to the identity, not instead of it
    assert all("vllm_xargs" not in c.body for c in calls)  # headers only


def test_sync_calls_carry_it_too_and_outside_programs_nothing(
    server: FakeOpenAIServer, sync_client: autellix.OpenAI
) -> None:
    with autellix.expect_tool(10):
        sync_client.chat.completions.create(model="m", messages=MESSAGES)  # no program

        @autellix.program
        def agent() -> None:
            sync_client.chat.completions.create(model="m", messages=MESSAGES)

        agent()
    assert [c.header(HINT) for c in server.generation_calls()] == [None, "10.0"]


async def test_a_header_the_user_set_wins(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    async with autellix.session("s"):
        with autellix.expect_tool(45):
            await client.chat.completions.create(
                model="m", messages=MESSAGES, extra_headers={HINT.lower(): "5m"}
            )
    assert server.generation_calls()[0].header(HINT) == "5m"


@pytest.mark.parametrize(
    ("seconds", "error"),
    [(-1, ValueError), (math.inf, ValueError), (math.nan, ValueError), ("30s", TypeError),
     (True, TypeError), (None, TypeError)],
)  # fmt: skip
def test_expect_tool_takes_a_finite_number_of_seconds(seconds, error) -> None:
    with pytest.raises(error), autellix.expect_tool(seconds):
        pass
