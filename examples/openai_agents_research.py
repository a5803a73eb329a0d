"""A research agent on the OpenAI Agents SDK (``openai-agents``), as autellix programs.

    python examples/openai_agents_research.py              # autellix serve on 127.0.0.1:8000
    python examples/openai_agents_research.py --agents 4 --passages 2

The task is ``research.py``'s: one reader agent per passage, run at once with
``asyncio.gather`` (the Agents SDK's parallelization pattern), each with a
``lookup`` function tool, then a writer agent. What autellix needs is two
lines: the Agents SDK gets an ``autellix.AsyncOpenAI`` as its default client,
and the agent's entry point is a ``@program``. Every model call of the run,
the readers' tool turns included, is then a call of that one program; each
reader's calls are threads forked from the program's main thread
(docs/frameworks.md). The SDK talks the Responses API (``/v1/responses``),
which the router and vLLM serve; ``--api chat_completions`` switches.

A reader that the model leads astray (a reply cut off at its token limit, a
call of a tool that does not exist, too many turns) leaves no note, and the
writer answers from the others; a writer led astray leaves no answer.
"""

from __future__ import annotations

import argparse
import asyncio

import research as task
from _common import Endpoint, ProgramReport, run_example
from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelBehaviorError,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from autellix import program
from knowledge_base import Passage

API_CHOICES = ("responses", "chat_completions")


def build_agents(model: str) -> tuple[Agent, Agent]:
    """The reader (with the lookup tool) and the writer."""
    reader = Agent(
        name="reader",
        instructions=task.READER_INSTRUCTIONS,
        model=model,
        tools=[function_tool(task.lookup)],
        model_settings=ModelSettings(max_tokens=task.READER_MAX_TOKENS),
    )
    writer = Agent(
        name="writer",
        instructions=task.WRITER_INSTRUCTIONS,
        model=model,
        model_settings=ModelSettings(max_tokens=task.WRITER_MAX_TOKENS),
    )
    return reader, writer


async def run_agent(agent: Agent, prompt: str) -> str | None:
    """The agent's final output, or None where the model led the run astray (a
    reply cut off at its token limit, a call of a tool that does not exist, too
    many turns): the model's fault, so the research goes on without it. A failed
    call (the server's fault) is raised."""
    try:
        result = await Runner.run(agent, prompt, max_turns=task.MAX_TURNS)
    except (ModelBehaviorError, MaxTurnsExceeded):
        return None
    return str(result.final_output)


@program(name="agents-sdk-research")
async def research(
    endpoint: Endpoint, question: str, passages: list[Passage], report: ProgramReport
) -> str:
    reader, writer = build_agents(endpoint.model)
    prompts = [task.reader_prompt(question, passage) for passage in passages]
    notes = await asyncio.gather(*(run_agent(reader, prompt) for prompt in prompts))
    answer = await run_agent(writer, task.writer_prompt(question, notes))
    await task.note_program(endpoint, report)
    return (answer or "").strip() or task.NO_ANSWER


def use_client(endpoint: Endpoint, api: str) -> None:
    """Make the Agents SDK call through the endpoint's autellix client."""
    set_default_openai_client(endpoint.client, use_for_tracing=False)
    set_default_openai_api(api)  # type: ignore[arg-type]
    # The SDK's traces go to OpenAI's platform, which a local server is not.
    set_tracing_disabled(True)


async def main(args: argparse.Namespace, endpoint: Endpoint) -> list[ProgramReport]:
    use_client(endpoint, args.api)
    return await task.run_research(args, endpoint, "agents-sdk", research)


def parser() -> argparse.ArgumentParser:
    parser = task.research_parser(__doc__ or "")
    parser.add_argument(
        "--api", choices=API_CHOICES, default="responses",
        help="the OpenAI API the Agents SDK talks (default %(default)s, the SDK's own)",
    )  # fmt: skip
    return parser


if __name__ == "__main__":
    raise SystemExit(run_example(parser(), main))
