"""A calculator for agents: arithmetic parsed with ``ast``, never ``eval``.

    >>> evaluate("(1702 - 1614) * 2")
    Fraction(176, 1)
    >>> format_number(evaluate("21400 / 48200 * 100"))
    '44.39834025'

Only numbers, ``+ - * / // % **``, parentheses and the functions in
:data:`FUNCTIONS` are accepted; names, attributes, calls of anything else,
strings, lambdas and comprehensions are refused before anything runs. Numbers
are exact fractions (``0.1`` is 1/10), so ``1/3*3`` is 1; only ``sqrt`` of a
non-square and non-integer powers fall back to floats.

The model writes the expressions, so every size is bounded: the text
(:data:`MAX_EXPRESSION_CHARS`), the syntax tree (:data:`MAX_NODES`), exponents
(:data:`MAX_EXPONENT`) and every intermediate result (:data:`MAX_RESULT_BITS`).
``9**9**9`` is refused in microseconds instead of running for hours. Every
refusal is a :class:`CalculatorError` with a message meant for the model.
"""

from __future__ import annotations

import ast
import decimal
import math
import operator
from collections.abc import Callable
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200
MAX_NODES = 100
MAX_EXPONENT = 1000
MAX_RESULT_BITS = 4096  # numerator and denominator; about 1233 decimal digits

Number = Fraction | float


class CalculatorError(ValueError):
    """The expression is not allowed, not valid, or its result is out of bounds."""


def _sqrt(value: Number) -> Number:
    if value < 0:
        raise CalculatorError("sqrt of a negative number")
    if isinstance(value, Fraction):
        numerator, denominator = math.isqrt(value.numerator), math.isqrt(value.denominator)
        if numerator**2 == value.numerator and denominator**2 == value.denominator:
            return Fraction(numerator, denominator)
    return math.sqrt(value)


def _round(value: Number, digits: Number = Fraction(0)) -> Number:
    if not _is_integer(digits) or abs(digits) > 100:
        raise CalculatorError("round() takes a whole number of digits between -100 and 100")
    return Fraction(round(Fraction(value), int(digits)))


FUNCTIONS: dict[str, Callable[..., Number]] = {
    "abs": abs,
    "min": min,
    "max": max,
    "round": _round,
    "sqrt": _sqrt,
}

_BINARY_OPERATORS: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY_OPERATORS: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression; raises :class:`CalculatorError`."""
    if not isinstance(expression, str):
        raise CalculatorError("the expression must be text")
    text = expression.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise CalculatorError(f"not an arithmetic expression ({type(error).__name__})") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"expression has more than {MAX_NODES} parts")
    return _value(tree.body)


def calculate(expression: str) -> str:
    """The calculator as a tool: the result as text, or ``error: ...``."""
    try:
        return format_number(evaluate(expression))
    except CalculatorError as error:
        return f"error: {error}"


def format_number(value: Number) -> str:
    """Whole numbers exactly; anything else with up to 10 significant digits."""
    if isinstance(value, float):
        return f"{value:.10g}"
    if value.denominator == 1:
        return str(value.numerator)
    # Decimal, not float: a fraction may be far beyond float's range (10**400 / 3).
    with decimal.localcontext() as context:
        context.prec = 12
        return f"{decimal.Decimal(value.numerator) / value.denominator:.10g}"


def _value(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        return _literal(node.value)
    if isinstance(node, ast.BinOp):
        return _binary(node)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPERATORS:
        return _UNARY_OPERATORS[type(node.op)](_value(node.operand))
    if isinstance(node, ast.Call):
        return _call(node)
    if isinstance(node, ast.Name):
        raise CalculatorError(f"unknown name {node.id!r}; only numbers and {_function_list()}")
    raise CalculatorError(f"{type(node).__name__} is not allowed; only arithmetic on numbers")


def _literal(value: object) -> Number:
    # bool is an int subclass: True/False are names, not numbers, to a calculator.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalculatorError(f"{value!r} is not a number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError("number out of range")
        return _checked(Fraction(repr(value)))  # 0.1 means 1/10, not the binary float
    return _checked(Fraction(value))


def _binary(node: ast.BinOp) -> Number:
    left, right = _value(node.left), _value(node.right)
    if isinstance(node.op, ast.Pow):
        return _power(left, right)
    operation = _BINARY_OPERATORS.get(type(node.op))
    if operation is None:
        raise CalculatorError(f"operator {type(node.op).__name__} is not allowed")
    if type(node.op) in (ast.Div, ast.FloorDiv, ast.Mod) and right == 0:
        raise CalculatorError("division by zero")
    try:
        return _checked(operation(left, right))
    except (OverflowError, ZeroDivisionError, ValueError) as error:
        raise CalculatorError(f"arithmetic error ({error})") from None


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent larger than {MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero")
    if isinstance(base, Fraction) and _is_integer(exponent):
        # Size of the result before computing it: bits(base) * |exponent|.
        bits = max(base.numerator.bit_length(), base.denominator.bit_length())
        if bits * abs(int(exponent)) > MAX_RESULT_BITS:
            raise CalculatorError(f"result larger than {MAX_RESULT_BITS} bits")
        return base ** int(exponent)
    if base < 0:
        raise CalculatorError("a negative number to a fractional power")
    try:
        return _checked(float(base) ** float(exponent))
    except OverflowError:
        raise CalculatorError("result out of range") from None


def _call(node: ast.Call) -> Number:
    if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
        raise CalculatorError(f"unknown function; allowed: {_function_list()}")
    if node.keywords:
        raise CalculatorError("keyword arguments are not allowed")
    arguments = [_value(argument) for argument in node.args]
    try:
        return _checked(FUNCTIONS[node.func.id](*arguments))
    except TypeError:
        raise CalculatorError(f"wrong number of arguments to {node.func.id}()") from None
    except (OverflowError, ValueError) as error:
        raise CalculatorError(f"{node.func.id}(): {error}") from None


def _checked(value: Number) -> Number:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError("result out of range")
        return value
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_RESULT_BITS:
        raise CalculatorError(f"result larger than {MAX_RESULT_BITS} bits")
    return value


def _is_integer(value: Number) -> bool:
    return isinstance(value, Fraction) and value.denominator == 1


def _function_list() -> str:
    return ", ".join(f"{name}()" for name in FUNCTIONS)
