"""Opening and ending programs: @program, session(), nesting, failures, plain servers."""

from __future__ import annotations

import asyncio
import logging
import time

import autellix
import pytest
from autellix import _client, _programs_api
from fake_server import FakeOpenAIServer

MESSAGES = [{"role": "user", "content": "hi"}]


async def ask(client: autellix.AsyncOpenAI, tag: str = "") -> None:
    await client.chat.completions.create(
        model="m", messages=MESSAGES, extra_headers={"X-Test-Tag": tag}
    )


async def test_program_opens_with_name_and_auth_and_ends(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    @autellix.program(name="triage")
    async def agent() -> str | None:
        await ask(client)
        return autellix.current_program()

    assert await agent() == "prog-1"

    opened, ended = server.program_calls()
    assert (opened.method, opened.path, opened.body) == (
        "POST",
        "/autellix/v1/programs",
        {"name": "triage"},
    )
    assert (ended.method, ended.path) == ("DELETE", "/autellix/v1/programs/prog-1")
    for request in (opened, ended):
        assert request.header("Authorization") == "Bearer test-key"
        assert request.program_id is None  # session calls are not LLM calls
    assert server.state.ended_programs == ["prog-1"]


async def test_program_name_defaults_to_the_function_and_wraps_it(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    async def research(topic: str) -> str:
        """Docs survive."""
        return topic

    wrapped = autellix.program(research)

    assert await wrapped("x") == "x"
    assert wrapped.__name__ == "research" and wrapped.__doc__ == "Docs survive."
    [opened, _] = server.program_calls()
    assert opened.body == {"name": "research"}


async def test_every_run_is_its_own_program(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    @autellix.program
    async def agent() -> str | None:
        await ask(client)
        return autellix.current_program()

    assert await asyncio.gather(agent(), agent()) in (["prog-1", "prog-2"], ["prog-2", "prog-1"])
    assert sorted(server.state.ended_programs) == ["prog-1", "prog-2"]


async def test_nested_program_is_a_thread_of_the_outer_one(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    @autellix.program
    async def summarize() -> str | None:
        await ask(client, "inner")
        return autellix.current_program()

    @autellix.program
    async def outer() -> str | None:
        await ask(client, "outer")
        inner_program = await summarize()
        await ask(client, "outer-again")
        return inner_program

    assert await outer() == "prog-1"

    assert server.state.opened_programs == server.state.ended_programs == ["prog-1"]
    outer_call, inner_call = server.call_tagged("outer"), server.call_tagged("inner")
    assert inner_call.program_id == "prog-1"
    assert inner_call.parent_thread_id == outer_call.thread_id
    assert inner_call.thread_id.startswith("summarize-")
    assert server.call_tagged("outer-again").thread_id == outer_call.thread_id


async def test_session_block_runs_as_a_program(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    async with autellix.session("batch-job") as identity:
        await ask(client)
        assert autellix.current_identity() == identity

    assert identity.program_id == "prog-1" and identity.parent_thread_id is None
    assert server.program_calls()[0].body == {"name": "batch-job"}
    assert server.state.ended_programs == ["prog-1"]
    assert autellix.current_identity() is None


async def test_program_ends_when_the_agent_raises(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    @autellix.program
    async def agent() -> None:
        await ask(client)
        raise LookupError("tool failed")

    with pytest.raises(LookupError, match="tool failed"):
        await agent()
    assert server.state.ended_programs == ["prog-1"]
    assert autellix.current_program() is None


async def test_program_ends_when_the_agent_is_cancelled(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    called = asyncio.Event()

    @autellix.program
    async def agent() -> None:
        await ask(client)
        called.set()
        await asyncio.sleep(60)

    task = asyncio.create_task(agent())
    await called.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert server.state.ended_programs == ["prog-1"]


async def test_explicit_client_picks_the_server(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    other_server = FakeOpenAIServer().start()
    try:
        other = autellix.AsyncOpenAI(base_url=other_server.base_url, api_key="other")

        @autellix.program(client=client)  # not the newest client
        async def agent() -> None:
            await ask(other)

        await agent()
        await other.close()
    finally:
        other_server.stop()

    assert server.state.opened_programs == server.state.ended_programs == ["prog-1"]
    assert other_server.state.opened_programs == []
    [call] = other_server.generation_calls()
    assert call.program_id == "prog-1"


async def test_server_without_program_api_falls_back_to_local_ids_and_warns_once(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    server.state.programs_api = False

    @autellix.program
    async def agent() -> str | None:
        await ask(client)
        return autellix.current_program()

    with caplog.at_level(logging.WARNING, logger="autellix"):
        at_once = await asyncio.gather(agent(), agent())  # both ask before either hears 404
        later = await agent()

    program_ids = [*at_once, later]
    assert len(set(program_ids)) == 3 and all(p and p.startswith("local-") for p in program_ids)
    assert {call.program_id for call in server.generation_calls()} == set(program_ids)
    assert [(r.method, r.path) for r in server.program_calls()] == [
        ("POST", "/autellix/v1/programs")  # the later program does not ask; no end calls
    ] * 2
    assert len([r for r in caplog.records if "404" in r.getMessage()]) == 1


async def test_a_plain_server_is_asked_again_after_the_recheck_time(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An autellix server that replaced a plain one at the same address gets its
    programs once the plain answer is older than the recheck time."""
    server.state.programs_api = False

    @autellix.program
    async def agent() -> str | None:
        await ask(client)
        return autellix.current_program()

    assert (await agent() or "").startswith("local-")
    server.state.programs_api = True
    assert (await agent() or "").startswith("local-")  # within the recheck time: not asked
    monkeypatch.setattr(_programs_api, "PLAIN_SERVER_RECHECK_SECONDS", 0.0)
    assert await agent() == "prog-1"
    assert [r.path for r in server.program_calls()] == [
        "/autellix/v1/programs",  # the 404
        "/autellix/v1/programs",  # the recheck, answered
        "/autellix/v1/programs/prog-1",  # its end
    ]


async def test_unreachable_server_at_program_end_does_not_fail_the_agent(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    @autellix.program
    async def agent() -> str:
        await ask(client)
        server.stop()  # the server goes away mid-program
        return "answer"

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="autellix"):
        assert await agent() == "answer"
    assert time.monotonic() - started < 2.0
    assert "could not end program prog-1" in caplog.text


async def test_hung_server_at_program_end_is_abandoned_after_a_bounded_wait(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    server.state.hang_program_end = True

    @autellix.program
    async def agent() -> None:
        raise KeyError("the agent's own error")

    started = time.monotonic()
    with pytest.raises(KeyError, match="the agent's own error"):
        await agent()
    assert 1.5 < time.monotonic() - started < 4.0
    assert server.state.ended_programs == []


async def test_without_any_client_programs_run_with_local_ids(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_client, "_newest_clients", {})

    @autellix.program
    async def agent() -> str | None:
        return autellix.current_program()

    with caplog.at_level(logging.WARNING, logger="autellix"):
        program_id = await agent()
    assert program_id is not None and program_id.startswith("local-")
    assert "no autellix.AsyncOpenAI exists yet" in caplog.text


async def test_async_program_rejects_a_sync_client(sync_client: autellix.OpenAI) -> None:
    @autellix.program(client=sync_client)
    async def agent() -> None:
        pass

    with pytest.raises(TypeError, match="AsyncOpenAI"):
        await agent()


def test_generators_are_refused() -> None:
    async def stream_answers():  # type: ignore[no-untyped-def]
        yield 1

    with pytest.raises(TypeError, match="generators"):
        autellix.program(stream_answers)
