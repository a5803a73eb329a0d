"""A ReAct agent (thought, action, observation) over offline tools, as autellix programs.

    python examples/react_agent.py                          # autellix serve on 127.0.0.1:8000
    python examples/react_agent.py --agents 8 --questions all --max-steps 4
    python examples/react_agent.py --base-url https://api.openai.com/v1 --model gpt-4o-mini \\
        --api-key "$OPENAI_API_KEY"

Each agent answers one question about the Saltmarrow Isles (a made-up place,
so the model must use the tools): by default one that a single sentence
answers; ``--questions all`` adds those that take two facts and arithmetic. At
every step the model replies with a JSON object ``{"action", "input",
"thought"}`` and the agent runs the action:

    lookup <title>        the sentence of that passage that answers the question best
    calculate <expr>      exact arithmetic on numbers the observations gave (ast, no eval)
    finish <answer>       the answer: a number an observation gave, with the words after it

The reply is structured output whose schema admits only inputs the action can
use: a title among the passages the question's words point to (BM25), an
expression of the numbers seen so far, an answer among those numbers. A
model as small as the default 135M one then succeeds by copying, from the
question into the lookup and from the observation into the answer, which is
what it can do; a bigger model gets the same choices. The first step cannot
finish (there is nothing to copy yet).

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
from dataclasses import dataclass, field
from typing import Any

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

ACTIONS = ("lookup", "calculate", "finish")
QUESTION_SETS = {
    "lookup": "the questions one sentence answers",
    "all": "also those that take two facts and arithmetic",
}
# Short fields keep calls fast on the CPU test model, which fills every field to
# its limit; a real model writes far less than this.
THOUGHT_CHARS = 40
ANSWER_CHARS = 60
TITLES_OFFERED = 4  # lookup takes one of the passages that match the question best
WORDS_AFTER_NUMBER = 2  # an answer is a number with the words that follow it ("611 metres")
NUMBER = r"\d[\d,]*(?:\.\d+)?"
ANSWER_OPTION = re.compile(NUMBER + rf"(?: [a-z]+){{0,{WORDS_AFTER_NUMBER}}}")
SYSTEM_PROMPT = (
    "Answer the question about the Saltmarrow Isles with tools: you know nothing about"
    " them yourself. Reply in JSON. Actions: lookup (the passage about the question's"
    " subject), calculate (arithmetic on numbers the observations gave), finish (the"
    " answer: a number an observation gave, with the words after it)."
)
# One worked question before the real one, as chat turns: a 135M model copies
# its shape (look the subject up, then finish with the number it was given).
EXAMPLE_TURNS = [
    {"role": "user", "content": "Question: How long is the ferry Marram Queen?"},
    {"role": "assistant", "content": '{"action":"lookup","input":"Marram Queen",'
                                     '"thought":"Look the ship up."}'},
    {"role": "user", "content": "Observation: Marram Queen: She was launched in 1967, is 74"
                                " metres long and carries up to 310 passengers."},
    {"role": "assistant", "content": '{"action":"finish","input":"74 metres long",'
                                     '"thought":"It says 74 metres."}'},
]  # fmt: skip
STEP_MAX_TOKENS = 96
FINAL_MAX_TOKENS = 48
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


@dataclass
class Toolbox:
    """The agent's actions other than finish, for one question: text in, text out,
    never raising."""

    knowledge: KnowledgeBase
    question: str
    titles: list[str] = field(init=False)  # what lookup offers: the best matches first

    def __post_init__(self) -> None:
        self.titles = self.knowledge.titles_for(self.question, TITLES_OFFERED) or [
            passage.title for passage in self.knowledge.passages
        ]

    def run(self, action: str, argument: str) -> str:
        if action == "lookup":
            return self.lookup(argument)
        if action == "calculate":
            return calculate(argument.replace(",", ""))
        return f"error: unknown action {action!r}"

    def lookup(self, title: str) -> str:
        passage = self.knowledge.lookup(title)
        if passage is not None:
            return f"{passage.title}: {self.knowledge.best_sentence(passage, self.question)}"
        return self.knowledge.not_found(title)


def answer_options(steps: list[Step]) -> list[str]:
    """What finish may answer: each number the observations gave, with the words
    that follow it (``611 metres above``), in order, without repeats."""
    found = (m.group(0) for step in steps for m in ANSWER_OPTION.finditer(step.observation))
    return list(dict.fromkeys(option.rstrip(",.") for option in found))


def numbers_seen(steps: list[Step]) -> list[str]:
    """The numbers the observations gave, commas dropped (``21,400`` is 21400)."""
    found = (
        n.rstrip(",.").replace(",", "") for s in steps for n in re.findall(NUMBER, s.observation)
    )
    return list(dict.fromkeys(found))


def step_schema(titles: list[str], steps: list[Step]) -> dict[str, Any]:
    """The replies a step may give: one object per action, each with the inputs
    that action can use (calculate and finish once an observation gave numbers)."""

    def action(name: str, argument: dict[str, Any]) -> dict[str, Any]:
        return object_schema(
            action=choice_field([name]), input=argument, thought=text_field(THOUGHT_CHARS)
        )

    branches = [action("lookup", choice_field(titles))]
    numbers = numbers_seen(steps)
    if numbers:
        number = "(" + "|".join(re.escape(n) for n in numbers) + ")"
        expression = {"type": "string", "pattern": f"^{number}( [-+*/] {number}){{1,3}}$"}
        branches += [
            action("calculate", expression),
            action("finish", choice_field(answer_options(steps))),
        ]
    return {"anyOf": branches}


def answer_of(option: str) -> str:
    """The number an answer option starts with (``611`` of ``611 metres above``);
    any other text as it is."""
    found = re.match(NUMBER, option)
    return found.group(0).rstrip(",.") if found else option


def final_schema(steps: list[Step]) -> dict[str, Any]:
    """The final answer: one of :func:`answer_options`, or any short text if none."""
    options = answer_options(steps)
    return object_schema(answer=choice_field(options) if options else text_field(ANSWER_CHARS))


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
    """The prompt: instructions, the worked example, the question, and as many of
    the latest steps as fit in ``budget_chars`` (each step: the model's JSON, then
    the observation). Older steps are dropped first; the newest observation is
    cut if needed; the example goes before any step does."""
    question_turn = {"role": "user", "content": f"Question: {question}"}
    system = {"role": "system", "content": SYSTEM_PROMPT}
    tail = [{"role": "user", "content": closing}] if closing else []

    def size(messages: list[dict[str, str]]) -> int:
        return sum(len(m["content"]) + TEMPLATE_CHARS for m in messages)

    head = [system, *EXAMPLE_TURNS, question_turn]
    if size(head + tail) > budget_chars:
        head = [system, question_turn]
    room = budget_chars - size(head + tail)
    history: list[dict[str, str]] = []
    for step in reversed(steps):
        said = json.dumps({"action": step.action, "input": step.argument, "thought": step.thought})
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
    tools: Toolbox, steps: list[Step], endpoint: Endpoint, report: ProgramReport, settings: Settings
) -> Step | None:
    """The model's next step; None when ``1 + retries`` replies were all unusable."""
    messages = build_messages(tools.question, steps, prompt_budget(endpoint, STEP_MAX_TOKENS))
    schema = step_schema(tools.titles, steps)
    for attempt in range(1 + settings.retries):
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
        endpoint, report, messages, final_schema(steps),
        schema_name="final_answer", max_tokens=FINAL_MAX_TOKENS, temperature=TEMPERATURE,
    )  # fmt: skip
    answer = (reply.data or {}).get("answer")
    if answer is None:
        return "(no answer: unusable model output)"
    return answer_of(str(answer).strip())


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
        step = await next_step(tools, steps, endpoint, report, settings)
        if step is None:
            break
        if step.action == "finish":
            answer = answer_of(step.argument)
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
    questions = [q for q in load_questions() if args.questions == "all" or q.facts == 1]
    knowledge = KnowledgeBase.load()
    settings = Settings(max_steps=args.max_steps, retries=args.retries)
    log.info("react: %d agents on %s at %s", args.agents, endpoint.model, args.base_url)

    async def run_one(index: int, report: ProgramReport) -> None:
        question = questions[index % len(questions)]
        tools = Toolbox(knowledge, question.question)
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
    parser.add_argument(
        "--questions",
        choices=list(QUESTION_SETS),
        default="lookup",
        help="; ".join(f"{name}: {meaning}" for name, meaning in QUESTION_SETS.items()),
    )
    return parser


if __name__ == "__main__":
    raise SystemExit(run_example(parser(), main, check_args))
