"""The Game of 24: combine four numbers with + - * / into 24, each number once.

The MCTS agent plays it one move at a time (:class:`State`, :meth:`State.apply`)
and :func:`is_solution` checks a finished expression exactly: it must use the
puzzle's numbers, each exactly once, and evaluate to 24 in exact fractions
(``8 / (3 - 8 / 3)`` is 24; in floats it is 23.999999999999996).
:func:`reachable` is the agent's solver tool: whether any moves still lead to
24 (exhaustive; four numbers take about a millisecond).
"""

from __future__ import annotations

import ast
import functools
import itertools
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from calculator import CalculatorError, evaluate

TARGET = 24
OPERATORS = ("+", "-", "*", "/")

# Puzzles with at least one solution (tests/examples checks each by brute force).
PUZZLES: list[tuple[int, ...]] = [
    (4, 7, 8, 8),
    (1, 5, 5, 5),
    (3, 3, 8, 8),
    (2, 3, 5, 12),
    (1, 4, 5, 6),
    (2, 4, 10, 10),
    (1, 2, 7, 7),
    (3, 4, 6, 6),
]


def is_solution(expression: str, numbers: tuple[int, ...] | list[int]) -> bool:
    """True when ``expression`` uses exactly ``numbers`` (each once, in any order)
    with only + - * / and parentheses, and equals 24 exactly."""
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    literals: list[int] = []
    for node in ast.walk(tree.body):
        if isinstance(node, ast.Constant):
            if type(node.value) is not int:
                return False
            literals.append(node.value)
        elif isinstance(node, ast.BinOp):
            if not isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
                return False
        elif not isinstance(node, ast.operator):
            return False  # names, calls, unary minus, anything else
    if Counter(literals) != Counter(numbers):
        return False
    try:
        return evaluate(expression) == TARGET
    except CalculatorError:  # division by zero
        return False


def combine(left: Fraction, operator: str, right: Fraction) -> Fraction | None:
    """``left operator right``, or None for a division by zero."""
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    if operator == "*":
        return left * right
    if operator == "/":
        return None if right == 0 else left / right
    raise ValueError(f"unknown operator {operator!r}")


def reachable(values: tuple[Fraction, ...] | list[Fraction]) -> bool:
    """Whether some order of moves turns ``values`` into exactly 24."""
    return _reachable(tuple(sorted(values)))


@functools.lru_cache(maxsize=8192)
def _reachable(values: tuple[Fraction, ...]) -> bool:
    if len(values) == 1:
        return values[0] == TARGET
    for i, j in itertools.permutations(range(len(values)), 2):
        rest = [values[k] for k in range(len(values)) if k not in (i, j)]
        for operator in OPERATORS:
            result = combine(values[i], operator, values[j])
            if result is not None and _reachable(tuple(sorted([*rest, result]))):
                return True
    return False


def show(value: Fraction) -> str:
    """``8`` or ``8/3``: how numbers are shown to the model and in schemas."""
    return str(value)


@dataclass(frozen=True)
class State:
    """Numbers still to combine, each with the expression that produced it."""

    values: tuple[Fraction, ...]
    expressions: tuple[str, ...]

    @classmethod
    def start(cls, numbers: tuple[int, ...] | list[int]) -> State:
        return cls(tuple(Fraction(n) for n in numbers), tuple(str(n) for n in numbers))

    @property
    def finished(self) -> bool:
        return len(self.values) == 1

    @property
    def solved(self) -> bool:
        return self.finished and self.values[0] == TARGET

    def apply(self, first: int, operator: str, second: int) -> State | None:
        """Replace the numbers at positions ``first`` and ``second`` by their
        combination; None if the move is not legal."""
        positions = range(len(self.values))
        if first == second or first not in positions or second not in positions:
            return None
        result = combine(self.values[first], operator, self.values[second])
        if result is None:
            return None
        rest = [i for i in range(len(self.values)) if i not in (first, second)]
        expression = f"({self.expressions[first]} {operator} {self.expressions[second]})"
        return State(
            tuple(self.values[i] for i in rest) + (result,),
            tuple(self.expressions[i] for i in rest) + (expression,),
        )

    def moves_to_target(self) -> list[tuple[int, str, int]]:
        """The moves (positions and operator, as :meth:`apply` takes them) after
        which 24 is still :func:`reachable`: the solver's advice."""
        positions = range(len(self.values))
        return [
            (first, operator, second)
            for first, second in itertools.permutations(positions, 2)
            for operator in OPERATORS
            if (child := self.apply(first, operator, second)) is not None
            and reachable(child.values)
        ]

    def key(self) -> tuple[Fraction, ...]:
        """States with the same numbers left are the same position."""
        return tuple(sorted(self.values))

    def describe(self) -> str:
        return " ".join(show(value) for value in self.values)

    def final_expression(self) -> str:
        """The finished expression without its outer parentheses."""
        expression = self.expressions[0]
        return expression[1:-1] if expression.startswith("(") and self.finished else expression
