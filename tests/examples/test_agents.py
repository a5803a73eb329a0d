"""The example agents end to end against a scripted OpenAI-compatible server (no
engine): a model that plays well, one that writes junk, and the shared pieces."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from fractions import Fraction

import mcts_agent
import pytest
import react_agent
from _common import ProgramReport, connect, format_reports, parse_json_object, write_reports
from game24 import OPERATORS, combine, is_solution, reachable, show
from knowledge_base import KnowledgeBase
from react_agent import (
    Step,
    Toolbox,
    answer_of,
    answer_options,
    build_messages,
    mentions_number,
    parse_step,
    step_schema,
)
from scripted_server import as_json, schema_name, schema_of, scripted_server


async def run_example(module, base_url: str, *options: str) -> list[ProgramReport]:
    args = module.parser().parse_args(["--base-url", base_url, "--quiet", *options])
    return await module.main(args, await connect(args))


def last_message(body: dict) -> str:
    return body["messages"][-1]["content"]


# --- ReAct ---------------------------------------------------------------------------


def researcher(body: dict) -> str:
    """A model that answers the first of all questions (Port Ellery to the Moot: 88
    years) with the tools, the way ReAct intends."""
    said = last_message(body)
    if schema_name(body) == "final_answer":
        return as_json({"answer": "88"})
    if said.startswith("Question:"):
        step = ("lookup", "Port Ellery")
    elif "founded in 1614" in said:  # the sentence of Port Ellery's passage that matches
        step = ("lookup", "the moot")
    elif "first sat in 1702" in said:
        step = ("calculate", "1702 - 1614")
    elif said == "Observation: 88":
        step = ("finish", "88 years")
    else:
        step = ("finish", f"lost at {said!r}")
    return as_json({"thought": "next", "action": step[0], "input": step[1]})


async def test_react_agent_uses_the_tools_and_answers():
    async with scripted_server(researcher) as server:
        [report] = await run_example(react_agent, server.base_url, "--questions", "all")
    assert report.error is None
    assert report.answer == "88"  # the number of the option "88 years"
    assert report.columns == {"STEPS": "3", "RIGHT": "yes"}  # lookup, lookup, calculate
    assert report.calls == 4 and report.threads == 1
    assert report.server is None  # a plain server: no process table, and no crash
    assert report.program_id is not None and report.program_id.startswith("local-")
    # Every step was asked for with a JSON schema of one object per action it allows,
    # and the observations came back.
    branches = [schema_of(body)["anyOf"] for body in server.requests]
    assert all(b["required"] == ["action", "input", "thought"] for bs in branches for b in bs)
    actions = [[b["properties"]["action"]["enum"][0] for b in bs] for bs in branches]
    assert actions[0] == ["lookup"] and actions[-1] == ["lookup", "calculate", "finish"]
    assert "first sat in 1702" in server.prompts()[-1]
    assert "WAIT" in format_reports([report]) and " - " in format_reports([report])


@pytest.mark.parametrize(
    "junk",
    [
        "not json at all",
        '{"thought": "cut off", "action": "sea',  # max_tokens reached mid-object
        '{"thought": "x", "action": "dance", "input": "y"}',  # no such action
        '["search", "x"]',
        "",
        '{"action": null, "input": {"deep": [1, 2]}}',
        "{" * 5000,
    ],
)
async def test_react_agent_survives_junk_and_gives_up_in_bounded_calls(junk):
    async with scripted_server(lambda body: (junk, "length")) as server:
        reports = await run_example(react_agent, server.base_url, "--agents", "2",
                                    "--max-steps", "5", "--retries", "2")  # fmt: skip
    for report in reports:
        assert report.error is None
        # One step asked 1 + 2 times, then one call for a final answer.
        assert report.calls == 4
        assert report.answer == "(no answer: unusable model output)"
        assert report.columns["STEPS"] == "0"


async def test_react_agents_run_as_separate_programs():
    async with scripted_server(researcher) as server:
        reports = await run_example(react_agent, server.base_url, "--agents", "3")
    assert [r.label for r in reports] == ["react-1", "react-2", "react-3"]
    assert len({r.program_id for r in reports}) == 3
    programs = Counter(identity["program-id"] for identity in server.identities)
    assert sorted(programs.values()) == sorted(r.calls for r in reports)


def test_steps_are_parsed_leniently():
    assert parse_step({"thought": "t", "action": " Lookup ", "input": "x "}) == Step(
        "t", "lookup", "x"
    )
    assert parse_step({"action": "calculate", "input": 12}) == Step("", "calculate", "12")
    assert parse_step({"action": "fly"}) is None
    assert parse_step(None) is None
    assert parse_json_object('Sure! ```json\n{"a": 1}\n```') == {"a": 1}
    assert parse_json_object("[1, 2]") is None
    assert parse_json_object("{'a': 1}") is None


def test_tools_answer_in_text_and_never_raise():
    tools = Toolbox(KnowledgeBase.load(), "In which year was the Skerry Light built?")
    assert tools.titles[0] == "Skerry Light"
    assert tools.run("lookup", "Skerry Light") == (
        "Skerry Light: The Skerry Light is a lighthouse on Outer Skerry, built in 1832."
    )
    assert "similar titles: Skerry Light" in tools.run("lookup", "Skery Light")
    assert tools.run("calculate", "1987 - 1832") == "155"
    assert tools.run("calculate", "21,400 / 2") == "10700"
    assert tools.run("calculate", "__import__('os')").startswith("error:")
    assert tools.run("calculate", "9**9**9").startswith("error:")
    assert tools.run("lookup", "").startswith("no passage")
    assert tools.run("dance", "x").startswith("error:")


def test_a_step_offers_only_inputs_its_action_can_use():
    tools = Toolbox(KnowledgeBase.load(), "How many inhabitants does Kestrel Island have?")
    [lookup] = step_schema(tools.titles, [])["anyOf"]  # nothing seen yet: no finish
    assert "Kestrel Island" in lookup["properties"]["input"]["enum"]
    seen = [Step("", "lookup", "Kestrel Island", tools.run("lookup", "Kestrel Island"))]
    by_action = {
        b["properties"]["action"]["enum"][0]: b for b in step_schema(tools.titles, seen)["anyOf"]
    }
    assert by_action["finish"]["properties"]["input"]["enum"] == answer_options(seen)
    assert "86 inhabitants" in answer_options(seen)
    assert re.fullmatch(by_action["calculate"]["properties"]["input"]["pattern"], "86 * 3.1")
    assert not re.fullmatch(by_action["calculate"]["properties"]["input"]["pattern"], "87 * 2")
    assert answer_of("86 inhabitants") == "86" and answer_of("none") == "none"


def test_prompt_keeps_the_newest_steps_that_fit_the_budget():
    steps = [Step(f"thought {i}", "lookup", f"query {i}", "observation " * 30) for i in range(6)]
    roomy = build_messages("Q?", steps, budget_chars=100_000)
    assert len(roomy) == 2 + len(react_agent.EXAMPLE_TURNS) + 2 * 6
    tight = build_messages("Q?", steps, budget_chars=900)
    assert 2 < len(tight) < len(roomy)
    assert "query 5" in tight[-2]["content"]  # the newest step is kept
    assert all("query 0" not in m["content"] for m in tight)  # the oldest went first
    assert sum(len(m["content"]) + 16 for m in tight) <= 900
    bare = build_messages("Q?", steps, budget_chars=10)
    assert [m["role"] for m in bare] == ["system", "user"]


def test_answers_are_scored_by_the_number_they_mention():
    assert mentions_number("It took 88 years.", "88")
    assert mentions_number("about 44.4 %", "44.4")
    assert mentions_number("44.398", "44.4")
    assert mentions_number("35,200 kg", "35200")
    assert not mentions_number("1614 and 1702", "88")
    assert not mentions_number("", "88")


# --- MCTS ----------------------------------------------------------------------------


def numbers_in(prompt: str) -> list[Fraction]:
    """The numbers the MCTS agent lists: ``Numbers left: 1 (= 8 / 8), 4, 7.``"""
    listed = re.search(r"Numbers left: (.*)\. ", prompt)
    assert listed is not None, prompt
    return [Fraction(part.split(" ")[0]) for part in listed[1].split(", ")]


def solver(body: dict) -> str:
    """A model that always proposes a move that keeps the puzzle solvable."""
    if schema_name(body) == "value":
        return as_json({"verdict": "sure"})
    values = numbers_in(last_message(body))
    for i, first in enumerate(values):
        for j, second in enumerate(values):
            for operator in OPERATORS:
                result = combine(first, operator, second) if i != j else None
                rest = [v for k, v in enumerate(values) if k not in (i, j)]
                if result is not None and reachable([*rest, result]):
                    return as_json({"first": show(first), "operator": operator,
                                    "second": show(second)})  # fmt: skip
    return as_json({"first": "0", "operator": "+", "second": "0"})


async def test_mcts_finds_a_verified_solution_and_stops_early():
    async with scripted_server(solver) as server:
        [report] = await run_example(mcts_agent, server.base_url, "--puzzle", "3 3 8 8",
                                     "--width", "2", "--iterations", "10")  # fmt: skip
    assert report.error is None
    expression = report.answer.removeprefix("3 3 8 8: ").removesuffix(" = 24")
    assert expression != report.answer  # solved
    assert is_solution(expression, (3, 3, 8, 8))
    # Three moves finish the puzzle: 3 expansions of 2 threads, then the search stops.
    assert report.threads == 6
    assert report.columns["TREE"] == "4"  # root and one new position per expansion
    assert report.columns["DROPPED"] == "3"  # the twin proposals
    # Two calls per branch (propose, value), but one for the finishing moves.
    assert report.calls == 10
    assert report.columns["CRIT PATH"].startswith("5 calls/")


async def test_mcts_branches_run_in_their_own_threads():
    rng = random.Random(7)

    def random_model(body: dict) -> str:
        properties = schema_of(body)["properties"]
        return as_json({name: rng.choice(spec["enum"]) if "enum" in spec else "hm"
                        for name, spec in properties.items()})  # fmt: skip

    async with scripted_server(random_model) as server:
        [report] = await run_example(mcts_agent, server.base_url, "--puzzle", "4 7 8 8",
                                     "--width", "3", "--iterations", "3")  # fmt: skip
    assert report.error is None
    threads = Counter(identity["thread-id"] for identity in server.identities)
    assert len(threads) == report.threads == 9
    assert set(threads.values()) <= {1, 2}  # propose, then (unless finished) value
    parents = {identity["parent-thread-id"] for identity in server.identities}
    assert len(parents) == 1 and "" not in parents  # all forked from the main thread
    assert int(report.columns["TREE"]) > 1


async def test_mcts_survives_a_model_that_writes_junk():
    async with scripted_server(lambda body: ("{{{ nonsense", "length")) as server:
        reports = await run_example(mcts_agent, server.base_url, "--programs", "2",
                                    "--width", "3", "--iterations", "5")  # fmt: skip
    for report in reports:
        assert report.error is None
        assert report.answer.endswith("not solved")
        # Every proposal was discarded: the root has no children and the search ends.
        assert report.columns["TREE"] == "1" and report.columns["DROPPED"] == "3"
        assert report.calls == 3


async def test_a_failing_program_is_its_own_row():
    def broken(body: dict) -> str:
        raise RuntimeError("model crashed")  # the server answers 500

    async with scripted_server(broken) as server:
        reports = await run_example(react_agent, server.base_url, "--agents", "2")
    assert all(report.error and "InternalServerError" in report.error for report in reports)
    assert "error: InternalServerError" in format_reports(reports)


def test_reports_serialise_to_json(tmp_path):
    report = ProgramReport("react-1", calls=3, server={"waiting_time": 4.0, "threads": 1})
    write_reports(tmp_path / "r.json", [report])
    [row] = json.loads((tmp_path / "r.json").read_text())
    assert ProgramReport(**row) == report
    assert "4" in format_reports([report]).splitlines()[1].split()


async def test_mcts_prompts_carry_the_solvers_advice_unless_told_not_to():
    async with scripted_server(solver) as server:
        await run_example(mcts_agent, server.base_url, "--puzzle", "3 3 8 8", "--width", "2")
    proposals = [last_message(b) for b in server.requests if schema_name(b) == "move"]
    values = [last_message(b) for b in server.requests if schema_name(b) == "value"]
    # From 3 3 8 8 the only move that keeps 24 reachable is 8 / 3.
    assert '{"first":"8","operator":"/","second":"3"}' in proposals[0]
    assert all("Solver: sure" in prompt for prompt in values)  # the solver model keeps it so
    async with scripted_server(solver) as server:
        await run_example(mcts_agent, server.base_url, "--puzzle", "3 3 8 8", "--no-solver")
    assert not any("Solver" in last_message(body) for body in server.requests)
