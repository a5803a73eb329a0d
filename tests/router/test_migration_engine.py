"""Migrating a plain-openai agent, end to end: the router and the real engine see
one program with its parallel sub-tasks as threads.

Each agent is written as a user would write it for the plain `openai` package;
its migration is the list of line edits the docs tell the user to make. Each
test checks the whole diff between the two sources, then runs the migrated one
against a router over the shared real engine (tests/conftest.py ``engine``).
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
import re
import types
from typing import Any

import pytest
from doc_code import ROOT

pytestmark = pytest.mark.engine

PLAIN_ASYNC_AGENT = """\
import asyncio
import os

from openai import AsyncOpenAI

client = AsyncOpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
MODEL = os.environ["AGENT_MODEL"]


async def ask(prompt: str) -> str:
    answer = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=4
    )
    return answer.choices[0].message.content or ""


async def subtask(plan: str, part: int) -> str:
    draft = await ask(f"Draft part {part} of: {plan}")
    return await ask(f"Check this draft: {draft}")


async def agent(task: str) -> str:
    plan = await ask(f"Plan: {task}")
    parts = await asyncio.gather(*(subtask(plan, part) for part in range(3)))
    return await ask("Merge: " + " | ".join(parts))
"""

PLAIN_SYNC_AGENT = """\
import os
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

client = OpenAI()
MODEL = os.environ["AGENT_MODEL"]


def ask(prompt: str) -> str:
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=4
    )
    return answer.choices[0].message.content or ""


def subtask(plan: str, part: int) -> str:
    draft = ask(f"Draft part {part} of: {plan}")
    return ask(f"Check this draft: {draft}")


def agent(task: str) -> str:
    plan = ask(f"Plan: {task}")
    with ThreadPoolExecutor(max_workers=3) as pool:
        parts = list(pool.map(subtask, [plan] * 3, range(3)))
    return ask("Merge: " + " | ".join(parts))
"""

# Migrations: a line of the plain agent -> the lines that replace it.
ASYNC_MIGRATION = {
    "from openai import AsyncOpenAI": ["from autellix import AsyncOpenAI, program"],
    "async def agent(task: str) -> str:": ["@program", "async def agent(task: str) -> str:"],
}
SYNC_MIGRATION = {
    "from openai import OpenAI": ["from autellix import OpenAI, forked, program"],
    "def agent(task: str) -> str:": ["@program", "def agent(task: str) -> str:"],
    "        parts = list(pool.map(subtask, [plan] * 3, range(3)))": [
        "        parts = list(pool.map(forked(subtask), [plan] * 3, range(3)))"
    ],
}

CALLS = 1 + 3 * 2 + 1  # plan, three sub-tasks of two calls, merge
THREADS = 1 + 3  # main and one per sub-task


def migrate(source: str, edits: dict[str, list[str]]) -> str:
    """`source` with each line that is a key of `edits` replaced by its lines."""
    lines = source.splitlines()
    assert set(edits) <= set(lines), "every edit must match a whole line"
    return "\n".join(new for line in lines for new in edits.get(line, [line])) + "\n"


def changed_lines(before: str, after: str) -> list[str]:
    """The lines a diff of the two sources removes ("- ...") and adds ("+ ...")."""
    diff = difflib.ndiff(before.splitlines(), after.splitlines())
    return [line for line in diff if line.startswith(("- ", "+ "))]


def load_agent(source: str) -> types.ModuleType:
    """Run an agent's source as a fresh module (its client reads the environment now)."""
    module = types.ModuleType("agent_under_test")
    exec(compile(source, "<agent under test>", "exec"), module.__dict__)
    return module


@pytest.fixture
def agent_environment(engine: Any, monkeypatch: pytest.MonkeyPatch):
    """Point agents at a router over the engine: returns ``set_router(url)``."""
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    monkeypatch.setenv("AGENT_MODEL", engine.served_model_name)
    return lambda router_url: monkeypatch.setenv("OPENAI_BASE_URL", router_url + "/v1")


def programs_at_their_end(router: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The router's records of the programs that end from now on, as they were
    when they ended (the last moment `autellix ps` could show them)."""
    table = router.state.programs
    ended: list[Any] = []
    end = table.end

    def record_and_end(*args: Any, **kwargs: Any) -> Any:
        record = end(*args, **kwargs)
        ended.append(record)
        return record

    monkeypatch.setattr(table, "end", record_and_end)
    return ended


async def run_agent(module: types.ModuleType) -> None:
    """Run the agent's `agent(task)`; blocking ones off the event loop that serves the router."""
    if inspect.iscoroutinefunction(module.agent):
        await module.agent("write a report")
    else:
        await asyncio.to_thread(module.agent, "write a report")


@pytest.mark.parametrize(
    ("plain", "migration", "diff"),
    [
        pytest.param(
            PLAIN_ASYNC_AGENT,
            ASYNC_MIGRATION,
            [
                "- from openai import AsyncOpenAI",
                "+ from autellix import AsyncOpenAI, program",
                "+ @program",
            ],
            id="async-gather-two-lines",
        ),
        pytest.param(
            PLAIN_SYNC_AGENT,
            SYNC_MIGRATION,
            [
                "- from openai import OpenAI",
                "+ from autellix import OpenAI, forked, program",
                "+ @program",
                "-         parts = list(pool.map(subtask, [plan] * 3, range(3)))",
                "+         parts = list(pool.map(forked(subtask), [plan] * 3, range(3)))",
            ],
            id="sync-thread-pool-with-forked",
        ),
    ],
)
async def test_migrated_agent_is_one_program_with_a_thread_per_subtask(
    plain: str,
    migration: dict[str, list[str]],
    diff: list[str],
    engine: Any,
    start_router: Any,
    agent_environment: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    migrated = migrate(plain, migration)
    assert changed_lines(plain, migrated) == diff
    async with start_router([engine.base_url]) as router:
        agent_environment(router.url)
        ended = programs_at_their_end(router, monkeypatch)

        await run_agent(load_agent(plain))
        # Before: no program of its own, only those the router derives from the
        # conversations (one per conversation, see test_derived_engine.py).
        before = list(router.state.programs)
        assert before and all(r.program_id.startswith("derived-") for r in before)
        assert ended == []

        await run_agent(load_agent(migrated))

    [program] = ended
    assert program.name == "agent" and program.issued
    assert (len(program.threads), program.calls_completed) == (THREADS, CALLS)
    assert program.calls_failed == 0


def readme_agent() -> str:
    """The README's migrated agent, the Python block that uses ``@program``."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    [agent] = [block for block in blocks if "@program" in block]
    return agent


async def test_the_readme_agent_runs_as_shown(
    engine: Any, start_router: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's snippet, with the test router's URL and the engine's model for
    the README's, is one program with a main thread and three children."""
    source = readme_agent()
    assert 'base_url="http://127.0.0.1:8000/v1"' in source  # what autellix serve prints
    async with start_router([engine.base_url]) as router:
        ended = programs_at_their_end(router, monkeypatch)
        runnable = source.replace("http://127.0.0.1:8000/v1", router.url + "/v1").replace(
            '"SmolLM2-135M-Instruct"', repr(engine.served_model_name)
        )
        await asyncio.to_thread(exec, compile(runnable, "README.md", "exec"), {})
    [program] = ended
    assert program.name == "agent"
    assert (len(program.threads), program.calls_completed) == (THREADS, CALLS)
