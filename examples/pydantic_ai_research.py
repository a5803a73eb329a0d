"""A research agent on Pydantic AI (``pydantic-ai-slim[openai]``), as autellix programs.

    python examples/pydantic_ai_research.py                # autellix serve on 127.0.0.1:8000
    python examples/pydantic_ai_research.py --agents 4 --passages 2

The task is ``research.py``'s: one run of the reader agent per passage, run at
once with ``asyncio.gather`` (Pydantic AI's concurrent runs), each with a
``lookup`` tool, then a run of the writer agent. What autellix needs is two
lines: the model's provider gets an ``autellix.AsyncOpenAI``, and the agent's
entry point is a ``@program``. Every model call of the research is then a
call of that one program; each reader run's calls are threads forked from the
program's main thread (docs/frameworks.md).

A reader that the model leads astray (bad tool arguments past Pydantic AI's
retries, too many turns) leaves no note, and the writer answers from the
others; a writer led astray leaves no answer.
"""

from __future__ import annotations

import argparse
import asyncio

import research as task
from _common import Endpoint, ProgramReport, run_example
from autellix import program
from knowledge_base import Passage
from pydantic_ai import Agent, UnexpectedModelBehavior, UsageLimitExceeded, UsageLimits
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings


def build_agents(endpoint: Endpoint) -> tuple[Agent[None, str], Agent[None, str]]:
    """The reader (with the lookup tool) and the writer, on the endpoint's client."""
    model = OpenAIChatModel(endpoint.model, provider=OpenAIProvider(openai_client=endpoint.client))
    reader = Agent(
        model,
        instructions=task.READER_INSTRUCTIONS,
        tools=[task.lookup],
        model_settings=ModelSettings(max_tokens=task.READER_MAX_TOKENS),
    )
    writer = Agent(
        model,
        instructions=task.WRITER_INSTRUCTIONS,
        model_settings=ModelSettings(max_tokens=task.WRITER_MAX_TOKENS),
    )
    return reader, writer


async def run_agent(agent: Agent[None, str], prompt: str) -> str | None:
    """The run's output, or None where the model led it astray: the model's fault,
    so the research goes on without it. A failed call (the server's fault) is raised."""
    try:
        result = await agent.run(prompt, usage_limits=UsageLimits(request_limit=task.MAX_TURNS))
    except (UnexpectedModelBehavior, UsageLimitExceeded):
        return None
    return result.output


@program(name="pydantic-ai-research")
async def research(
    endpoint: Endpoint, question: str, passages: list[Passage], report: ProgramReport
) -> str:
    reader, writer = build_agents(endpoint)
    prompts = [task.reader_prompt(question, passage) for passage in passages]
    notes = await asyncio.gather(*(run_agent(reader, prompt) for prompt in prompts))
    answer = await run_agent(writer, task.writer_prompt(question, notes))
    await task.note_program(endpoint, report)
    return (answer or "").strip() or task.NO_ANSWER


async def main(args: argparse.Namespace, endpoint: Endpoint) -> list[ProgramReport]:
    return await task.run_research(args, endpoint, "pydantic-ai", research)


def parser() -> argparse.ArgumentParser:
    return task.research_parser(__doc__ or "")


if __name__ == "__main__":
    raise SystemExit(run_example(parser(), main))
