"""Explicit fork/join (autellix.gather, fork, thread): which thread, and which parent,
each call reports. The automatic threads of plain asyncio are in test_automatic_threads."""

from __future__ import annotations

import asyncio

import autellix
from fake_server import FakeOpenAIServer

MESSAGES = [{"role": "user", "content": "hi"}]


async def ask(client: autellix.AsyncOpenAI, tag: str) -> str | None:
    """Make one call labelled `tag`; return the thread it was made in."""
    await client.chat.completions.create(
        model="m", messages=MESSAGES, extra_headers={"X-Test-Tag": tag}
    )
    return autellix.current_thread()


async def test_nested_gathers_record_the_fork_tree(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    #   main ──┬── a ──┬── a1
    #          │       └── a2
    #          └── b
    async def branch_a() -> None:
        await ask(client, "a")
        await autellix.gather(ask(client, "a1"), ask(client, "a2"))
        await ask(client, "a-after-join")

    @autellix.program
    async def agent() -> None:
        await ask(client, "main")
        await autellix.gather(branch_a(), ask(client, "b"))
        await ask(client, "main-after-join")

    await agent()

    thread_of = {call.tag: call.thread_id for call in server.generation_calls()}
    parent_of = {call.tag: call.parent_thread_id for call in server.generation_calls()}
    assert len(set(thread_of.values())) == 5  # main, a, a1, a2, b
    assert parent_of["main"] is None
    assert parent_of["a"] == parent_of["b"] == thread_of["main"]
    assert parent_of["a1"] == parent_of["a2"] == thread_of["a"]
    # joining returns to the forking thread, whose context was never changed
    assert thread_of["a-after-join"] == thread_of["a"]
    assert thread_of["main-after-join"] == thread_of["main"]
    assert {call.program_id for call in server.generation_calls()} == {"prog-1"}


async def test_fork_returns_a_task_in_a_named_child_thread(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    @autellix.program
    async def agent() -> tuple[str | None, str | None]:
        task = autellix.fork(ask(client, "child"), name="search")
        assert task.get_name() == "search"
        return autellix.current_thread(), await task

    main_thread, child_thread = await agent()

    child = server.call_tagged("child")
    assert child.thread_id == child_thread != main_thread
    assert child_thread is not None and child_thread.startswith("search-")
    assert child.parent_thread_id == main_thread


async def test_create_task_is_fork(server: FakeOpenAIServer, client: autellix.AsyncOpenAI) -> None:
    @autellix.program
    async def agent() -> tuple[str | None, str | None]:
        return autellix.current_thread(), await autellix.create_task(ask(client, "child"))

    main_thread, child_thread = await agent()

    assert child_thread != main_thread
    assert server.call_tagged("child").parent_thread_id == main_thread


async def test_thread_block_runs_as_a_child_thread(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    @autellix.program
    async def agent() -> autellix.ThreadIdentity | None:
        await ask(client, "before")
        async with autellix.thread("verify") as block:
            await ask(client, "inside")
        await ask(client, "after")
        return block

    block = await agent()

    before, inside = server.call_tagged("before"), server.call_tagged("inside")
    assert block is not None and inside.thread_id == block.thread_id
    assert block.thread_id.startswith("verify-")
    assert inside.parent_thread_id == before.thread_id
    assert server.call_tagged("after").thread_id == before.thread_id


async def test_gather_keeps_results_in_order_and_can_return_exceptions(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    async def fail() -> None:
        raise ValueError("branch failed")

    async def value(number: int) -> int:
        await asyncio.sleep(0.01 * (3 - number))
        return number

    @autellix.program
    async def agent() -> list[object]:
        return await autellix.gather(value(1), fail(), value(2), return_exceptions=True)

    one, error, two = await agent()
    assert (one, two) == (1, 2)
    assert isinstance(error, ValueError)


async def test_outside_programs_fork_and_thread_tag_nothing(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    async with autellix.thread("x") as block:
        assert block is None
        await autellix.gather(ask(client, "gathered"))
    await autellix.fork(ask(client, "forked"))

    assert [call.program_id for call in server.generation_calls()] == [None, None]
