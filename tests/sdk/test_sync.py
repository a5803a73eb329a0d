"""Sync agents: @program on plain functions with autellix.OpenAI, and OS threads."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import autellix
import openai
import pytest
from fake_server import FakeOpenAIServer

MESSAGES = [{"role": "user", "content": "hi"}]


def ask(client: autellix.OpenAI, tag: str) -> str | None:
    """Make one blocking call labelled `tag`; return the thread it was made in."""
    client.chat.completions.create(model="m", messages=MESSAGES, extra_headers={"X-Test-Tag": tag})
    return autellix.current_thread()


def test_sync_program_opens_tags_and_ends(
    server: FakeOpenAIServer, sync_client: autellix.OpenAI
) -> None:
    @autellix.program
    def agent() -> str | None:
        ask(sync_client, "call")
        stream = sync_client.completions.create(model="m", prompt="hi", stream=True)
        for _ in stream:
            pass
        return autellix.current_program()

    assert agent() == "prog-1"

    assert server.state.opened_programs == server.state.ended_programs == ["prog-1"]
    plain, streamed = server.generation_calls()
    assert plain.program_id == streamed.program_id == "prog-1"
    assert plain.thread_id == streamed.thread_id
    assert plain.call_id != streamed.call_id
    assert plain.vllm_xargs is None  # identity travels in headers only


def test_sync_program_ends_on_exception_and_retries_keep_call_id(
    server: FakeOpenAIServer, sync_client: autellix.OpenAI
) -> None:
    server.fail_next(503)
    server.reset_next()

    @autellix.program
    def agent() -> None:
        ask(sync_client, "call")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        agent()

    attempts = server.generation_calls()
    assert len(attempts) == 3 and len({attempt.call_id for attempt in attempts}) == 1
    assert server.state.ended_programs == ["prog-1"]


def test_sync_client_surfaces_other_errors_unchanged(
    server: FakeOpenAIServer, sync_client: autellix.OpenAI
) -> None:
    server.fail_next(400)

    with pytest.raises(openai.BadRequestError):
        ask(sync_client, "call")
    assert len(server.generation_calls()) == 1


def test_plain_threads_start_outside_the_program_unless_wrapped(
    server: FakeOpenAIServer, sync_client: autellix.OpenAI
) -> None:
    @autellix.program
    def agent() -> str | None:
        unwrapped = threading.Thread(target=ask, args=(sync_client, "plain-thread"))
        bound = threading.Thread(target=autellix.bound(ask), args=(sync_client, "bound-thread"))
        for worker in (unwrapped, bound):
            worker.start()
            worker.join()
        return autellix.current_thread()

    main_thread = agent()

    assert server.call_tagged("plain-thread").program_id is None
    bound_call = server.call_tagged("bound-thread")
    assert (bound_call.program_id, bound_call.thread_id) == ("prog-1", main_thread)


def test_forked_makes_each_executor_call_a_child_thread(
    server: FakeOpenAIServer, sync_client: autellix.OpenAI
) -> None:
    @autellix.program
    def agent() -> tuple[str | None, list[str | None]]:
        with ThreadPoolExecutor(max_workers=2) as pool:
            work = autellix.forked(ask, name="worker")
            children = list(pool.map(work, [sync_client] * 3, ["w1", "w2", "w3"]))
        return autellix.current_thread(), children

    main_thread, children = agent()

    assert len(set(children)) == 3 and main_thread not in children
    for tag, child in zip(["w1", "w2", "w3"], children, strict=True):
        call = server.call_tagged(tag)
        assert (call.thread_id, call.parent_thread_id) == (child, main_thread)
        assert child is not None and child.startswith("worker-")


def lost_call_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "belongs to no program" in r.getMessage()]


def test_executor_calls_that_lose_the_program_warn_once(
    server: FakeOpenAIServer, sync_client: autellix.OpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    # The sync agent of the migration guide with only the import and @program changed.
    @autellix.program
    def agent() -> None:
        ask(sync_client, "plan")
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="pool") as pool:
            list(pool.map(ask, [sync_client] * 3, ["w1", "w2", "w3"]))

    with caplog.at_level(logging.WARNING, logger="autellix"):
        agent()
        agent()

    assert [call.program_id for call in server.generation_calls()].count(None) == 6
    [warning] = lost_call_warnings(caplog)
    assert "from OS thread 'pool_" in warning and "autellix.forked(fn)" in warning


async def test_run_in_executor_from_an_async_program_warns(
    server: FakeOpenAIServer,
    client: autellix.AsyncOpenAI,
    sync_client: autellix.OpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    @autellix.program(client=client)
    async def agent() -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, ask, sync_client, "executor")  # no context copy

    with caplog.at_level(logging.WARNING, logger="autellix"):
        await agent()

    assert server.call_tagged("executor").program_id is None
    assert len(lost_call_warnings(caplog)) == 1


async def test_calls_outside_programs_do_not_warn_without_an_open_program_or_from_tasks(
    server: FakeOpenAIServer,
    client: autellix.AsyncOpenAI,
    sync_client: autellix.OpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    opened = asyncio.Event()
    leave = asyncio.Event()

    @autellix.program(client=client)
    async def agent() -> None:
        opened.set()
        await leave.wait()

    async def plain_call_while_the_program_is_open() -> None:
        await opened.wait()
        await client.chat.completions.create(model="m", messages=MESSAGES)  # a task: no warning
        leave.set()

    with caplog.at_level(logging.WARNING, logger="autellix"):
        await asyncio.to_thread(ask, sync_client, "no-program-open")
        await asyncio.gather(agent(), plain_call_while_the_program_is_open())
        await asyncio.to_thread(ask, sync_client, "program-ended")

    assert [call.program_id for call in server.generation_calls()] == [None] * 3
    assert lost_call_warnings(caplog) == []


def test_sync_thread_block(server: FakeOpenAIServer, sync_client: autellix.OpenAI) -> None:
    with autellix.session("sync-job") as main:
        with autellix.thread("step") as step:
            ask(sync_client, "inside")
        ask(sync_client, "after")

    assert step is not None and server.call_tagged("inside").thread_id == step.thread_id
    assert server.call_tagged("inside").parent_thread_id == main.thread_id
    assert server.call_tagged("after").thread_id == main.thread_id
    assert server.program_calls()[0].body == {"name": "sync-job"}


async def test_to_thread_carries_the_async_program_into_sync_code(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI, sync_client: autellix.OpenAI
) -> None:
    @autellix.program(client=client)
    async def agent() -> tuple[str | None, str | None]:
        same = await asyncio.to_thread(ask, sync_client, "to-thread")
        forked = await asyncio.to_thread(autellix.forked(ask), sync_client, "forked")
        return same, forked

    same, forked = await agent()

    main_thread = server.call_tagged("to-thread").thread_id
    assert same == main_thread
    assert server.call_tagged("forked").parent_thread_id == main_thread != forked
