"""A ReAct agent (thought, action, observation) over offline tools, as autellix programs.

    python examples/react_agent.py                          # autellix serve on 127.0.0.1:8000
    python examples/react_agent.py --agents 8 --max-steps 4
    python examples/react_agent.py --base-url https://api.openai.com/v1 --model gpt-4o-mini

Each agent answers one question about the Saltmarrow Isles (a made-up place,
so the model must use the tools; some questions take one lookup, others two
facts and arithmetic). At every step the model replies with a JSON object
``{"action", "input", "thought"}`` (structured output, so even the
random-weight test model produces parseable steps; the first step cannot
finish) and the agent runs the action:

    search <words>        BM25 over the passages: the best three, title and first sentence
    lookup <title>        the passage with that title
    calculate <expr>      exact arithmetic (ast, no eval; sizes bounded)
    finish <answer>       the answer

A reply that cannot be used (cut off, not JSON, unknown action) is asked for
again, at most ``--retries`` times; after that, or after ``--max-steps`` steps,
the model is asked once for a final answer. Nothing the model writes can crash
the loop. ``--agents N`` runs N agents at once, each its own program (one
thread each); the table at the end has one row per agent.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from dataclasses import dataclass

import autellix
from _common import (
    Endpoint,
    ExampleError,
    ProgramReport,
    ask_json,
    choice_field,
    example_parser,
    object_schema,
    positive_int,
    run_example,
    run_programs,
    shorten,
    text_field,
)
from autellix import program
from calculator import calculate
from knowledge_base import KnowledgeBase, Question, load_questions

log = logging.getLogger("examples.react")

ACTIONS = ("search", "lookup", "calculate", "finish")
# Short fields keep calls fast on the CPU test model, which fills every field to
# its limit; a real model writes far less than this.
THOUGHT_CHARS = 40
INPUT_CHARS = 40
ANSWER_CHARS = 60
# The action comes before the thought: a small model that thinks first tends to
# make up an answer there and then search for it (a 135M model searched for years).
STEP_SCHEMA = object_schema(
    action=choice_field(ACTIONS), input=text_field(INPUT_CHARS), thought=text_field(THOUGHT_CHARS)
)
# The first step must consult a tool: small models otherwise answer from nothing.
FIRST_STEP_SCHEMA = object_schema(
    action=choice_field(a for a in ACTIONS if a != "finish"),
    input=text_field(INPUT_CHARS),
    thought=text_field(THOUGHT_CHARS),
)
FINAL_SCHEMA = object_schema(answer=text_field(ANSWER_CHARS))
SYSTEM_PROMPT = (
    "Answer the question about the Saltmarrow Isles with tools: you know nothing about"
    " them yourself. Reply in JSON. Actions: search (words from the question), lookup (a"
    " passage title), calculate (arithmetic), finish (the answer, as an observation gave it)."
)
# One worked question before the real one, as chat turns: without it a 135M model
# searches for made-up years instead of the question's words.
EXAMPLE_TURNS = [
    {"role": "user", "content": "Question: How long is the ferry Marram Queen?"},
    {"role": "assistant", "content": '{"thought":"Search the ship.","action":"search",'
                                     '"input":"ferry Marram Queen long"}'},
    {"role": "user", "content": "Observation: Marram Queen: The Marram Queen is 74 metres"
                                " long. | Cold Sound: The Cold Sound is a strait."},
    {"role": "assistant", "content": '{"thought":"It is 74 metres.","action":"finish",'
                                     '"input":"74 metres"}'},
]  # fmt: skip
STEP_MAX_TOKENS = 192
FINAL_MAX_TOKENS = 96
TEMPERATURE = 0.3
OBSERVATION_CHARS = 400
MIN_OBSERVATION_CHARS = 40  # a step whose observation gets less room is left out
# Characters the chat template adds per message ("user: ...\n") and per prompt.
TEMPLATE_CHARS = 16


@dataclass
class Step:
    thought: str
    action: str
    argument: str
    observation: str = ""


class Toolbox:
    """The agent's actions other than finish: text in, text out, never raising."""

    def __init__(self, knowledge: KnowledgeBase) -> None:
        self.knowledge = knowledge

    def run(self, action: str, argument: str) -> str:
        if action == "search":
            return self.search(argument)
        if action == "lookup":
            return self.lookup(argument)
        if action == "calculate":
            return calculate(argument)
        return f"error: unknown action {action!r}"

    def search(self, query: str) -> str:
        hits = self.knowledge.search(query, k=3)
        if not hits:
            return "no passage matches; try other words"
        return " | ".join(f"{hit.title}: {first_sentence(hit.text)}" for hit in hits)

    def lookup(self, title: str) -> str:
        passage = self.knowledge.lookup(title)
        if passage is not None:
            return passage.text
        similar = self.knowledge.similar_titles(title)
        hint = f"; similar titles: {', '.join(similar)}" if similar else "; search first"
        return f"no passage titled {title.strip()!r}{hint}"


def first_sentence(text: str) -> str:
    return re.split(r"(?<=\.)\s", text, maxsplit=1)[0]


def parse_step(data: dict[str, object] | None) -> Step | None:
    """The step in a reply, or None if it has no known action."""
    if data is None:
        return None
    action = str(data.get("action", "")).strip().lower()
    if action not in ACTIONS:
        return None
    return Step(str(data.get("thought", "")), action, str(data.get("input", "")).strip())


def build_messages(
    question: str, steps: list[Step], budget_chars: int, closing: str | None = None
) -> list[dict[str, str]]:
    """The prompt: instructions, the question, and as many of the latest steps as
    fit in ``budget_chars`` (each step: the model's JSON, then the observation).
    Older steps are dropped first; the newest observation is cut if needed."""
    head = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Question: {question}"},
    ]
    tail = [{"role": "user", "content": closing}] if closing else []
    room = budget_chars - sum(len(m["content"]) + TEMPLATE_CHARS for m in head + tail)
    history: list[dict[str, str]] = []
    for step in reversed(steps):
        said = json.dumps({"thought": step.thought, "action": step.action, "input": step.argument})
        room -= len(said) + 2 * TEMPLATE_CHARS
        if room < MIN_OBSERVATION_CHARS:
            break
        observation = "Observation: " + shorten(step.observation, OBSERVATION_CHARS)
        observation = shorten(observation, room)
        room -= len(observation)
        history[:0] = [
            {"role": "assistant", "content": said},
            {"role": "user", "content": observation},
        ]
    return head + history + tail


@dataclass
class Settings:
    max_steps: int
    retries: int


def prompt_budget(endpoint: Endpoint, max_tokens: int) -> int:
    """Prompt characters that leave room for a reply of ``max_tokens`` in the model's
    context (a token is at least one character, so this never overflows it)."""
    return endpoint.context_tokens - max_tokens - TEMPLATE_CHARS


async def next_step(
    question: str, steps: list[Step], endpoint: Endpoint, report: ProgramReport, settings: Settings
) -> Step | None:
    """The model's next step; None when ``1 + retries`` replies were all unusable."""
    messages = build_messages(question, steps, prompt_budget(endpoint, STEP_MAX_TOKENS))
    for attempt in range(1 + settings.retries):
        schema = STEP_SCHEMA if steps else FIRST_STEP_SCHEMA
        reply = await ask_json(
            endpoint, report, messages, schema, schema_name="react_step",
            max_tokens=STEP_MAX_TOKENS, temperature=TEMPERATURE, attempt=attempt,
        )  # fmt: skip
        step = parse_step(reply.data)
        if step is not None:
            return step
        log.info("%s: unusable reply (%s): %s", report.label, reply.finish_reason,
                 shorten(reply.text, 60))  # fmt: skip
    return None


async def final_answer(
    question: str, steps: list[Step], endpoint: Endpoint, report: ProgramReport
) -> str:
    """One last call for the answer, after the steps ran out or the replies were unusable."""
    closing = "Reply with your final answer now, taken from the observations above."
    messages = build_messages(question, steps, prompt_budget(endpoint, FINAL_MAX_TOKENS), closing)
    reply = await ask_json(
        endpoint, report, messages, FINAL_SCHEMA,
        schema_name="final_answer", max_tokens=FINAL_MAX_TOKENS, temperature=TEMPERATURE,
    )  # fmt: skip
    answer = (reply.data or {}).get("answer")
    return str(answer).strip() if answer is not None else "(no answer: unusable model output)"


@program(name="react")
async def react_agent(
    question: Question,
    endpoint: Endpoint,
    tools: Toolbox,
    report: ProgramReport,
    settings: Settings,
) -> str:
    """Think, act, observe until the model finishes or the steps run out."""
    report.program_id = autellix.current_program()
    steps: list[Step] = []
    answer: str | None = None
    while len(steps) < settings.max_steps:
        step = await next_step(question.question, steps, endpoint, report, settings)
        if step is None:
            break
        if step.action == "finish":
            answer = step.argument
            break
        with report.timing_tool():
            step.observation = tools.run(step.action, step.argument)
        log.info("%s step %d: %s %r -> %s", report.label, len(steps) + 1, step.action,
                 step.argument, shorten(step.observation, 60))  # fmt: skip
        steps.append(step)
    if answer is None:
        answer = await final_answer(question.question, steps, endpoint, report)
    report.answer = answer
    report.columns = {
        "STEPS": str(len(steps)),
        "RIGHT": "yes" if mentions_number(answer, question.answer) else "no",
    }
    report.server = await endpoint.program_row()  # before the program ends and leaves the table
    return answer


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def mentions_number(text: str, expected: str, tolerance: float = 0.05) -> bool:
    """Whether ``text`` contains the number ``expected`` (commas ignored)."""
    target = float(expected)
    return any(abs(float(n) - target) <= tolerance for n in _NUMBER.findall(text.replace(",", "")))


async def main(args: argparse.Namespace, endpoint: Endpoint) -> list[ProgramReport]:
    questions = load_questions()
    tools = Toolbox(KnowledgeBase.load())
    settings = Settings(max_steps=args.max_steps, retries=args.retries)
    log.info("react: %d agents on %s at %s", args.agents, endpoint.model, args.base_url)

    async def run_one(index: int, report: ProgramReport) -> None:
        question = questions[index % len(questions)]
        await react_agent(question, endpoint, tools, report, settings)
        log.info("react: %s finished after %d calls: %s", report.label, report.calls, report.answer)

    return await run_programs("react", args.agents, run_one, args.start_every)


def check_args(args: argparse.Namespace) -> None:
    if args.retries < 0:
        raise ExampleError("--retries must be >= 0")


def parser() -> argparse.ArgumentParser:
    parser = example_parser(__doc__ or "")
    parser.add_argument("--agents", type=positive_int, default=1, help="agents (programs) at once")
    parser.add_argument("--max-steps", type=positive_int, default=6, help="actions per agent")
    parser.add_argument("--retries", type=int, default=1, help="new tries after an unusable reply")
    return parser


if __name__ == "__main__":
    raise SystemExit(run_example(parser(), main, check_args))
