"""The Game of 24: the exact checker, moves, and the MCTS agent's tree logic."""

from __future__ import annotations

from fractions import Fraction

import pytest
from game24 import PUZZLES, State, is_solution, reachable, show
from mcts_agent import Node, backpropagate, move_schema, repair_move, select


@pytest.mark.parametrize("puzzle", PUZZLES)
def test_every_shipped_puzzle_has_a_solution(puzzle):
    assert reachable([Fraction(n) for n in puzzle])


def test_the_solver_knows_reachable_positions_and_moves():
    assert not reachable([Fraction(1)] * 4)  # 1 1 1 1 makes at most 4
    assert not reachable([Fraction(n) for n in (1, 1, 1, 2)])
    assert reachable([Fraction(8), Fraction(3)]) and not reachable([Fraction(8), Fraction(4)])
    state = State.start((3, 3, 8, 8))
    moves = state.moves_to_target()
    assert moves and all(reachable(state.apply(*move).values) for move in moves)
    # The only way on from 3 3 8 8 is 8 / 3 (toward 8 / (3 - 8 / 3)).
    assert {(show(state.values[i]), op, show(state.values[j])) for i, op, j in moves} == {
        ("8", "/", "3")
    }


@pytest.mark.parametrize(
    ("expression", "numbers"),
    [
        ("8 / (3 - 8 / 3)", (3, 3, 8, 8)),  # 23.999999999999996 in floats
        ("(7 - 8 / 8) * 4", (4, 7, 8, 8)),
        ("5 * (5 - 1 / 5)", (1, 5, 5, 5)),
        ("6 / (5 / 4 - 1)", (1, 4, 5, 6)),
        ("24", (24,)),
    ],
)
def test_checker_accepts_exact_solutions(expression, numbers):
    assert is_solution(expression, numbers)
    assert is_solution(expression, tuple(reversed(numbers)))  # order does not matter


@pytest.mark.parametrize(
    ("expression", "numbers", "why"),
    [
        ("4 * 6", (4, 7, 8, 8), "numbers missing"),
        ("(7 - 8 / 8) * 4 + 0", (4, 7, 8, 8), "an extra number"),
        ("(7 - 8 / 8) * 4 * 1", (4, 7, 8, 8), "an extra number"),
        ("8 + 8 + 7 + 4", (4, 7, 8, 8), "27, not 24"),
        ("3 * 8", (3, 8, 8), "8 used once, given twice"),
        ("-(-24)", (24,), "unary minus"),
        ("2 ** 3 * 3", (2, 3, 3), "power"),
        ("4.0 * 6", (4, 6), "float literal"),
        ("(8 // 1) * 3", (8, 1, 3), "floor division"),
        ("8 / (8 - 8) * 3", (8, 8, 8, 3), "division by zero"),
        ("__import__('os')", (4, 7, 8, 8), "code"),
        ("x * 24", (24,), "name"),
        ("(1 + 2", (1, 2), "syntax"),
        ("", (), "empty"),
    ],
)
def test_checker_rejects_everything_else(expression, numbers, why):
    assert not is_solution(expression, numbers), why


def test_moves_combine_two_numbers_and_keep_the_expression():
    state = State.start((3, 3, 8, 8))
    step = state.apply(2, "/", 0)  # 8 / 3
    assert step is not None and sorted(step.values) == [Fraction(8, 3), 3, 8]
    step = step.apply(0, "-", 2)  # 3 - 8/3 = 1/3
    assert step is not None
    step = step.apply(0, "/", 1)  # 8 / (1/3) = 24
    assert step is not None and step.solved
    assert step.final_expression() == "8 / (3 - (8 / 3))"
    assert is_solution(step.final_expression(), (3, 3, 8, 8))


def test_illegal_moves_are_refused():
    state = State.start((4, 0))
    assert state.apply(0, "/", 1) is None  # division by zero
    assert state.apply(0, "+", 0) is None  # the same number twice
    assert state.apply(0, "+", 5) is None  # no such position


def test_repair_keeps_legal_moves_and_fixes_clear_intent():
    state = State.start((4, 7, 8, 8))
    assert repair_move(state, {"first": "4", "operator": "*", "second": "7"}) == (0, "*", 1)
    # 8 twice: the two copies.
    assert repair_move(state, {"first": "8", "operator": "-", "second": "8"}) == (2, "-", 3)
    # 4 twice (one copy): the next number instead.
    assert repair_move(state, {"first": "4", "operator": "+", "second": "4"}) == (0, "+", 1)
    zero = State.start((0, 5))
    assert repair_move(zero, {"first": "5", "operator": "/", "second": "0"}) == (0, "/", 1)
    fraction = State(values=(Fraction(8, 3), Fraction(3)), expressions=("(8 / 3)", "3"))
    assert repair_move(fraction, {"first": "8/3", "operator": "*", "second": "3"}) == (0, "*", 1)


@pytest.mark.parametrize(
    "proposal",
    [
        None,
        {},
        {"first": "4", "operator": "^", "second": "7"},
        {"first": "5", "operator": "+", "second": "7"},  # 5 is not on the table
        {"first": "four", "operator": "+", "second": "7"},
        {"first": "1/0", "operator": "+", "second": "7"},
        {"first": ["4"], "operator": "+", "second": "7"},
    ],
)
def test_junk_proposals_are_discarded(proposal):
    assert repair_move(State.start((4, 7, 8, 8)), proposal) is None


def test_zero_divided_by_zero_is_discarded():
    assert repair_move(State.start((0, 0)), {"first": "0", "operator": "/", "second": "0"}) is None


def test_move_schema_offers_the_numbers_left():
    schema = move_schema(State(values=(Fraction(8, 3), Fraction(8), Fraction(8)),
                               expressions=("(8 / 3)", "8", "8")))  # fmt: skip
    assert schema["properties"]["first"]["enum"] == ["8/3", "8"]
    assert schema["required"] == ["first", "operator", "second"]
    assert schema["additionalProperties"] is False


def test_uct_selection_expands_the_root_first_then_the_best_child():
    root = Node(State.start((4, 7, 8, 8)))
    assert select(root) is root
    root.expanded = True
    good = Node(State.start((4, 7, 16)), root)
    bad = Node(State.start((4, 7, 0)), root)
    root.children = [bad, good]
    backpropagate(good, 1.0)
    backpropagate(bad, 0.0)
    assert root.visits == 2 and root.value_sum == 1.0
    assert select(root) is good


def test_selection_skips_exhausted_branches_and_ends_when_all_are():
    root = Node(State.start((4, 7)))
    root.expanded = True
    finished = Node(State.start((28,)), root, exhausted=True)
    dead_end = Node(State.start((4, 3)), root, expanded=True)  # expanded, no children
    root.children = [finished, dead_end]
    for child in root.children:
        backpropagate(child, 0.0)
    assert select(root) is None
    assert dead_end.exhausted and root.exhausted
