"""The server's program API: open a program, end it.

    POST   {root}/autellix/v1/programs          body {"name": ...}  ->  {"program_id": ...}
    DELETE {root}/autellix/v1/programs/{id}

`root` is the client's base URL without its `/v1` suffix. The calls go through
the openai client itself, so they use its connection pool, its auth header
(`Authorization: Bearer <api_key>`) and its retry policy.

A server that answers 404 to the open call is a plain OpenAI-compatible server:
it is remembered, warned about once per process (however many programs were
opening at the time), and the program runs with local ids. It is asked again
after `PLAIN_SERVER_RECHECK_SECONDS`: an autellix server may have replaced it
at the same address since.
Ending a program is best effort: one attempt, a short timeout, never an error.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import openai

from ._once import warn_once

log = logging.getLogger("autellix")

PROGRAMS_PATH = "/autellix/v1/programs"
OPEN_TIMEOUT_SECONDS = 10.0
END_TIMEOUT_SECONDS = 2.0
PLAIN_SERVER_RECHECK_SECONDS = 60.0

_plain_servers: dict[str, float] = {}
"""Program URLs that answered 404, and when (`time.monotonic()`)."""


def programs_url(client: openai.OpenAI | openai.AsyncOpenAI) -> str:
    """Where `client`'s server keeps its programs."""
    root = str(client.base_url).rstrip("/")
    root = root.removesuffix("/v1")
    return root + PROGRAMS_PATH


async def open_program(client: openai.AsyncOpenAI, name: str | None) -> str | None:
    """Open a program on `client`'s server; None when the server has no program API."""
    url = programs_url(client)
    if _known_plain(url):
        return None
    try:
        answer = await client.post(url, cast_to=object, **_open_arguments(name))
    except openai.NotFoundError:
        _remember_plain_server(url)
        return None
    return _program_id_from(answer)


def open_program_blocking(client: openai.OpenAI, name: str | None) -> str | None:
    """The blocking twin of `open_program`, for sync programs."""
    url = programs_url(client)
    if _known_plain(url):
        return None
    try:
        answer = client.post(url, cast_to=object, **_open_arguments(name))
    except openai.NotFoundError:
        _remember_plain_server(url)
        return None
    return _program_id_from(answer)


async def end_program(client: openai.AsyncOpenAI, program_id: str) -> None:
    """Tell `client`'s server that the program ended; logs instead of raising."""
    try:
        await client.delete(f"{programs_url(client)}/{program_id}", **_END_ARGUMENTS)
    except Exception as error:
        _log_end_failure(program_id, error)


def end_program_blocking(client: openai.OpenAI, program_id: str) -> None:
    """The blocking twin of `end_program`, for sync programs."""
    try:
        client.delete(f"{programs_url(client)}/{program_id}", **_END_ARGUMENTS)
    except Exception as error:
        _log_end_failure(program_id, error)


def _open_arguments(name: str | None) -> dict[str, Any]:
    return {
        "body": {"name": name} if name else {},
        "options": {"timeout": OPEN_TIMEOUT_SECONDS},
    }


_END_ARGUMENTS: dict[str, Any] = {
    "cast_to": object,
    "options": {"timeout": END_TIMEOUT_SECONDS, "max_retries": 0},
}


def _program_id_from(answer: object) -> str:
    if not isinstance(answer, dict) or not isinstance(answer.get("program_id"), str):
        raise ValueError(f"unexpected answer to POST {PROGRAMS_PATH}: {answer!r}")
    return answer["program_id"]


def _known_plain(url: str) -> bool:
    """Whether `url` answered 404 within the last `PLAIN_SERVER_RECHECK_SECONDS`."""
    since = _plain_servers.get(url)
    return since is not None and time.monotonic() - since < PLAIN_SERVER_RECHECK_SECONDS


def _remember_plain_server(url: str) -> None:
    _plain_servers[url] = time.monotonic()
    warn_once(
        f"plain-server {url}",
        "autellix: %s answered 404, so this is a plain OpenAI-compatible server; "
        "programs run with local ids (calls still carry them)",
        url,
    )


def _log_end_failure(program_id: str, error: Exception) -> None:
    log.warning("autellix: could not end program %s: %s", program_id, error)
