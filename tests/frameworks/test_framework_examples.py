"""The framework examples' agents, run in the real frameworks (OpenAI Agents SDK,
LangGraph, Pydantic AI) against the project's router in front of a recording
engine that plays the model: one run is one program, its parallel readers are
sibling threads forked from the program's main thread, the framework ran the
two tool calls the model asked for in one turn, and the program is ended when
the run finishes, also when it fails."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import ModuleType

import langgraph_research
import openai_agents_research
import pydantic_ai_research
import pytest
from _common import ProgramReport, connect
from autellix_vllm.router import RouterConfig, create_app
from autellix_vllm.router.app import router_runner
from local_http import serving
from recording_engine import (
    MODEL,
    EngineFailure,
    Recorded,
    RecordingEngine,
    Reply,
    Script,
    ToolCall,
    recording_engine,
)
from research import WRITER_INSTRUCTIONS
from router_http import PROGRAMS, program_row, request

ANSWER = "Port Ellery was founded in 1614."
LOOKUPS = ("Port Ellery", "The Moot")


def is_writer(call: Recorded) -> bool:
    return WRITER_INSTRUCTIONS in call.text() or "Notes:" in call.text()


def researcher(call: Recorded) -> Reply:
    """A model that plays well: a reader with tools looks up two passages at once
    (one turn, two tool calls) and then writes a note; the writer answers."""
    if is_writer(call):
        return ANSWER
    if call.body.get("tools") and not call.has_tool_results:
        return [ToolCall("lookup", {"title": title}) for title in LOOKUPS]
    return "note: founded in 1614"


def failing_writer(call: Recorded) -> Reply:
    """The readers' calls go well; the writer's call fails on the engine."""
    if is_writer(call):
        raise EngineFailure("the engine broke")
    return researcher(call)


@contextlib.asynccontextmanager
async def served(script: Script) -> AsyncIterator[tuple[RecordingEngine, str]]:
    """(the engine, the router's /v1 URL): the project's router over one recording engine."""
    async with recording_engine(script) as engine:
        app = create_app(RouterConfig(upstreams=(engine.url,)))
        async with serving(router_runner(app)) as url:
            yield engine, url


async def run_agent(module: ModuleType, url: str, *options: str) -> ProgramReport:
    args = module.parser().parse_args(
        ["--base-url", f"{url}/v1", "--model", MODEL, "--quiet", "--passages", "2", *options]
    )
    [report] = await module.main(args, await connect(args))
    return report


async def ended_row(url: str, program_id: str) -> dict | None:
    status, table = await request("GET", f"{url}{PROGRAMS}?ended=1")
    assert status == 200, table
    return program_row(table, program_id)


EXAMPLES = [
    pytest.param(openai_agents_research, ("--api", "responses"), True, id="agents-sdk-responses"),
    pytest.param(openai_agents_research, ("--api", "chat_completions"), True, id="agents-sdk-chat"),
    pytest.param(langgraph_research, (), False, id="langgraph"),
    pytest.param(pydantic_ai_research, (), True, id="pydantic-ai"),
]


@pytest.mark.parametrize(("module", "options", "readers_use_tools"), EXAMPLES)
async def test_one_run_is_one_program_with_its_parallel_readers_as_sibling_threads(
    module: ModuleType, options: tuple[str, ...], readers_use_tools: bool
):
    async with served(researcher) as (engine, url):
        report = await run_agent(module, url, *options)
        assert report.error is None and report.answer == ANSWER
        program_id = report.program_id
        assert program_id is not None and program_id.startswith("prog-")  # issued by the router
        assert {call.identity["program-id"] for call in engine.calls} == {program_id}
        assert report.server is not None and report.server["calls_completed"] == len(engine.calls)

        readers = [call for call in engine.calls if not is_writer(call)]
        [writer] = [call for call in engine.calls if is_writer(call)]
        first_turns = [call for call in readers if not call.has_tool_results]
        assert len(first_turns) == 2  # one per passage
        # Each call runs in a task the framework starts, so each is a thread of its
        # own, forked from the program's main thread: the readers are siblings.
        threads = [call.thread for call in engine.calls]
        assert len(set(threads)) == len(threads)
        main = first_turns[0].parent
        assert main.startswith("main-")
        assert {call.parent for call in engine.calls} == {main}
        assert report.server["threads"] == len(engine.calls) + 1  # and main

        if readers_use_tools:
            # Both tool calls of one turn ran before the reader's next call.
            tool_turns = [call for call in readers if call.has_tool_results]
            assert len(tool_turns) == 2
            for call in tool_turns:
                assert "founded in 1614" in call.text() and "The Moot" in call.text()
        else:
            assert readers == first_turns
        assert "note: founded in 1614" in writer.text()

        assert engine.ended == [program_id]  # the router passed the end on to the engine
        row = await ended_row(url, program_id)
        assert row is not None and row["calls_failed"] == 0


@pytest.mark.parametrize(("module", "options", "readers_use_tools"), EXAMPLES)
async def test_a_run_that_fails_still_ends_its_program(
    module: ModuleType, options: tuple[str, ...], readers_use_tools: bool
):
    async with served(failing_writer) as (engine, url):
        report = await run_agent(module, url, *options)
        assert report.error is not None and "500" in report.error
        [program_id] = {call.identity["program-id"] for call in engine.calls}
        assert engine.ended == [program_id]
        row = await ended_row(url, program_id)
        assert row is not None and row["calls_failed"] == 1
