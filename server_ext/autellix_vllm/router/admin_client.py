"""The router's admin client: its process table, read over HTTP.

What ``autellix ps`` and ``autellix top`` show, and what the router benchmark
reads, from ``GET /autellix/v1/programs``: the pages read in turn; a program's
timeline (``GET /autellix/v1/programs/{id}/timeline``, ``autellix ps PROGRAM``);
and an answer that is not a router's (an engine's URL, a wrong key) turned into an
:class:`AdminClientError` that says what to do. Standard library only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from autellix_vllm.protocol.paths import PROGRAM_TIMELINE_PATH, PROGRAMS_PATH

DEFAULT_URL = "http://127.0.0.1:8000"
"""Where ``autellix serve`` listens by default."""
PAGE_SIZE = 1000  # the router's largest page
NOT_A_ROUTER = (
    "this looks like an engine (or another server), not a router: point --url at"
    " autellix serve's router (its ready line names the URL)"
)


# The error codes of a 404 about a program (router.programs), not about the route.
PROGRAM_REFUSALS = ("program_not_found", "program_ended")


class AdminClientError(Exception):
    """The router's table could not be read; the message says why and what to do."""


class RouterUnavailable(AdminClientError):
    """The router did not answer, or answered that it cannot serve now: worth
    asking again (``top`` does), unlike a wrong URL or key."""


def fetch_table(
    url: str, api_key: str | None, timeout_s: float = 5.0, max_programs: int | None = None
) -> dict[str, Any]:
    """The router's table (``GET /autellix/v1/programs``), its pages read in turn
    up to ``max_programs`` programs (None: all)."""
    root = router_root(url)
    table = _get_page(root, api_key, timeout_s, {"limit": PAGE_SIZE})
    programs = table["programs"] = list(table["programs"])
    while table.get("next_after") is not None and (
        max_programs is None or len(programs) < max_programs
    ):
        page = _get_page(root, api_key, timeout_s, {"limit": PAGE_SIZE,
                                                   "after": table["next_after"]})  # fmt: skip
        programs.extend(page["programs"])
        table["next_after"] = page.get("next_after")
    if max_programs is not None:
        del programs[max_programs:]
    return table


def fetch_ended(url: str, api_key: str | None, timeout_s: float = 5.0) -> dict[str, Any]:
    """The final rows of the caller's programs that ended last, newest first
    (``GET /autellix/v1/programs?ended=1``)."""
    return _get_page(router_root(url), api_key, timeout_s, {"limit": PAGE_SIZE, "ended": 1})


def fetch_timeline(
    url: str, api_key: str | None, program_id: str, timeout_s: float = 5.0
) -> dict[str, Any]:
    """The timeline of one of the caller's programs (``router.timeline``)."""
    root = router_root(url)
    path = PROGRAM_TIMELINE_PATH.format(program_id=urllib.parse.quote(program_id, safe=""))
    timeline = _get_json(root, path, api_key, timeout_s)
    if not isinstance(timeline, dict) or not isinstance(timeline.get("calls"), list):
        raise AdminClientError(f"{root} answered {path} without a timeline: {NOT_A_ROUTER}")
    return timeline


def router_root(url: str) -> str:
    """The router's address without a trailing ``/v1`` (the SDK's base URL works too)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise AdminClientError(
            f"--url {url!r} needs http:// or https:// and a host, e.g. {DEFAULT_URL}"
        )
    return url.rstrip("/").removesuffix("/v1")


def _get_page(
    root: str, api_key: str | None, timeout_s: float, query: dict[str, Any]
) -> dict[str, Any]:
    path = f"{PROGRAMS_PATH}?{urllib.parse.urlencode(query)}"
    page = _get_json(root, path, api_key, timeout_s)
    if not isinstance(page, dict) or not isinstance(page.get("programs"), list):
        raise AdminClientError(f"{root} answered {PROGRAMS_PATH} without a table: {NOT_A_ROUTER}")
    return page


def _get_json(root: str, path: str, api_key: str | None, timeout_s: float) -> Any:
    """``GET root + path`` as JSON; an :class:`AdminClientError` that says why not."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(root + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as error:
        raise _refusal(root, error.code, api_key, _program_refusal(error)) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise RouterUnavailable(f"cannot reach the router at {root}: {reason}") from None
    except ValueError:  # not JSON
        path_only = path.split("?")[0]
        raise AdminClientError(
            f"{root} answered {path_only} without JSON: {NOT_A_ROUTER}"
        ) from None


def _program_refusal(error: urllib.error.HTTPError) -> str | None:
    """The router's message of a 404 that names a program (not found, or ended)."""
    try:
        body = json.load(error)
    except (ValueError, OSError):
        return None
    details = body.get("error") if isinstance(body, dict) else None
    if isinstance(details, dict) and details.get("code") in PROGRAM_REFUSALS:
        return str(details.get("message"))
    return None


def _refusal(
    root: str, status: int, api_key: str | None, program_refusal: str | None = None
) -> AdminClientError:
    """What an HTTP error status from ``root`` means to the user."""
    if status == 401 and api_key:
        return AdminClientError(
            f"the router at {root} refused the key (401): pass one of its client keys or its"
            " admin key (--api-key or $AUTELLIX_API_KEY), not an engine key"
        )
    if status == 401:
        return AdminClientError(f"the router at {root} needs a key: --api-key or $AUTELLIX_API_KEY")
    if program_refusal is not None:
        return AdminClientError(f"the router at {root} answered: {program_refusal}")
    if status in (404, 405):  # a router always serves the table: an engine has no such route
        return AdminClientError(f"{root} has no {PROGRAMS_PATH} ({status}): {NOT_A_ROUTER}")
    if status >= 500:
        return RouterUnavailable(f"the router at {root} answered {status}")
    return AdminClientError(f"{root}{PROGRAMS_PATH} answered {status}")
