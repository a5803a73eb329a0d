"""Who a call belongs to: the identity headers, their validation, and the
``vllm_xargs`` keys the engine's scheduler reads.

Pure functions, no web framework: the engine's middleware and the router
share them, so both accept and reject exactly the same requests.

Wire format (the SDK sends the headers; a client may instead put the flat
keys straight into the body's ``vllm_xargs``):

=============================== ============================== ===========
header                          ``vllm_xargs`` key             value
=============================== ============================== ===========
``X-Autellix-Program-Id``       ``autellix_program_id``        id
``X-Autellix-Thread-Id``        ``autellix_thread_id``         id
``X-Autellix-Parent-Thread-Id`` ``autellix_parent_thread_id``  id
``X-Autellix-Call-Id``          ``autellix_call_id``           id
``X-Autellix-Prior-Service``    ``autellix_prior_service``     float >= 0
=============================== ============================== ===========

An id is 1 to 128 characters with no control characters; only the parent
thread header may be empty, which means the main thread (no parent). Headers take
precedence over keys already in the body: the headers are what the SDK and the
router set on every call, while a body key may be stale user data copied from
an earlier request. Body keys without a matching header are kept as they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

MAX_ID_LENGTH = 128

PROGRAM_ID = "autellix_program_id"
THREAD_ID = "autellix_thread_id"
PARENT_THREAD_ID = "autellix_parent_thread_id"
CALL_ID = "autellix_call_id"
PRIOR_SERVICE = "autellix_prior_service"

# header (lower case, as ASGI delivers it) -> vllm_xargs key
HEADER_TO_KEY: dict[str, str] = {
    "x-autellix-program-id": PROGRAM_ID,
    "x-autellix-thread-id": THREAD_ID,
    "x-autellix-parent-thread-id": PARENT_THREAD_ID,
    "x-autellix-call-id": CALL_ID,
    "x-autellix-prior-service": PRIOR_SERVICE,
}
KEY_TO_HEADER: dict[str, str] = {key: header for header, key in HEADER_TO_KEY.items()}
ID_KEYS = (PROGRAM_ID, THREAD_ID, PARENT_THREAD_ID, CALL_ID)


class IdentityError(ValueError):
    """A malformed identity value; ``param`` names the offending header or key."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class CallIdentity:
    """The identity of one call, as the scheduler sees it. Missing parts are None."""

    program_id: str | None = None
    thread_id: str | None = None
    parent_thread_id: str | None = None
    call_id: str | None = None
    prior_service: float | None = None


def validate_id(value: object, param: str) -> str:
    if not isinstance(value, str):
        raise IdentityError(f"{param} must be a string, got {type(value).__name__}", param)
    if not value:
        raise IdentityError(f"{param} must not be empty", param)
    if len(value) > MAX_ID_LENGTH:
        raise IdentityError(
            f"{param} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}", param
        )
    if any(not ch.isprintable() for ch in value):
        raise IdentityError(f"{param} contains a control character", param)
    return value


def validate_service(value: object, param: str) -> float:
    """A service amount: a finite number >= 0 (a numeric string is accepted)."""
    if isinstance(value, bool):  # bool is an int subclass; True is not a number here
        raise IdentityError(f"{param} must be a number, got a boolean", param)
    try:
        service = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise IdentityError(f"{param} must be a number, got {value!r}", param) from None
    if not math.isfinite(service) or service < 0:
        raise IdentityError(f"{param} must be a finite number >= 0, got {value!r}", param)
    return service


def _validate(key: str, value: object, param: str) -> str | float:
    if key == PRIOR_SERVICE:
        return validate_service(value, param)
    return validate_id(value, param)


def xargs_from_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str | float]:
    """The ``vllm_xargs`` keys carried by the identity headers among ``headers``.

    ``headers`` are (name, value) pairs; names match case-insensitively.
    Raises :class:`IdentityError` for a malformed value.
    """
    xargs: dict[str, str | float] = {}
    for name, value in headers:
        key = HEADER_TO_KEY.get(name.lower())
        if key is None:
            continue
        value = value.strip()
        if key == PARENT_THREAD_ID and not value:
            continue  # a main thread's calls send an empty parent: no parent
        xargs[key] = _validate(key, value, _header_name(key))
    return xargs


def validate_xargs(xargs: Mapping[str, object]) -> None:
    """Check the identity keys a client put in the body itself."""
    for key in HEADER_TO_KEY.values():
        if key in xargs:
            _validate(key, xargs[key], f"vllm_xargs.{key}")


def merge_into_xargs(
    body_xargs: Mapping[str, object] | None, header_xargs: Mapping[str, str | float]
) -> dict[str, object]:
    """The body's ``vllm_xargs`` with the header values laid over it (headers win)."""
    merged = dict(body_xargs or {})
    merged.update(header_xargs)
    return merged


def identity_from_xargs(
    extra_args: Mapping[str, object] | None, session_id: str | None = None
) -> CallIdentity:
    """The identity the scheduler uses. The program id falls back to the session id.

    Lenient by design: inside the engine a bad value must never fail a call, so
    an invalid entry counts as missing (the HTTP layer already rejected
    malformed values before the request got here).
    """
    extra_args = extra_args or {}
    program_id = _lenient(validate_id, extra_args.get(PROGRAM_ID))
    if program_id is None:
        program_id = _lenient(validate_id, session_id)
    return CallIdentity(
        program_id=program_id,
        thread_id=_lenient(validate_id, extra_args.get(THREAD_ID)),
        parent_thread_id=_lenient(validate_id, extra_args.get(PARENT_THREAD_ID)),
        call_id=_lenient(validate_id, extra_args.get(CALL_ID)),
        prior_service=_lenient(validate_service, extra_args.get(PRIOR_SERVICE)),
    )


def _lenient(validate: Callable[[object, str], T], value: object) -> T | None:
    if value is None:
        return None
    try:
        return validate(value, "")
    except IdentityError:
        return None


def _header_name(key: str) -> str:
    """The header's canonical spelling, for error messages."""
    return "-".join(part.capitalize() for part in KEY_TO_HEADER[key].split("-"))
