"""Argument helpers that more than one command uses."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
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


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written, and each option's default after its help as
    ``(default: VALUE)``, the one form a default takes in every help text (the
    commands' and the examples').

    A default is added only where the help does not already say it in words
    (``(default: ...)``, for defaults that come from a variable or depend on the
    machine) and there is one to show (not None). A switch (a flag that takes no
    value, such as ``--all`` or ``--no-program-end``) gets none: its help says
    what giving it does, and its stored default would only say the opposite."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        if (
            "(default" in help_text
            or not action.option_strings
            or action.nargs == 0
            or action.default is None
            or action.default is argparse.SUPPRESS
        ):
            return help_text
        return f"{help_text} (default: %(default)s)"


def reserved_flag(arguments: Sequence[str], reserved: Mapping[str, str]) -> str | None:
    """The first of ``arguments`` (extra vLLM flags, after ``--``) that a command
    sets from a flag of its own, with what to write instead; None if there is none."""
    for argument in arguments:
        name = argument.split("=", 1)[0]
        if name in reserved:
            return f"{name} after -- goes around autellix: {reserved[name]}"
    return None
