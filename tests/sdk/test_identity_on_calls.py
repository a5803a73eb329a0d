"""Every LLM call inside a program carries its identity; calls outside carry none."""

from __future__ import annotations

from typing import Any

import autellix
import openai
import pytest
from fake_server import FakeOpenAIServer, Received

IDENTITY_HEADERS = [
    "x-autellix-program-id",
    "x-autellix-thread-id",
    "x-autellix-parent-thread-id",
    "x-autellix-call-id",
    "x-session-id",
]
MESSAGES = [{"role": "user", "content": "hi"}]


async def make_call(client: autellix.AsyncOpenAI, endpoint: str, stream: bool) -> None:
    """One call to `endpoint`, read to the end when streaming."""
    if endpoint == "chat":
        answer: Any = await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=stream
        )
    elif endpoint == "completions":
        answer = await client.completions.create(model="m", prompt="hi", stream=stream)
    else:
        answer = await client.responses.create(model="m", input="hi", stream=stream)
    if stream:
        async for _ in answer:
            pass


def assert_main_thread_identity(call: Received, program_id: str, thread_id: str) -> None:
    assert call.program_id == program_id
    assert call.header("X-Session-ID") == program_id
    assert call.thread_id == thread_id
    assert call.parent_thread_id is None  # a main thread has no parent:
    assert call.header("X-Autellix-Parent-Thread-Id") == ""  # the header is sent empty
    assert call.call_id
    # Headers only: strict OpenAI-compatible servers reject unknown body fields.
    assert "vllm_xargs" not in call.body


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streaming"])
@pytest.mark.parametrize("endpoint", ["chat", "completions", "responses"])
async def test_calls_in_a_program_carry_its_identity(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI, endpoint: str, stream: bool
) -> None:
    @autellix.program
    async def agent() -> tuple[str | None, str | None]:
        await make_call(client, endpoint, stream)
        return autellix.current_program(), autellix.current_thread()

    program_id, thread_id = await agent()

    assert program_id == server.state.opened_programs[0]
    assert thread_id is not None
    [call] = server.generation_calls()
    assert bool(call.body.get("stream")) is stream
    assert_main_thread_identity(call, program_id, thread_id)


async def test_each_call_gets_its_own_call_id(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    @autellix.program
    async def agent() -> None:
        for _ in range(3):
            await make_call(client, "chat", stream=False)

    await agent()

    call_ids = [call.call_id for call in server.generation_calls()]
    assert len(set(call_ids)) == 3


async def test_calls_outside_programs_carry_nothing(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    await make_call(client, "chat", stream=False)

    @autellix.program
    async def agent() -> None:
        await make_call(client, "chat", stream=True)

    await agent()
    await make_call(client, "completions", stream=True)  # after the program ended

    before, inside, after = server.generation_calls()
    assert inside.program_id is not None
    for call in (before, after):
        assert not any(call.header(name) for name in IDENTITY_HEADERS)
        assert call.vllm_xargs is None
    assert autellix.current_program() is None
    assert autellix.current_thread() is None


async def test_user_headers_win_and_extra_body_is_sent_as_given(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    user_body = {"top_k": 3, "vllm_xargs": {"job": "j1", "autellix_call_id": "users-own"}}

    @autellix.program
    async def agent() -> None:
        await client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            extra_headers={"X-Custom": "kept", "x-session-id": "users-session"},
            extra_body=user_body,
        )

    await agent()

    [call] = server.generation_calls()
    assert call.header("X-Custom") == "kept"
    assert call.header("X-Session-ID") == "users-session"  # the user's value wins
    assert call.program_id == server.state.opened_programs[0]
    assert call.body["top_k"] == 3
    assert call.vllm_xargs == {"job": "j1", "autellix_call_id": "users-own"}  # sent as given
    assert user_body == {"top_k": 3, "vllm_xargs": {"job": "j1", "autellix_call_id": "users-own"}}


async def test_with_options_copies_keep_tagging_and_settings(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    copy = client.with_options(timeout=5.0)
    assert isinstance(copy, autellix.AsyncOpenAI)
    assert copy._retry_policy == client._retry_policy
    assert client.with_options(retry_max_seconds=1.5)._retry_policy.max_seconds == 1.5

    @autellix.program(client=client)
    async def agent() -> None:
        await make_call(copy, "chat", stream=False)

    await agent()

    [call] = server.generation_calls()
    assert call.program_id == server.state.opened_programs[0]


async def test_raw_and_streaming_response_wrappers_are_tagged(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    @autellix.program
    async def agent() -> str | None:
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
        async with client.completions.with_streaming_response.create(
            model="m", prompt="hi"
        ) as streamed:
            await streamed.parse()
        return raw.parse().choices[0].message.content

    assert await agent() == "ok"

    program_id = server.state.opened_programs[0]
    assert [call.program_id for call in server.generation_calls()] == [program_id, program_id]


async def test_plain_openai_client_is_not_tagged(server: FakeOpenAIServer) -> None:
    plain = openai.AsyncOpenAI(base_url=server.base_url, api_key="k")

    async with autellix.session("job", client=plain):
        await plain.chat.completions.create(model="m", messages=MESSAGES)
    await plain.close()

    [call] = server.generation_calls()
    assert call.program_id is None
    assert server.state.opened_programs == server.state.ended_programs == ["prog-1"]


async def test_a_header_the_user_omits_stays_omitted(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    @autellix.program
    async def agent() -> None:
        await client.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers={"X-Session-ID": openai.omit}
        )

    await agent()

    [call] = server.generation_calls()
    assert call.header("X-Session-ID") is None
    assert call.program_id == "prog-1"
