"""Named choices (policies, balancers, workloads, presets): one lookup, one error.

Every registry of this package is a plain ``dict`` from name to what the name
stands for; :func:`lookup` is how code turns a name from a user into it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

T = TypeVar("T")


def lookup(registry: Mapping[str, T], name: str, what: str) -> T:
    """``registry[name]``, or a ValueError that names the choices."""
    try:
        return registry[name]
    except KeyError:
        raise ValueError(unknown(what, name, registry)) from None


def unknown(what: str, name: str, choices: Iterable[str]) -> str:
    """The message for a name that is not one of ``choices``."""
    return f"unknown {what} {name!r} (choose from {', '.join(choices)})"
