"""The ``autellix`` console script.

Every module of this package is one subcommand of the same name (``ps.py`` is
``autellix ps``, ``router_overhead.py`` would be ``autellix router-overhead``):
a new command is a new module here. A command module exposes
``add_parser(subparsers, name)``; the parser it adds sets ``func`` to a callable
taking the parsed arguments and returning the exit code. Bad input ends with a
one-line message and exit code 2. Output cut short by its reader (``autellix ps
| head``) ends the command quietly, with exit code 0.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import sys
import warnings
from collections.abc import Mapping
from typing import Any, NoReturn

from autellix_vllm.cli._arguments import HelpFormatter
from autellix_vllm.cli._extras import missing_extra


def _discover_commands() -> dict[str, str]:
    """Subcommand name -> module, one per module of this package (imported lazily,
    so ``autellix ps`` does not pay for importing the simulator or vLLM)."""
    return {
        info.name.replace("_", "-"): f"{__name__}.{info.name}"
        for info in pkgutil.iter_modules(__path__)
        if not info.name.startswith("_")
    }


COMMANDS: dict[str, str] = _discover_commands()


class UsageError(Exception):
    """A problem with the user's input: printed as one line, exit code 2."""


def print_result(
    result: dict[str, Any], as_json: bool, units: Mapping[str, str] | None = None
) -> None:
    """Print a command's result: with ``--json`` one JSON object on one line (for
    scripts), else one ``key value`` row per entry, a nested dict's rows indented
    under its key, floats to six significant digits and a value's unit after it
    where ``units`` names one (by key)."""
    if as_json:
        print(json.dumps(result))
    else:
        _print_rows(result, indent="", units=units or {})


def _print_rows(result: dict[str, Any], indent: str, units: Mapping[str, str]) -> None:
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{indent}{key}")
            _print_rows(value, indent + "  ", units)
        else:
            shown = f"{value:.6g}" if isinstance(value, float) else value
            print(f"{indent}{key!s:{30 - len(indent)}} {shown} {units.get(key, '')}".rstrip())


class _Parser(argparse.ArgumentParser):
    """Bad arguments end with one line naming the problem, not a usage dump; help
    shows each option's default (:class:`HelpFormatter`). Every subcommand's
    parser is one of these."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(commands: dict[str, str] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="autellix",
        description="Serve LLM agents as programs: a program-aware scheduler for vLLM.",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    for name, module in (commands or COMMANDS).items():
        try:
            importlib.import_module(module).add_parser(sub, name)
        except ModuleNotFoundError as exc:
            install = missing_extra(exc)
            if commands is not None or install is None:
                raise  # the command asked for: main says what to install
            sub.add_parser(name, help=f"(not installed: {install})")
    return parser


def _command_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``args`` ran, e.g. ``autellix simulate run``'s."""
    while True:
        choices = next(
            (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None
        )
        if choices is None:
            return parser
        parser = choices.choices[getattr(args, choices.dest)]


def _one_line_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    line: str | None = None,
) -> str:
    """A warning as one line, for a user at a terminal (no source line)."""
    return f"autellix: {category.__name__}: {message}\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    warnings.formatwarning = _one_line_warning
    # Only import the module of the command asked for; `--help` lists them all.
    wanted = {argv[0]: COMMANDS[argv[0]]} if argv and argv[0] in COMMANDS else None
    try:
        parser = build_parser(wanted)
    except ModuleNotFoundError as exc:  # the command's module needs an extra
        return _missing_extra(exc, f"autellix {argv[0]}" if wanted else "autellix")
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away shows here, not at exit
        return code
    except BrokenPipeError:
        # The reader took what it wanted (`| head`): the rest is not wanted, and
        # stdout goes to /dev/null so that the flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UsageError as exc:
        print(f"{_command_parser(parser, args).prog}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        return _missing_extra(exc, _command_parser(parser, args).prog)
    except KeyboardInterrupt:
        return 130


def _missing_extra(error: ModuleNotFoundError, prog: str) -> int:
    """Say which extra to install for ``error``'s module (exit code 2); a module no
    extra brings is a bug, raised on."""
    install = missing_extra(error)
    if install is None:
        raise error
    print(f"{prog}: error: {install}", file=sys.stderr)
    return 2
