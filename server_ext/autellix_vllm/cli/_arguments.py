"""Argument types that more than one command uses."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def checked(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type from ``parse``: the message of its ValueError becomes the
    one-line error (argparse alone would only say "invalid value")."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert
