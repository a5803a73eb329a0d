"""The wire contract between the SDK, the router and the engines.

One place for what travels on the wire: the identity headers and the
``vllm_xargs`` keys they become, how identity is read and validated, the API
paths, and the error body. Pure functions, no web framework: the engine's
middleware and the router read identity through :func:`read_identity`, so both
accept and reject exactly the same requests. The SDK (``autellix``) keeps its
own copies of the header names and paths, since it must work without this
package; ``tests/test_protocol.py`` checks that they match.

Identity (the SDK sends the headers; a client may instead put the flat keys
straight into the body's ``vllm_xargs``):

=============================== ============================== ===========
header                          ``vllm_xargs`` key             value
=============================== ============================== ===========
``X-Autellix-Program-Id``       ``autellix_program_id``        id
``X-Autellix-Thread-Id``        ``autellix_thread_id``         id
``X-Autellix-Parent-Thread-Id`` ``autellix_parent_thread_id``  id
``X-Autellix-Call-Id``          ``autellix_call_id``           id
``X-Autellix-Prior-Service``    ``autellix_prior_service``     float >= 0
``X-Autellix-Retention-Ttl``    ``autellix_retention_ttl_s``   TTL
``X-Session-ID``                (body ``session_id``)          id
=============================== ============================== ===========

An id is 1 to 128 characters with no control characters; only the parent
thread header may be empty, which means the main thread (no parent). Header
values are UTF-8: the router (aiohttp) and the engine's middleware (raw ASGI
bytes) both hand them to :func:`read_identity`, which reads bytes as UTF-8, and
a value that is not UTF-8 is malformed (400), so both store the same id.

A TTL (:func:`validate_ttl`) is a number of seconds >= 0, or a string of one
with a unit: ``"30"``, ``"30s"``, ``"5m"``, ``"1h"``. The retention TTL is a
client's hint of how long its program will be away (a tool call) after this
call: the engine holds the call's KV that long, clamped to its residency
bounds (``ResidencyConfig.min_ttl_s`` .. ``max_ttl_s``), instead of its own
estimate. It is not a priority field: it never changes any program's rank.

Precedence, per part: header, then the body's ``vllm_xargs`` key. The headers
are what the SDK and the router set on every call, while a body key may be
stale user data copied from an earlier request. A call without a program id
belongs to its session id (``X-Session-ID``, else the body's ``session_id``).

Last of all, the emerging conventions' body field (vLLM's agent_hint RFC, the
router's Progress-TTL RFC), for agents that do not use our SDK::

    "agent_hint": {"session_id": "sub-7", "parent_session_id": "sess-1",
                   "cache_control": {"ttl": "30s"}}

The program is ``parent_session_id`` if given, else ``session_id``; a call with
a parent session runs on thread ``session_id``, forked from the parent's main
thread (:data:`MAIN_THREAD_ID`). These parts count only where nothing above
named the program (or named the same one), and ``cache_control.ttl`` only
where no retention TTL was sent. Other keys of ``agent_hint`` are ignored.

Paths: the OpenAI generation endpoints (:data:`GENERATION_PATHS`), the
router's program and engine API (:data:`PROGRAMS_PATH`, :data:`ENGINES_PATH`)
and each engine's own (:data:`ENGINE_TABLE_PATH`, :data:`ENGINE_PROGRAM_PATH`).

Errors: OpenAI's shape, :func:`error_body`, from the router and the engines alike;
:func:`normalized_error` puts any other error answer (vLLM's own) in that shape.

Keys: :func:`holds_key` reads an ``Authorization: Bearer <key>`` header the way
vLLM's own ``--api-key`` check does, in constant time.
"""

from __future__ import annotations

import hmac
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# ---- identity: headers and vllm_xargs keys ------------------------------------------

PROGRAM_ID_HEADER = "X-Autellix-Program-Id"
THREAD_ID_HEADER = "X-Autellix-Thread-Id"
PARENT_THREAD_ID_HEADER = "X-Autellix-Parent-Thread-Id"
CALL_ID_HEADER = "X-Autellix-Call-Id"
PRIOR_SERVICE_HEADER = "X-Autellix-Prior-Service"
RETENTION_TTL_HEADER = "X-Autellix-Retention-Ttl"
SESSION_ID_HEADER = "X-Session-ID"
"""vLLM's own session header; the SDK sets it to the program id."""

PROGRAM_ID = "autellix_program_id"
THREAD_ID = "autellix_thread_id"
PARENT_THREAD_ID = "autellix_parent_thread_id"
CALL_ID = "autellix_call_id"
PRIOR_SERVICE = "autellix_prior_service"
RETENTION_TTL = "autellix_retention_ttl_s"

XARGS_FIELD = "vllm_xargs"
SESSION_ID_FIELD = "session_id"
AGENT_HINT_FIELD = "agent_hint"
MAIN_THREAD_ID = "main"
"""The thread a call without a thread id runs on (the policy's table too)."""

# vllm_xargs key -> its header, as spelled on the wire.
KEY_TO_HEADER: dict[str, str] = {
    PROGRAM_ID: PROGRAM_ID_HEADER,
    THREAD_ID: THREAD_ID_HEADER,
    PARENT_THREAD_ID: PARENT_THREAD_ID_HEADER,
    CALL_ID: CALL_ID_HEADER,
    PRIOR_SERVICE: PRIOR_SERVICE_HEADER,
    RETENTION_TTL: RETENTION_TTL_HEADER,
}
# CallIdentity field -> its header.
IDENTITY_HEADERS: dict[str, str] = {
    "program_id": PROGRAM_ID_HEADER,
    "thread_id": THREAD_ID_HEADER,
    "parent_thread_id": PARENT_THREAD_ID_HEADER,
    "call_id": CALL_ID_HEADER,
    "prior_service": PRIOR_SERVICE_HEADER,
    "retention_ttl_s": RETENTION_TTL_HEADER,
}
# Header in lower case (as ASGI delivers it) -> vllm_xargs key.
HEADER_TO_KEY: dict[str, str] = {header.lower(): key for key, header in KEY_TO_HEADER.items()}

MAX_ID_LENGTH = 128

# ---- paths ------------------------------------------------------------------------

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
RESPONSES_PATH = "/v1/responses"
# The calls that carry an identity: the OpenAI generation endpoints, the ones the
# SDK's OpenAI client makes and the router proxies and meters (it reads OpenAI's
# usage). The engine's middleware tags exactly these, so a call is scheduled as
# part of its program on the same endpoints whether it comes through the router
# or straight to an engine. vLLM's Anthropic ``/v1/messages`` is not among them.
GENERATION_PATHS = (CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, RESPONSES_PATH)

PROGRAMS_PATH = "/autellix/v1/programs"
"""Router: ``POST`` opens a program, ``GET`` is the global process table."""
PROGRAM_PATH = PROGRAMS_PATH + "/{program_id}"
"""Router: ``DELETE`` ends a program, there and on its engines."""
ENGINES_PATH = "/autellix/v1/engines"
"""Router: the engines, their health and load."""
ENGINE_TABLE_PATH = "/autellix/v1/engine/table"
"""Engine: its process table (``GET``; ``?summary=1``: without the programs' rows),
or the rows of some programs (``POST {"program_ids": [...]}``)."""
ENGINE_TABLE_MAX_IDS = 1000
"""Program ids one ``POST`` of :data:`ENGINE_TABLE_PATH` may name."""
ENGINE_PROGRAM_PATH = "/autellix/v1/engine/programs/{program_id}"
"""Engine: ``DELETE`` ends a program there."""

# The engine key: the secret a router (or an operator) holds for an engine. An
# engine started with one (`autellix engine --api-key`, `autellix serve` makes
# one per run) reads it from this variable, and takes scheduling fields (the
# prior service) and its /autellix/v1/engine/* endpoints only from callers that
# send it as `Authorization: Bearer <key>`, as vLLM's own --api-key does.
ENGINE_KEY_VARIABLE = "AUTELLIX_ENGINE_KEY"
# The error code of a request that lacks a key the server needs (status 401).
INVALID_KEY_CODE = "invalid_api_key"

# ---- identity: reading and validation ---------------------------------------------


class IdentityError(ValueError):
    """A malformed identity value; ``param`` names the offending header or key."""

    code = "invalid_identity"
    """The error code the router and the engines answer it with (status 400)."""

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
    retention_ttl_s: float | None = None
    """The client's retention hint in seconds, as sent (the engine clamps it)."""

    def as_xargs(self) -> dict[str, str | float]:
        """The ``vllm_xargs`` keys of the parts that are set."""
        parts = {
            PROGRAM_ID: self.program_id,
            THREAD_ID: self.thread_id,
            PARENT_THREAD_ID: self.parent_thread_id,
            CALL_ID: self.call_id,
            PRIOR_SERVICE: self.prior_service,
            RETENTION_TTL: self.retention_ttl_s,
        }
        return {key: value for key, value in parts.items() if value is not None}


def validate_id(value: object, param: str) -> str:
    if not isinstance(value, str):
        raise IdentityError(f"{param} must be a string, got {type(value).__name__}", param)
    if not value:
        raise IdentityError(f"{param} must not be empty", param)
    if len(value) > MAX_ID_LENGTH:
        raise IdentityError(
            f"{param} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}", param
        )
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        # How a header's bytes that are not UTF-8 arrive (decoded with surrogateescape).
        raise IdentityError(f"{param} is not valid UTF-8", param)
    if any(not ch.isprintable() for ch in value):
        raise IdentityError(f"{param} contains a control character", param)
    return value


def validate_service(value: object, param: str) -> float:
    """A service amount: a finite number >= 0 (a numeric string is accepted)."""
    if isinstance(value, bool):  # bool is an int subclass; True is not a number here
        raise IdentityError(f"{param} must be a number, got a boolean", param)
    try:
        service = _float(value)
    except (TypeError, ValueError):
        raise IdentityError(f"{param} must be a number, got {value!r}", param) from None
    if not math.isfinite(service) or service < 0:
        raise IdentityError(f"{param} must be a finite number >= 0, got {value!r}", param)
    return service


_TTL_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_TTL_WITH_UNIT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smh])", re.IGNORECASE)


def validate_ttl(value: object, param: str) -> float:
    """A TTL in seconds: a finite number >= 0, or a string of one, bare or with a
    unit, ``s``, ``m`` or ``h`` (``"30"``, ``"30s"``, ``"5m"``, ``"1.5h"``)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            match = _TTL_WITH_UNIT.fullmatch(text)
            if match is None:
                message = f"{param} must be seconds or a duration like '30s', '5m', '1h'"
                raise IdentityError(f"{message}, got {value!r}", param) from None
            value = float(match[1]) * _TTL_UNITS[match[2].lower()]
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise IdentityError(f"{param} must be a number of seconds, got {value!r}", param)
    seconds = _float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise IdentityError(f"{param} must be a finite number of seconds >= 0", param)
    return seconds


def _float(value: Any) -> float:
    """``float(value)``, infinite for an integer too large for a float."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


Header = tuple[str | bytes, str | bytes]
"""A header's (name, value), as text (aiohttp) or as the raw bytes (ASGI)."""


def read_identity(
    headers: Iterable[Header] = (),
    xargs: object = None,
    session_id: object = None,
    *,
    agent_hint: object = None,
    strict: bool = True,
) -> CallIdentity:
    """The identity of one call, from every place it may travel.

    ``headers``: the request's (name, value) pairs, names matched
    case-insensitively; the ``X-Autellix-*`` ones and ``X-Session-ID`` are read.
    A value may be raw bytes, read as UTF-8, or text already decoded from UTF-8
    with ``surrogateescape`` (as aiohttp does): either way, bytes that are not
    UTF-8 make the value malformed.
    ``xargs``: the body's ``vllm_xargs`` (ignored unless a dict: a malformed
    ``vllm_xargs`` is for vLLM to reject). ``session_id``: the body's
    ``session_id``, used when ``X-Session-ID`` is absent. ``agent_hint``: the
    body's ``agent_hint``, read last (see the module's docstring).

    Strict (the router, the engine's middleware): every identity value present
    must be well-formed, even one that a header overrides, else
    :class:`IdentityError` names it. Lenient (inside the engine's scheduler,
    where a bad value must never fail a call): a malformed value counts as
    missing, and the next place in the precedence is used.
    """
    read = _strict if strict else _lenient
    from_headers = _identity_headers(headers)
    from_body = xargs if isinstance(xargs, Mapping) else {}

    def part(key: str, validate: Callable[[object, str], T]) -> T | None:
        """The header's value, else the body key's; each one present is read."""
        header = None
        if key in from_headers:
            header = read(validate, from_headers[key], KEY_TO_HEADER[key])
        body = None
        if key in from_body:
            body = read(validate, from_body[key], f"{XARGS_FIELD}.{key}")
        return header if header is not None else body

    program_id = part(PROGRAM_ID, validate_id)
    thread_id = part(THREAD_ID, validate_id)
    parent_thread_id = part(PARENT_THREAD_ID, validate_id)
    call_id = part(CALL_ID, validate_id)
    prior_service = part(PRIOR_SERVICE, validate_service)
    retention_ttl_s = part(RETENTION_TTL, validate_ttl)
    header_session_id = None
    if SESSION_ID_HEADER in from_headers:
        header_session_id = read(validate_id, from_headers[SESSION_ID_HEADER], SESSION_ID_HEADER)
    body_session_id = None
    if session_id is not None:
        body_session_id = read(validate_id, session_id, SESSION_ID_FIELD)
    program_id = program_id or header_session_id or body_session_id
    hint = _read_agent_hint(agent_hint, read)
    if hint.program_id is not None and program_id in (None, hint.program_id):
        program_id = hint.program_id
        if thread_id is None:
            thread_id, parent_thread_id = hint.thread_id, hint.parent_thread_id
    return CallIdentity(
        program_id=program_id,
        thread_id=thread_id,
        parent_thread_id=parent_thread_id,
        call_id=call_id,
        prior_service=prior_service,
        retention_ttl_s=retention_ttl_s if retention_ttl_s is not None else hint.retention_ttl_s,
    )


def _read_agent_hint(hint: object, read: Callable[..., Any]) -> CallIdentity:
    """What a body's ``agent_hint`` says: program, thread, parent thread and
    retention TTL (a :class:`CallIdentity` without a call id)."""
    if hint is None:
        return CallIdentity()
    if not isinstance(hint, Mapping):
        read(_object, hint, AGENT_HINT_FIELD)
        return CallIdentity()
    session = parent = ttl = None
    if hint.get("session_id") is not None:
        session = read(validate_id, hint["session_id"], f"{AGENT_HINT_FIELD}.session_id")
    if hint.get("parent_session_id") is not None:
        param = f"{AGENT_HINT_FIELD}.parent_session_id"
        parent = read(validate_id, hint["parent_session_id"], param)
    cache_control = hint.get("cache_control")
    if cache_control is not None:
        cache_control = read(_object, cache_control, f"{AGENT_HINT_FIELD}.cache_control")
    given_ttl = cache_control.get("ttl") if isinstance(cache_control, Mapping) else None
    if given_ttl is not None:
        ttl = read(validate_ttl, given_ttl, f"{AGENT_HINT_FIELD}.cache_control.ttl")
    forked = parent is not None and session is not None and session != parent
    return CallIdentity(
        program_id=parent or session,
        thread_id=session if forked else None,
        parent_thread_id=MAIN_THREAD_ID if forked else None,
        retention_ttl_s=ttl,
    )


def _object(value: object, param: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise IdentityError(f"{param} must be an object, got {type(value).__name__}", param)
    return value


def _identity_headers(headers: Iterable[Header]) -> dict[str, str]:
    """The identity headers among ``headers``: the ``vllm_xargs`` key (``X-Session-ID``
    for that header) -> the value without surrounding whitespace.

    The one place header values are read, so one decoding rule serves them all.
    An empty parent thread header is left out: a main thread's calls send it
    empty, meaning no parent.
    """
    found: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = _text(raw_name).lower()
        key = SESSION_ID_HEADER if name == SESSION_ID_HEADER.lower() else HEADER_TO_KEY.get(name)
        if key is None:
            continue
        value = _text(raw_value).strip()
        if key == PARENT_THREAD_ID and not value:
            continue
        found[key] = value
    return found


def _text(value: str | bytes) -> str:
    """A header's name or value as text: bytes are UTF-8, those that are not kept
    as lone surrogates (:func:`validate_id` rejects them)."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def _strict(validate: Callable[[object, str], T], value: object, param: str) -> T:
    return validate(value, param)


def _lenient(validate: Callable[[object, str], T], value: object, param: str) -> T | None:
    try:
        return validate(value, param)
    except IdentityError:
        return None


# ---- keys -------------------------------------------------------------------------


def holds_key(authorization: str | bytes | None, key: str) -> bool:
    """Whether an ``Authorization`` header value carries ``key``: ``Bearer <key>``,
    the scheme in any case, as vLLM's ``--api-key`` check reads it.

    Compared in constant time, so the answer's timing tells nothing of the key.
    """
    if not authorization:
        return False
    if isinstance(authorization, str):
        authorization = authorization.encode("utf-8", "surrogateescape")
    scheme, _, given = authorization.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given, key.encode())


# ---- errors -----------------------------------------------------------------------


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status."""
    if status == 401:
        return "authentication_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


# HTTP status -> the error code of an answer that names none (vLLM's `"code": 400`,
# its `{"error": "Unauthorized"}`, FastAPI's `{"detail": ...}`, aiohttp's errors).
STATUS_ERROR_CODES = {
    400: "invalid_request",
    401: INVALID_KEY_CODE,
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "body_too_large",
    422: "invalid_request",
    429: "rate_limited",
    500: "internal_error",
    501: "not_implemented",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "gateway_timeout",
}


def status_error_code(status: int) -> str:
    """The error code for an HTTP ``status`` when nothing more specific is known."""
    return STATUS_ERROR_CODES.get(status, "server_error" if status >= 500 else "http_error")


def error_body(status: int, message: str, code: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``.

    ``code`` is a short machine-readable name such as ``invalid_identity`` or
    ``model_not_found``; ``param`` names the offending parameter, if any.
    """
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def normalized_error(status: int, body: bytes) -> dict[str, Any]:
    """An error answer's ``body`` (any bytes) as :func:`error_body` of ``status``.

    The message is kept: the error's ``message`` (OpenAI's and vLLM's shape), a
    bare ``{"error": "text"}`` (vLLM's 401), FastAPI's ``detail``, else the body
    as text. A string ``code`` and ``param`` are kept; any other code (vLLM's
    integer ``400``) becomes :func:`status_error_code`. Our own bodies come
    back unchanged.
    """
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError)
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    fields = error if isinstance(error, dict) else {}
    if isinstance(error, dict):
        message: object = error.get("message")
    elif error is not None:
        message = error
    elif isinstance(payload, dict) and "detail" in payload:
        message = payload["detail"]
    else:
        message = body.decode("utf-8", "replace").strip()
    if not isinstance(message, str):
        message = json.dumps(message) if message is not None else ""
    code = fields.get("code")
    param = fields.get("param")
    return error_body(
        status,
        message or f"the server answered {status}",
        code if isinstance(code, str) and code else status_error_code(status),
        param if isinstance(param, str) else None,
    )
