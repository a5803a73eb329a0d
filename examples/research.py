"""The research task the framework examples share, written once so that each
example file holds only what its framework does.

An agent answers a question about the Saltmarrow Isles (a made-up place, so the
model must read). BM25 picks the passages that match the question; in the
parallel step, one reader per passage (an LLM call of its own, run at the same
time as the others) writes down what its passage says about the question, and
may call the ``lookup`` tool to read a passage the first one names; then a
writer answers from the readers' notes.

Each example runs ``--agents N`` such agents at once, each one autellix
program, and ends with the table of ``_common.format_reports``: its CALLS and
THREADS columns are the router's counts (``autellix ps`` shows the same rows
while they run).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Awaitable, Callable

import autellix
from _common import Endpoint, ProgramReport, example_parser, positive_int, run_programs, shorten
from knowledge_base import KnowledgeBase, Passage, Question, load_questions

log = logging.getLogger("examples.research")

READER_INSTRUCTIONS = (
    "You read one passage about the Saltmarrow Isles and write, in one sentence, what it"
    " says that helps answer the question. Call lookup(title) only to read another passage"
    " the first one names."
)
WRITER_INSTRUCTIONS = (
    "Answer the question about the Saltmarrow Isles in one sentence, from the notes only."
)
# Short replies keep a run on the CPU model to seconds; a real model needs no more.
READER_MAX_TOKENS = 64
WRITER_MAX_TOKENS = 96
# Model turns of one agent run: its answer, or tool calls and then its answer.
MAX_TURNS = 3
NO_NOTE = "(nothing)"
NO_ANSWER = "(no answer)"

KNOWLEDGE = KnowledgeBase.load()


def lookup(title: str) -> str:
    """The text of the passage titled ``title`` (or the titles that come close).

    The readers' tool: text in, text out, never raising, whatever the model asks.
    """
    passage = KNOWLEDGE.lookup(title)
    return f"{passage.title}: {passage.text}" if passage is not None else KNOWLEDGE.not_found(title)


def reader_prompt(question: str, passage: Passage) -> str:
    return f"Question: {question}\nPassage ({passage.title}): {passage.text}"


def writer_prompt(question: str, notes: list[str | None]) -> str:
    """The writer's prompt; a reader that wrote nothing (None, or blanks) is shown as such."""
    lines = "\n".join(f"- {' '.join((note or '').split()) or NO_NOTE}" for note in notes)
    return f"Question: {question}\nNotes:\n{lines}"


Research = Callable[[Endpoint, str, list[Passage], ProgramReport], Awaitable[str]]


async def run_research(
    args: argparse.Namespace, endpoint: Endpoint, framework: str, research: Research
) -> list[ProgramReport]:
    """Run ``args.agents`` researches at once, the i-th on question i; ``research``
    is the example's agent: a ``@program`` that returns the answer."""
    questions: list[Question] = load_questions()
    log.info("%s: %d agents on %s at %s", framework, args.agents, endpoint.model, args.base_url)

    async def run_one(index: int, report: ProgramReport) -> None:
        question = questions[index % len(questions)]
        passages = KNOWLEDGE.search(question.question, args.passages)
        report.answer = await research(endpoint, question.question, passages, report)
        right = question.answer.lower() in report.answer.lower()
        report.columns["RIGHT"] = "yes" if right else "no"
        log.info("%s: %s answered %s", framework, report.label, shorten(report.answer, 80))

    return await run_programs(framework, args.agents, run_one, args.start_every)


async def note_program(endpoint: Endpoint, report: ProgramReport) -> None:
    """Fill in the report's program id and the router's row of it (its calls and
    threads). Call it at the end of the program: ended programs leave the table."""
    report.program_id = autellix.current_program()
    report.server = await endpoint.program_row()


def research_parser(description: str) -> argparse.ArgumentParser:
    parser = example_parser(description)
    parser.add_argument("--agents", type=positive_int, default=1, help="agents (programs) at once")
    parser.add_argument(
        "--passages", type=positive_int, default=3,
        help="passages per question, one parallel reader each (default %(default)s)",
    )  # fmt: skip
    return parser
