"""Reading the program API's parameters: a program's name, a page's bounds.

Plain Python: the router's routes (``routes``) and the Ray Serve ingress
(``autellix_vllm.ray_serve.ingress``) read them alike, with the same 400s.
"""

from __future__ import annotations

from typing import TypeVar

from autellix_vllm.router.errors import ApiError

MAX_NAME_LENGTH = 256
# Programs per page of GET /autellix/v1/programs: by default, and at most.
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def program_name(name: object) -> str | None:
    """A program's name: printable (it is shown in terminals) and not too long."""
    if name is None or name == "":
        return None
    if not isinstance(name, str) or len(name) > MAX_NAME_LENGTH or not name.isprintable():
        raise ApiError(
            400,
            f"name must be a string of at most {MAX_NAME_LENGTH} printable characters",
            "invalid_name",
            "name",
        )
    return name


# A parameter's default: with an int default the value is an int.
Default = TypeVar("Default", int, None)


def query_int(
    text: str | None, name: str, default: Default, low: int, high: int | None
) -> int | Default:
    """The query parameter ``name`` (``text``, None if absent) as an integer from
    ``low`` to ``high`` (None: no upper bound); a 400 ``invalid_parameter`` if not."""
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        bounds = f"{low} to {high}" if high is not None else f"at least {low}"
        raise ApiError(400, f"{name} must be an integer, {bounds}", "invalid_parameter", name)
    return value
