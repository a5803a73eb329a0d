"""A LATS-style tree search on the Game of 24, as multi-threaded autellix programs.

    python examples/mcts_agent.py                               # autellix serve on :8000
    python examples/mcts_agent.py --programs 2 --width 3 --iterations 6
    python examples/mcts_agent.py --puzzle "3 3 8 8" --base-url https://api.openai.com/v1 \\
        --model gpt-4o-mini

A node of the tree is a position: the numbers still to combine. Each
iteration

1. selects a leaf: from the root, the child with the best UCT score
   (mean value + c * sqrt(ln(parent visits) / visits)) until a node that was
   never expanded;
2. expands it with ``--width`` children at once, each in its own thread
   (``autellix.gather``): the model proposes a move (two of the numbers and an
   operator, structured output), and a second call in the same thread values
   the new position (sure / likely / impossible). A finished position (one
   number left) is valued by the local checker instead: 1 if it is 24, else 0;
3. backpropagates each child's value to the root;
4. stops early when a child is a solution that the checker verified exactly
   (fractions, every number used once).

The model has a solver tool (``game24.reachable``, exhaustive and exact): the
proposal prompt lists up to four moves after which 24 is still reachable, each
sibling's list starting at another move, and the value prompt says whether 24
is still reachable. A 135M model cannot search the game on its own (it solved
none of the puzzles); it can copy a listed move and the solver's verdict, and
the search then solves most puzzles in three expansions. ``--no-solver`` leaves
the tool out, for a model that can play.

A proposal that is not a legal move is repaired where the intent is clear (the
same number picked twice: the other copy or the next number; a division by
zero: the operands swapped) and discarded otherwise, so the tree grows even
when the model writes junk. Since every expansion forks threads, the server
schedules these programs with ATLAS (by critical path).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from dataclasses import dataclass, field
from fractions import Fraction

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
    text_field,
)
from autellix import program
from game24 import OPERATORS, PUZZLES, TARGET, State, is_solution, reachable, show

log = logging.getLogger("examples.mcts")

VERDICTS = {"sure": 1.0, "likely": 0.5, "impossible": 0.0}
UNKNOWN_VALUE = 0.25  # a value reply that could not be read
EXPLORATION = 1.0  # c in UCT
PROPOSE_MAX_TOKENS = 96
VALUE_MAX_TOKENS = 96
VALUE_REASONING_CHARS = 120  # as in Tree of Thoughts' value prompt: a few steps, then a verdict
PROPOSE_TEMPERATURE = 1.0  # siblings should differ
VALUE_TEMPERATURE = 0.0
RULES = f"Game of {TARGET}: combine all the numbers with + - * / to make exactly {TARGET}."
SOLVER_HINTS = 4  # moves the solver lists in a proposal prompt


@dataclass(eq=False)
class Node:
    state: State
    parent: Node | None = None
    move: str = ""  # how the parent's numbers became this node's, e.g. "8 / 3"
    children: list[Node] = field(default_factory=list)
    visits: int = 0
    value_sum: float = 0.0
    expanded: bool = False
    exhausted: bool = False  # nothing left to expand below this node

    def uct(self) -> float:
        parent_visits = self.parent.visits if self.parent is not None else self.visits
        mean = self.value_sum / self.visits
        return mean + EXPLORATION * math.sqrt(math.log(max(parent_visits, 1)) / self.visits)

    def size(self) -> int:
        return 1 + sum(child.size() for child in self.children)


@dataclass
class Branch:
    """What one expansion thread found: a new position (None if discarded) and its value."""

    state: State | None
    move: str
    value: float
    calls: int
    seconds: float
    solution: str | None = None  # the checked expression, if the position is solved


@dataclass
class SearchSettings:
    width: int
    iterations: int
    solver: bool = True  # the prompts carry the solver's advice


def select(root: Node) -> Node | None:
    """The next node to expand, by UCT from the root; None when the tree is exhausted."""
    node = root
    while not root.exhausted:
        if not node.expanded:
            return node
        live = [child for child in node.children if not child.exhausted]
        if not live:
            node.exhausted = True  # and look again from the top
            node = root
            continue
        node = max(live, key=Node.uct)
    return None


def backpropagate(node: Node | None, value: float) -> None:
    while node is not None:
        node.visits += 1
        node.value_sum += value
        node = node.parent


def move_schema(state: State) -> dict[str, object]:
    """Two of the numbers left and an operator; the numbers as an enum of their text."""
    numbers = sorted(set(map(show, state.values)), key=lambda text: Fraction(text))
    return object_schema(
        first=choice_field(numbers), operator=choice_field(OPERATORS), second=choice_field(numbers)
    )


VALUE_SCHEMA = object_schema(
    reasoning=text_field(VALUE_REASONING_CHARS), verdict=choice_field(VERDICTS)
)


def repair_move(state: State, proposal: dict[str, object] | None) -> tuple[int, str, int] | None:
    """Positions and operator of a proposed move, repaired if possible; None to discard."""
    if proposal is None or proposal.get("operator") not in OPERATORS:
        return None
    operator = str(proposal["operator"])
    first = _position(state, proposal.get("first"), exclude=None)
    if first is None:
        return None
    second = _position(state, proposal.get("second"), exclude=first)
    if second is None:  # the same single number twice: take the next number instead
        second = (first + 1) % len(state.values)
    if operator == "/" and state.values[second] == 0:
        if state.values[first] == 0:
            return None
        first, second = second, first
    return first, operator, second


def _position(state: State, text: object, exclude: int | None) -> int | None:
    """Where the number written as ``text`` is among the numbers left (not at ``exclude``)."""
    try:
        wanted = Fraction(str(text).strip())
    except (ValueError, ZeroDivisionError):
        return None
    for position, value in enumerate(state.values):
        if value == wanted and position != exclude:
            return position
    return None


def describe(state: State) -> str:
    """The numbers left, with how each was made: ``1 (= 8 / 8), 4, 7``."""
    return ", ".join(
        show(value) if expression == show(value) else f"{show(value)} (= {expression})"
        for value, expression in zip(state.values, state.expressions, strict=True)
    )


def solver_hint(state: State, sibling: int) -> str:
    """The solver's advice for a proposal: up to :data:`SOLVER_HINTS` moves that keep
    24 reachable, as the JSON the model replies with, the ``sibling``-th first (so
    that siblings copy different moves)."""
    moves = state.moves_to_target()
    if not moves:
        return f" Solver: {TARGET} cannot be reached from here."
    start = sibling % len(moves)
    listed = (moves[start:] + moves[:start])[:SOLVER_HINTS]
    replies = [
        json.dumps({"first": show(state.values[first]), "operator": operator,
                    "second": show(state.values[second])}, separators=(",", ":"))
        for first, operator, second in listed
    ]  # fmt: skip
    return f" Solver: moves that keep {TARGET} reachable: {' '.join(replies)}. Pick one."


def solver_verdict(state: State) -> str:
    if reachable(state.values):
        return f" Solver: sure ({TARGET} is still reachable)."
    return f" Solver: impossible ({TARGET} cannot be reached)."


async def propose(
    state: State, sibling: int, endpoint: Endpoint, report: ProgramReport, settings: SearchSettings
) -> dict[str, object] | None:
    """The model's move from ``state``; ``sibling`` (0, 1, ...) tells siblings apart,
    so that parallel proposals from the same position differ."""
    idea = f"idea {sibling + 1} of {settings.width}"
    hint = solver_hint(state, sibling) if settings.solver else ""
    messages = [
        {"role": "system", "content": RULES},
        {
            "role": "user",
            "content": f"Numbers left: {describe(state)}.{hint} Pick two numbers and an"
            f" operator ({idea}).",
        },
    ]
    reply = await ask_json(
        endpoint, report, messages, move_schema(state),
        schema_name="move", max_tokens=PROPOSE_MAX_TOKENS, temperature=PROPOSE_TEMPERATURE,
    )  # fmt: skip
    return reply.data


async def value(
    state: State, endpoint: Endpoint, report: ProgramReport, settings: SearchSettings
) -> float:
    if settings.solver:
        ask = f"{solver_verdict(state)} Answer sure, likely or impossible, as the solver says."
    else:
        ask = " Try a step or two, then answer sure, likely or impossible."
    messages = [
        {"role": "system", "content": RULES},
        {
            "role": "user",
            "content": f"Numbers left: {state.describe()}. Can they still make {TARGET}?{ask}",
        },
    ]
    reply = await ask_json(
        endpoint, report, messages, VALUE_SCHEMA,
        schema_name="value", max_tokens=VALUE_MAX_TOKENS, temperature=VALUE_TEMPERATURE,
    )  # fmt: skip
    verdict = str((reply.data or {}).get("verdict", "")).strip().lower()
    return VERDICTS.get(verdict, UNKNOWN_VALUE)


async def grow_branch(
    state: State,
    puzzle: tuple[int, ...],
    sibling: int,
    endpoint: Endpoint,
    report: ProgramReport,
    settings: SearchSettings,
) -> Branch:
    """One child of ``state``: propose a move, then value the new position. Runs as
    one thread, so its calls are sequential (sibling threads overlap with it)."""
    start = time.perf_counter()
    proposal = await propose(state, sibling, endpoint, report, settings)
    with report.timing_tool():
        move = repair_move(state, proposal)
        child = state.apply(*move) if move is not None else None
    if move is None or child is None:
        return Branch(None, "", 0.0, calls=1, seconds=time.perf_counter() - start)
    first, operator, second = move
    text = f"{show(state.values[first])} {operator} {show(state.values[second])}"
    if not child.finished:
        score = await value(child, endpoint, report, settings)
        return Branch(child, text, score, calls=2, seconds=time.perf_counter() - start)
    with report.timing_tool():  # a finished position needs no model: check it exactly
        expression = child.final_expression()
        solution = expression if is_solution(expression, puzzle) else None
    score = 1.0 if solution else 0.0
    return Branch(child, text, score, calls=1, seconds=time.perf_counter() - start,
                  solution=solution)  # fmt: skip


@program(name="mcts")
async def mcts_agent(
    numbers: tuple[int, ...], endpoint: Endpoint, report: ProgramReport, settings: SearchSettings
) -> str | None:
    """Search for an expression of ``numbers`` that makes 24; the verified expression or None."""
    report.program_id = autellix.current_program()
    root = Node(State.start(numbers))
    seen = {root.state.key()}
    threads = dropped = path_calls = 0
    path_seconds = 0.0
    solution: str | None = None
    for iteration in range(settings.iterations):
        leaf = select(root)
        if leaf is None:
            break
        branches = await autellix.gather(
            *(
                grow_branch(leaf.state, numbers, sibling, endpoint, report, settings)
                for sibling in range(settings.width)
            )
        )
        threads += len(branches)
        leaf.expanded = True
        # The expansion took as long as its slowest thread: the program's critical path.
        path_calls += max(branch.calls for branch in branches)
        path_seconds += max(branch.seconds for branch in branches)
        for branch in branches:
            if branch.state is None or branch.state.key() in seen:
                dropped += 1
                continue
            seen.add(branch.state.key())
            child = Node(branch.state, leaf, branch.move, exhausted=branch.state.finished)
            leaf.children.append(child)
            backpropagate(child, branch.value)
            solution = solution or branch.solution
        moves = ", ".join(child.move for child in leaf.children) or "none kept"
        log.info("%s iteration %d: [%s] -> %s", report.label, iteration + 1,
                 leaf.state.describe(), moves)  # fmt: skip
        if solution is not None:
            break
    puzzle = " ".join(map(str, numbers))
    report.threads = threads
    report.answer = f"{puzzle}: {solution} = {TARGET}" if solution else f"{puzzle}: not solved"
    report.columns = {
        "SOLVED": "yes" if solution else "no",
        "TREE": str(root.size()),
        "DROPPED": str(dropped),
        "CRIT PATH": f"{path_calls} calls/{path_seconds:.1f}s",
    }
    report.server = await endpoint.program_row()  # before the program ends and leaves the table
    return solution


def parse_puzzle(text: str) -> tuple[int, ...]:
    try:
        numbers = tuple(int(part) for part in text.replace(",", " ").split())
    except ValueError:
        raise ExampleError(f"--puzzle takes whole numbers, got {text!r}") from None
    if not 2 <= len(numbers) <= 6 or not all(0 <= n <= 1000 for n in numbers):
        raise ExampleError("--puzzle takes 2 to 6 numbers between 0 and 1000")
    return numbers


async def main(args: argparse.Namespace, endpoint: Endpoint) -> list[ProgramReport]:
    settings = SearchSettings(width=args.width, iterations=args.iterations, solver=args.solver)
    log.info("mcts: %d programs on %s at %s", args.programs, endpoint.model, args.base_url)

    async def run_one(index: int, report: ProgramReport) -> None:
        numbers = parse_puzzle(args.puzzle) if args.puzzle else PUZZLES[index % len(PUZZLES)]
        await mcts_agent(numbers, endpoint, report, settings)
        log.info("mcts: %s finished: %s", report.label, report.answer)

    return await run_programs("mcts", args.programs, run_one, args.start_every)


def check_args(args: argparse.Namespace) -> None:
    if args.puzzle is not None:
        parse_puzzle(args.puzzle)


def parser() -> argparse.ArgumentParser:
    parser = example_parser(__doc__ or "")
    parser.add_argument("--programs", type=positive_int, default=1, help="searches at once")
    parser.add_argument("--width", type=positive_int, default=3, help="children per expansion")
    parser.add_argument("--iterations", type=positive_int, default=6, help="expansions at most")
    parser.add_argument("--puzzle", help='numbers to combine, e.g. "4 7 8 8" (default: a list)')
    parser.add_argument(
        "--no-solver",
        dest="solver",
        action="store_false",
        help="leave the solver's advice out of the prompts: the model plays on its own",
    )
    return parser


if __name__ == "__main__":
    raise SystemExit(run_example(parser(), main, check_args))
