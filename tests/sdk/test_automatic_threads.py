"""Plain asyncio inside a program: every task that calls gets a child thread of its own.

`asyncio.gather`, `asyncio.create_task` and `TaskGroup` need no autellix helper:
a call from a task other than the one that bound the current thread starts a
child thread of that thread, in the task's own context. These tests read the
thread and parent ids on the wire (the headers the fake server recorded).
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import autellix
from fake_server import FakeOpenAIServer

MESSAGES = [{"role": "user", "content": "hi"}]
Gather = Callable[..., Awaitable[list[Any]]]


async def ask(client: autellix.AsyncOpenAI, tag: str) -> str | None:
    """Make one call labelled `tag`; return the thread it was made in."""
    await client.chat.completions.create(
        model="m", messages=MESSAGES, extra_headers={"X-Test-Tag": tag}
    )
    return autellix.current_thread()


def thread_tree(server: FakeOpenAIServer) -> dict[str, tuple[str, str | None]]:
    """Each call's tag -> (its thread, its parent thread), as the wire says.

    A thread is named by the sorted tags of its calls ("check+draft"), so two
    runs that differ only in their random ids give the same tree. A parent that
    made no call itself is "(no calls)".
    """
    calls = server.generation_calls()
    tags_of: dict[str | None, list[str]] = defaultdict(list)
    for call in calls:
        tags_of[call.thread_id].append(call.tag or "")
    name = {thread: "+".join(sorted(tags)) for thread, tags in tags_of.items()}
    return {
        call.tag or "": (
            name[call.thread_id],
            None
            if call.parent_thread_id is None
            else name.get(call.parent_thread_id, "(no calls)"),
        )
        for call in calls
    }


async def test_gather_runs_each_subtask_in_its_own_child_thread(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    # The agent of the migration guide: plan, three sub-tasks of two calls, merge.
    async def subtask(part: str) -> None:
        await ask(client, f"{part}-draft")
        await ask(client, f"{part}-check")

    @autellix.program
    async def agent() -> None:
        await ask(client, "plan")
        await asyncio.gather(*(subtask(part) for part in "xyz"))
        await ask(client, "merge")

    await agent()

    main = "merge+plan"
    assert thread_tree(server) == {
        "plan": (main, None),
        **{
            f"{p}-{step}": (f"{p}-check+{p}-draft", main)
            for p in "xyz"
            for step in ("draft", "check")
        },
        "merge": (main, None),
    }
    assert {call.program_id for call in server.generation_calls()} == {"prog-1"}


async def test_automatic_threads_send_what_the_explicit_helpers_send(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    #   main ──┬── a ──┬── a1
    #          │       └── a2
    #          └── b
    # written once with asyncio.gather and once with autellix.gather
    async def branch_a(gather: Gather) -> None:
        await ask(client, "a")
        await gather(ask(client, "a1"), ask(client, "a2"))  # nested fan-out
        await ask(client, "a-after-join")

    @autellix.program
    async def agent(gather: Gather) -> None:
        await ask(client, "main")
        await gather(branch_a(gather), ask(client, "b"))
        await ask(client, "main-after-join")

    await agent(autellix.gather)
    explicit, explicit_calls = thread_tree(server), server.generation_calls()
    server.state.received.clear()
    await agent(asyncio.gather)
    automatic, automatic_calls = thread_tree(server), server.generation_calls()

    assert automatic == explicit
    assert len({tree_thread for tree_thread, _ in automatic.values()}) == 5  # main a a1 a2 b
    assert automatic["a1"][1] == automatic["a"][0]  # the nested fork starts from a
    # the same headers, and a new call id for each of the 7 calls of each run
    assert {frozenset(c.headers) for c in automatic_calls + explicit_calls} == {
        frozenset(explicit_calls[0].headers)
    }
    assert len({c.call_id for c in automatic_calls + explicit_calls}) == 14


async def test_create_task_and_task_groups_name_threads_after_named_tasks(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    @autellix.program
    async def agent() -> str | None:
        lookup = asyncio.create_task(ask(client, "created"), name="lookup")
        async with asyncio.TaskGroup() as group:
            group.create_task(ask(client, "grouped"))
            group.create_task(ask(client, "grouped-named"), name="search")
        await lookup
        return await ask(client, "main")

    main_thread = await agent()

    tags = ("created", "grouped", "grouped-named")
    threads = {tag: server.call_tagged(tag).thread_id or "" for tag in tags}
    assert len(set(threads.values())) == 3 and main_thread not in threads.values()
    assert threads["created"].startswith("lookup-")
    assert threads["grouped-named"].startswith("search-")
    assert re.fullmatch("[0-9a-f]+", threads["grouped"])  # "Task-7" says nothing
    for tag in threads:
        assert server.call_tagged(tag).parent_thread_id == main_thread


async def test_a_task_that_fans_out_before_its_first_call_forks_from_its_parent(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    # A thread exists for the server only once it calls, so the coordinator's
    # children cannot hang below a coordinator thread that has no call yet.
    async def coordinator() -> None:
        await asyncio.gather(ask(client, "c1"), ask(client, "c2"))
        await ask(client, "coordinator")

    @autellix.program
    async def agent() -> None:
        await ask(client, "main")
        await asyncio.gather(coordinator())

    await agent()

    tree = thread_tree(server)
    assert tree["c1"][1] == tree["c2"][1] == tree["coordinator"][1] == "main"
    assert len({thread for thread, _ in tree.values()}) == 4


async def test_a_task_that_outlives_its_creator_stays_below_the_creators_thread(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    async def late(creator: asyncio.Task[Any]) -> None:
        await asyncio.sleep(0.01)
        assert creator.done()
        await ask(client, "late")

    async def starter() -> asyncio.Task[None]:
        await ask(client, "starter")
        return asyncio.create_task(late(asyncio.current_task()))  # type: ignore[arg-type]

    @autellix.program
    async def agent() -> None:
        await ask(client, "main")
        left_running = await asyncio.create_task(starter())
        await left_running
        await ask(client, "main-after")

    await agent()

    tree = thread_tree(server)
    assert tree["late"] == ("late", "starter")
    assert tree["starter"] == ("starter", "main+main-after")


async def test_wait_for_keeps_the_callers_thread(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    # On Python 3.11, wait_for with a timeout runs the call in a task of its own.
    async def branch() -> None:
        await ask(client, "branch")
        await asyncio.wait_for(ask(client, "branch-waited"), timeout=10)

    @autellix.program
    async def agent() -> None:
        await asyncio.wait_for(ask(client, "waited"), timeout=10)
        await asyncio.gather(branch(), asyncio.wait_for(ask(client, "gathered-waited"), 10))
        await ask(client, "main")

    await agent()

    tree = thread_tree(server)
    assert tree["waited"] == tree["main"] == ("main+waited", None)
    assert tree["branch-waited"] == tree["branch"] == ("branch+branch-waited", "main+waited")
    assert tree["gathered-waited"] == ("gathered-waited", "main+waited")


async def test_current_thread_in_a_task_is_the_thread_its_calls_carry(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    async def branch() -> tuple[str | None, str | None]:
        before_any_call = autellix.current_thread()
        return before_any_call, await ask(client, "branch")

    @autellix.program
    async def agent() -> tuple[str | None, tuple[str | None, str | None], str | None]:
        main = autellix.current_thread()
        [seen] = await asyncio.gather(branch())
        return main, seen, autellix.current_thread()

    main, (before, after), main_after = await agent()

    assert before == after == server.call_tagged("branch").thread_id
    assert main == main_after != before
    assert server.call_tagged("branch").parent_thread_id == main


async def test_thread_blocks_and_nested_programs_in_plain_tasks_fork_from_the_parent(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    @autellix.program
    async def summarize() -> str | None:
        return await ask(client, "summarize")

    async def verify() -> autellix.ThreadIdentity | None:
        async with autellix.thread("verify") as block:
            await ask(client, "verify")
        return block

    @autellix.program
    async def agent() -> str | None:
        await asyncio.gather(verify(), summarize())
        return await ask(client, "main")

    main_thread = await agent()

    assert server.state.opened_programs == ["prog-1"]  # the nested program is a thread
    verify_call, summarize_call = server.call_tagged("verify"), server.call_tagged("summarize")
    assert (verify_call.thread_id or "").startswith("verify-")
    assert (summarize_call.thread_id or "").startswith("summarize-")
    assert verify_call.parent_thread_id == summarize_call.parent_thread_id == main_thread


async def test_outside_programs_plain_tasks_tag_nothing(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    await asyncio.gather(ask(client, "t1"), asyncio.create_task(ask(client, "t2")))

    assert [call.program_id for call in server.generation_calls()] == [None, None]
