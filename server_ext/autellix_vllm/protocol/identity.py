"""A call's identity: one typed value from the router's edge to the scheduler.

:class:`CallIdentity` is what a call says about itself: its program, thread,
parent thread and call id, the program's prior service and the client's
retention hint. It is read once at each hop's edge, by :func:`read_identity`
(the router from aiohttp's headers, the engine's middleware from the raw ASGI
bytes, the scheduler from the ``vllm_xargs`` the middleware wrote), with one
strictness, so every hop accepts and rejects exactly the same requests with the
same :class:`IdentityError`. It travels on as one value (the router's call
record, its process table, the engine's scheduler and table), and becomes
wire fields one way: :meth:`CallIdentity.as_headers` (router -> engine) and
:meth:`CallIdentity.as_xargs` (middleware -> scheduler).

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
``X-Autellix-Owner``            ``autellix_owner``             id
``X-Autellix-Priority``         ``autellix_priority``          band
``X-Autellix-Weight``           ``autellix_weight``            weight
``X-Autellix-Router-Wait``      ``autellix_router_wait_s``     seconds >= 0
``X-Session-ID``                (body ``session_id``)          id
=============================== ============================== ===========

A band (:func:`validate_priority`) is a priority class, ``interactive``
(band 0, the default) or ``batch`` (band 1), or a band's number from 0 to
:data:`MAX_PRIORITY_BAND`; a smaller band goes first. A call may also ask for
one in the body's own ``priority`` field, as vLLM's clients send it (an
integer, lower first: the same polarity as a band), read last, after the
header and the ``vllm_xargs`` key, with the same rule: ``0`` to
:data:`MAX_PRIORITY_BAND` or a class name, anything else malformed (a
negative priority too: there is no band better than 0). NVIDIA Dynamo's
``nvext.agent_hints.priority`` is not read: it counts the other way (higher
first) and has no bound, so no band corresponds to it.

A weight (:func:`validate_weight`) is the owner's share of service inside
its band relative to the other owners' (a positive finite number; none: 1).

The router wait is how long the router's flow-control gate held the call
before sending it (seconds, a finite number >= 0; none: not held): the
engine's starvation bound for a worse band counts from when the call reached
the router, not the engine (``TenantConfig.band_aged_at``).

The prior service, the owner (who the caller is), the band, the weight and
the router wait are the router's to state, never a client's: who may state them is
:mod:`~autellix_vllm.protocol.trust`'s one rule (the router states the band a
client asked for, bounded by its key). A call without an owner belongs to
:data:`ANONYMOUS_OWNER`, one owner shared by every such call.

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
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# ---- where identity travels: headers and vllm_xargs keys -----------------------------

PROGRAM_ID_HEADER = "X-Autellix-Program-Id"
THREAD_ID_HEADER = "X-Autellix-Thread-Id"
PARENT_THREAD_ID_HEADER = "X-Autellix-Parent-Thread-Id"
CALL_ID_HEADER = "X-Autellix-Call-Id"
PRIOR_SERVICE_HEADER = "X-Autellix-Prior-Service"
RETENTION_TTL_HEADER = "X-Autellix-Retention-Ttl"
OWNER_HEADER = "X-Autellix-Owner"
PRIORITY_HEADER = "X-Autellix-Priority"
WEIGHT_HEADER = "X-Autellix-Weight"
ROUTER_WAIT_HEADER = "X-Autellix-Router-Wait"
SESSION_ID_HEADER = "X-Session-ID"
"""vLLM's own session header; the SDK sets it to the program id."""
VLLM_PRIORITY_HEADER = "X-Vllm-Priority"
"""vLLM's own priority header (it overrides the body's ``priority``). Not read:
the router does not pass it on, so an engine orders calls only by the band the
router states."""

PROGRAM_ID = "autellix_program_id"
THREAD_ID = "autellix_thread_id"
PARENT_THREAD_ID = "autellix_parent_thread_id"
CALL_ID = "autellix_call_id"
PRIOR_SERVICE = "autellix_prior_service"
RETENTION_TTL = "autellix_retention_ttl_s"
OWNER = "autellix_owner"
PRIORITY = "autellix_priority"
WEIGHT = "autellix_weight"
ROUTER_WAIT = "autellix_router_wait_s"

XARGS_FIELD = "vllm_xargs"
SESSION_ID_FIELD = "session_id"
AGENT_HINT_FIELD = "agent_hint"
PRIORITY_FIELD = "priority"
"""The body's own priority field (vLLM's: an integer, lower first)."""
MAIN_THREAD_ID = "main"
"""The thread a call without a thread id runs on (the policy's table too)."""
ANONYMOUS_OWNER = "anonymous"
"""The owner of every call that names none (no router, or a router without keys)."""
PRIORITY_CLASSES: dict[str, int] = {"interactive": 0, "batch": 1}
"""Priority class name -> its band."""
_CLASS_NAMES = {band: name for name, band in PRIORITY_CLASSES.items()}
MAX_PRIORITY_BAND = 9
"""The worst band a call may name (bands are 0 .. this)."""

# CallIdentity field -> its header, as spelled on the wire.
IDENTITY_HEADERS: dict[str, str] = {
    "program_id": PROGRAM_ID_HEADER,
    "thread_id": THREAD_ID_HEADER,
    "parent_thread_id": PARENT_THREAD_ID_HEADER,
    "call_id": CALL_ID_HEADER,
    "prior_service": PRIOR_SERVICE_HEADER,
    "retention_ttl_s": RETENTION_TTL_HEADER,
    "owner": OWNER_HEADER,
    "priority": PRIORITY_HEADER,
    "weight": WEIGHT_HEADER,
    "router_wait_s": ROUTER_WAIT_HEADER,
}
# CallIdentity field -> its vllm_xargs key.
IDENTITY_XARGS: dict[str, str] = {
    "program_id": PROGRAM_ID,
    "thread_id": THREAD_ID,
    "parent_thread_id": PARENT_THREAD_ID,
    "call_id": CALL_ID,
    "prior_service": PRIOR_SERVICE,
    "retention_ttl_s": RETENTION_TTL,
    "owner": OWNER,
    "priority": PRIORITY,
    "weight": WEIGHT,
    "router_wait_s": ROUTER_WAIT,
}
# Header in lower case (as ASGI delivers it) -> CallIdentity field; X-Session-ID -> itself.
_HEADER_FIELDS: dict[str, str] = {
    **{header.lower(): field for field, header in IDENTITY_HEADERS.items()},
    SESSION_ID_HEADER.lower(): SESSION_ID_HEADER,
}

MAX_ID_LENGTH = 128

# ---- the value and its reader ------------------------------------------------------


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
    owner: str | None = None
    """Who the caller is (the router's ``Client.owner``): whose fair share of the
    engine's held KV the call's program draws on."""
    priority: int | None = None
    """The program's band (0 the best; None: 0), stated by the router."""
    weight: float | None = None
    """The owner's weight (its key's, from the keys file; None: 1), stated by
    the router: its share of service inside a band is proportional to it."""
    router_wait_s: float | None = None
    """Seconds the router's flow-control gate held the call before sending it
    (None: not held), stated by the router: a worse band's call ranks as band 0
    that much sooner on the engine, so the starvation bound counts from when
    the call reached the router."""

    def as_xargs(self) -> dict[str, str | float]:
        """The ``vllm_xargs`` keys of the parts that are set."""
        return {
            key: value
            for field, key in IDENTITY_XARGS.items()
            if (value := getattr(self, field)) is not None
        }

    def as_headers(self) -> dict[str, str]:
        """The headers of the parts that are set."""
        return {
            header: str(value)
            for field, header in IDENTITY_HEADERS.items()
            if (value := getattr(self, field)) is not None
        }


NO_IDENTITY = CallIdentity()
"""A call that says nothing about itself: it runs alone."""


def validate_id(value: object, param: str) -> str:
    if not isinstance(value, str):
        raise IdentityError(f"{param} must be a string, got {type(value).__name__}", param)
    if not value:
        raise IdentityError(f"{param} must not be empty", param)
    if len(value) > MAX_ID_LENGTH:
        raise IdentityError(
            f"{param} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}", param
        )
    if not value.isprintable():  # one pass in C; lone surrogates are not printable
        if any("\ud800" <= ch <= "\udfff" for ch in value):
            # How a header's bytes that are not UTF-8 arrive (decoded with surrogateescape).
            raise IdentityError(f"{param} is not valid UTF-8", param)
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


def validate_priority(value: object, param: str) -> int:
    """A band: a class name of :data:`PRIORITY_CLASSES` or an integer from 0 to
    :data:`MAX_PRIORITY_BAND` (a string of one is accepted; a float is not, so
    that ``0.5`` never rounds to a band)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in PRIORITY_CLASSES:
            return PRIORITY_CLASSES[text]
        value = int(text) if text.isdigit() else value
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PRIORITY_BAND:
        names = ", ".join(PRIORITY_CLASSES)
        raise IdentityError(
            f"{param} must be {names} or a band from 0 to {MAX_PRIORITY_BAND}, got {value!r}",
            param,
        )
    return value


def band_name(band: int) -> str:
    """How listings and metrics name a band: its class name, else its number."""
    return _CLASS_NAMES.get(band, str(band))


def validate_weight(value: object, param: str) -> float:
    """An owner's weight: a positive finite number (a numeric string is accepted)."""
    weight = validate_service(value, param)  # a finite number >= 0
    if weight == 0:
        raise IdentityError(f"{param} must be a positive finite number, got {value!r}", param)
    return weight


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
    priority: object = None,
) -> CallIdentity:
    """The identity of one call, from every place it may travel; the one reader.

    ``headers``: the request's (name, value) pairs, names matched
    case-insensitively; the ``X-Autellix-*`` ones and ``X-Session-ID`` are read.
    A value may be raw bytes, read as UTF-8, or text already decoded from UTF-8
    with ``surrogateescape`` (as aiohttp does): either way, bytes that are not
    UTF-8 make the value malformed.
    ``xargs``: the body's ``vllm_xargs`` (ignored unless a dict: a malformed
    ``vllm_xargs`` is for vLLM to reject). ``session_id``: the body's
    ``session_id``, used when ``X-Session-ID`` is absent. ``agent_hint``: the
    body's ``agent_hint``, read last (see the module's docstring). ``priority``:
    the body's own ``priority`` (vLLM's), the band asked for where neither the
    header nor the ``vllm_xargs`` key names one.

    Every identity value present must be well-formed, even one that a header
    overrides, else :class:`IdentityError` names it.
    """
    from_headers = _identity_headers(headers)
    from_body = xargs if isinstance(xargs, Mapping) else {}

    def part(field: str, validate: Callable[[object, str], T]) -> T | None:
        """The header's value, else the body key's; each one present is read."""
        header = None
        if field in from_headers:
            header = validate(from_headers[field], IDENTITY_HEADERS[field])
        body = None
        key = IDENTITY_XARGS[field]
        if key in from_body:
            body = validate(from_body[key], f"{XARGS_FIELD}.{key}")
        return header if header is not None else body

    program_id = part("program_id", validate_id)
    thread_id = part("thread_id", validate_id)
    parent_thread_id = part("parent_thread_id", validate_id)
    call_id = part("call_id", validate_id)
    prior_service = part("prior_service", validate_service)
    retention_ttl_s = part("retention_ttl_s", validate_ttl)
    owner = part("owner", validate_id)
    band = part("priority", validate_priority)
    if priority is not None:
        body_band = validate_priority(priority, PRIORITY_FIELD)
        band = body_band if band is None else band
    weight = part("weight", validate_weight)
    router_wait_s = part("router_wait_s", validate_service)  # seconds: finite, >= 0
    header_session_id = None
    if SESSION_ID_HEADER in from_headers:
        header_session_id = validate_id(from_headers[SESSION_ID_HEADER], SESSION_ID_HEADER)
    body_session_id = None
    if session_id is not None:
        body_session_id = validate_id(session_id, SESSION_ID_FIELD)
    program_id = program_id or header_session_id or body_session_id
    hint = _read_agent_hint(agent_hint)
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
        owner=owner,
        priority=band,
        weight=weight,
        router_wait_s=router_wait_s,
    )


def _read_agent_hint(hint: object) -> CallIdentity:
    """What a body's ``agent_hint`` says: program, thread, parent thread and
    retention TTL (a :class:`CallIdentity` without a call id)."""
    if hint is None:
        return CallIdentity()
    hint = _object(hint, AGENT_HINT_FIELD)
    session = parent = ttl = None
    if hint.get("session_id") is not None:
        session = validate_id(hint["session_id"], f"{AGENT_HINT_FIELD}.session_id")
    if hint.get("parent_session_id") is not None:
        param = f"{AGENT_HINT_FIELD}.parent_session_id"
        parent = validate_id(hint["parent_session_id"], param)
    cache_control = hint.get("cache_control")
    if cache_control is not None:
        cache_control = _object(cache_control, f"{AGENT_HINT_FIELD}.cache_control")
        if cache_control.get("ttl") is not None:
            param = f"{AGENT_HINT_FIELD}.cache_control.ttl"
            ttl = validate_ttl(cache_control["ttl"], param)
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
    """The identity headers among ``headers``: the :class:`CallIdentity` field
    (``X-Session-ID`` for that header) -> the value without surrounding whitespace.

    The one place header values are read, so one decoding rule serves them all.
    An empty parent thread header is left out: a main thread's calls send it
    empty, meaning no parent.
    """
    found: dict[str, str] = {}
    for raw_name, raw_value in headers:
        field = _HEADER_FIELDS.get(_text(raw_name).lower())
        if field is None:
            continue
        value = _text(raw_value).strip()
        if field == "parent_thread_id" and not value:
            continue
        found[field] = value
    return found


def _text(value: str | bytes) -> str:
    """A header's name or value as text: bytes are UTF-8, those that are not kept
    as lone surrogates (:func:`validate_id` rejects them)."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
