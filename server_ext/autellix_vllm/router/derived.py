"""Program identity for clients that cannot send ours.

A finished agent (a coding CLI, an MCP host) or a framework used without our
SDK lets its user set a base URL and a key, nothing more. Such a client still
sends something that ties its calls together, and the router names a program
from the first of these that a call carries (a call that names its program the
SDK's way, or by ``X-Session-ID``, the body's ``session_id`` or
``agent_hint``, keeps that name and derives nothing):

1. a session header that agent harnesses and other routers send
   (:data:`SESSION_HEADERS`);
2. the body's ``prompt_cache_key``;
3. the body's ``previous_response_id`` (a response this router relayed: the
   program that asked for it) or ``conversation``;
4. the body's ``user``, else ``safety_identifier``;
5. the conversation itself (on unless the router runs with
   ``prefix_programs=False``): a call whose messages (chat) or input items
   (responses) extend an earlier call's joins that call's program.

A derived program gets a fresh random id (``derived-...``), the name its source
gave it (shown by ``autellix ps``), and belongs to the key that sent the call:
every key a value is looked up under includes the caller's owner, so the same
``prompt_cache_key`` sent with two API keys names two programs, and no value
reaches another key's program. A derived program ranks as any other program
of its key: deriving only groups calls a client could have named itself.

Such a client never ends its programs, so the router ends a derived program
once it has been idle (nothing in flight) for ``idle_end_s``, here and on its
engines, as if the client had ended it; a later call with the same value opens
a new one. Engines hold an idle context only for their own bounded, priced
time (``policy.residency``), never for the program's life.

The conversation rule, precisely. A prefix of a call's items (its first ``k``)
is known by a key: the owner, ``k``, and the first two and last two of those
items. A call registers the key of all its items under its program. A later
call looks, among its prefixes that leave out at most :data:`NEW_ITEMS_SEEN`
of its items, for the longest one an earlier call registered. If the item
right after that prefix is the model's (an assistant message, a function
call), it is the reply the earlier call received: it claims that earlier
call's branch, and a call whose reply differs from the one that claimed a
branch first belongs elsewhere (two agents that started with the same messages
get different replies and so stay apart). A call whose items equal an earlier
call's exactly extends nothing and opens a program of its own. Only the newest
:data:`REGISTRATIONS_KEPT` calls of a program stay registered; a client that
rewrites its history (a summary replacing old turns) starts a new program.

An item is compared by its fields without null or empty ones (clients differ in
leaving those out), long strings by their length and both ends
(:data:`STRING_ENDS` characters each). So a call costs a few items' worth of
work, however long its conversation and its context: the key reads the ends of
a conversation, whose middle a client does not change between its calls, and
whose last items (a reply with its tool call ids, the tools' outputs) tell one
conversation from another.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autellix_vllm.policy.bounded import IdleTable
from autellix_vllm.protocol.paths import CHAT_COMPLETIONS_PATH, RESPONSES_PATH
from autellix_vllm.router.programs import ProgramRecord

SESSION_HEADERS = (
    "session-id",
    "x-session-affinity",
    "x-claude-code-session-id",
    "x-dynamo-session-id",
)
"""Session headers of agent harnesses and routers, read in this order (case-insensitive)."""

BODY_SOURCES = ("prompt_cache_key", "previous_response_id", "conversation", "user",
                "safety_identifier")  # fmt: skip
"""Body fields that name a program, read in this order (``previous_response_id``
only when it names a response this router relayed)."""

PREFIX_SOURCE = "conversation prefix"
DERIVED_ID_PREFIX = "derived-"

# Calls per program whose items stay registered for the conversation rule, and
# response ids per program kept for previous_response_id.
REGISTRATIONS_KEPT = 4
# Items a call may add to an earlier call's and still extend it (a reply, the
# outputs of its parallel tool calls, a user turn).
NEW_ITEMS_SEEN = 64
RESPONSES_KEPT = 8
# Characters of each end of a long string that an item's fingerprint reads.
STRING_ENDS = 128
# Fields an item's fingerprint reads at most (a huge tool output in pieces).
_MAX_FINGERPRINT_NODES = 256
# Characters of the source's value shown in the program's name.
_NAME_VALUE_CHARS = 48
# Roles and item types that are the model's reply to the items before them.
_MODEL_ROLES = frozenset({"assistant"})
_MODEL_ITEM_TYPES = frozenset({"function_call", "reasoning", "custom_tool_call"})


def session_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The :data:`SESSION_HEADERS` among a call's ``headers`` that have a value
    (lower-case names, values stripped): read once, when the call is accepted,
    and all :meth:`ProgramDeriver.derive` reads of its headers."""
    found = {}
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value and value.strip():
            found[name] = value.strip()
    return found


@dataclass(frozen=True)
class Derived:
    """A program named for a call that named none."""

    program_id: str
    name: str  # "<source>=<value>", printable, for listings
    new: bool  # opened by this call


@dataclass(eq=False, slots=True)
class _Branch:
    """One registered call: its program, and the model's reply that continued it."""

    program_id: str
    reply: bytes | None = None


@dataclass(slots=True)
class _Program:
    keys: list[bytes] = field(default_factory=list)
    prefixes: deque[bytes] = field(default_factory=lambda: deque(maxlen=REGISTRATIONS_KEPT))
    responses: deque[bytes] = field(default_factory=lambda: deque(maxlen=RESPONSES_KEPT))


class ProgramDeriver:
    """Names programs for calls that name none (see the module), and ends them idle."""

    def __init__(self, idle_end_s: float, prefix_programs: bool = True) -> None:
        self.prefix_programs = prefix_programs
        self._by_key: dict[bytes, str] = {}  # hashed (owner, source, value) -> program id
        self._branches: dict[bytes, list[_Branch]] = {}  # a prefix's key -> its branches
        self._programs: dict[str, _Program] = {}
        self._idle: IdleTable[ProgramRecord] = IdleTable(idle_end_s)

    def __len__(self) -> int:
        """Derived programs known (in the router's table)."""
        return len(self._programs)

    def derive(
        self, path: str, body: Mapping[str, Any], headers: Mapping[str, str], owner: str
    ) -> Derived | None:
        """The program of a call from ``owner`` that named none, opened if new;
        None if nothing in the call names one. ``headers``: its session headers
        (:func:`session_headers`; other headers are not read)."""
        for name in SESSION_HEADERS:
            value = headers.get(name)
            if value and value.strip():
                return self._by_value(owner, name, value.strip())
        for name in BODY_SOURCES:
            value = body.get(name)
            if name == "conversation" and isinstance(value, Mapping):
                value = value.get("id")
            if not isinstance(value, str) or not value:
                continue
            if name == "previous_response_id":
                known = self._by_key.get(_key(owner, "response", value))
                if known is not None:
                    return Derived(known, self._name(name, value), new=False)
                continue
            return self._by_value(owner, name, value)
        if self.prefix_programs:
            return self._by_prefix(path, body, owner)
        return None

    def opened(self, derived: Derived, record: ProgramRecord) -> None:
        """The router's table took the call of ``derived`` (``record``): its idle clock runs."""
        if derived.new:
            self.watch(record)
        self.touch(record)

    def watch(self, record: ProgramRecord) -> None:
        """End ``record``'s program once it is idle (:meth:`idle` names it)."""
        self._idle.add(record.program_id, record)

    def refused(self, derived: Derived) -> None:
        """The table refused to open ``derived`` (it was full): forget it again."""
        if derived.new:
            self.forget(derived.program_id)

    def touch(self, record: ProgramRecord) -> None:
        """A call of ``record`` arrived or finished."""
        self._idle.touch(record.program_id)

    def answered(self, program_id: str, owner: str, response_id: str) -> None:
        """``program_id``'s call was answered as response ``response_id``: a later
        call naming it as its ``previous_response_id`` belongs to the program."""
        program = self._programs.get(program_id)
        if program is None:
            program = self._programs[program_id] = _Program()
        if len(program.responses) == RESPONSES_KEPT:
            self._by_key.pop(program.responses[0], None)
        key = _key(owner, "response", response_id)
        program.responses.append(key)
        self._by_key[key] = program_id

    def idle(self, now_s: float) -> list[str]:
        """Derived programs idle for ``idle_end_s`` with nothing in flight: to end."""
        return self._idle.drop_idle(now_s)

    def forget(self, program_id: str) -> None:
        """``program_id`` left the router's table: nothing names it any more."""
        self._idle.pop(program_id)
        program = self._programs.pop(program_id, None)
        if program is None:
            return
        for key in (*program.keys, *program.responses):
            if self._by_key.get(key) == program_id:
                del self._by_key[key]
        for prefix in program.prefixes:
            self._unregister(prefix, program_id)

    # ---- inside ----------------------------------------------------------------------

    def _by_value(self, owner: str, source: str, value: str) -> Derived:
        key = _key(owner, source, value)
        program_id = self._by_key.get(key)
        if program_id is not None:
            return Derived(program_id, self._name(source, value), new=False)
        program_id = self._new_program()
        self._programs[program_id].keys.append(key)
        self._by_key[key] = program_id
        return Derived(program_id, self._name(source, value), new=True)

    def _by_prefix(self, path: str, body: Mapping[str, Any], owner: str) -> Derived | None:
        items = _conversation(path, body)
        if not items:
            return None
        prefixes = _Prefixes(owner, items)
        program_id = self._extended(items, prefixes)
        new = program_id is None
        if program_id is None:
            program_id = self._new_program()
        self._register(program_id, prefixes.key(len(items)))
        noun = "item" if path == RESPONSES_PATH else "message"
        return Derived(program_id, f"{PREFIX_SOURCE} ({len(items)} {noun}s)", new=new)

    def _extended(self, items: list[Any], prefixes: _Prefixes) -> str | None:
        """The program of the longest earlier call that ``items`` extend, or None."""
        shortest = max(1, len(items) - NEW_ITEMS_SEEN)
        for length in range(len(items) - 1, shortest - 1, -1):
            branches = self._branches.get(prefixes.key(length))
            if not branches:
                continue
            after = items[length]
            if not _is_reply(after):
                return branches[0].program_id
            reply = prefixes.fingerprint(length)
            for branch in branches:
                if branch.reply == reply:
                    return branch.program_id
            for branch in branches:
                if branch.reply is None:
                    branch.reply = reply
                    return branch.program_id
            return None  # every earlier call was continued by another reply
        return None

    def _register(self, program_id: str, prefix: bytes) -> None:
        prefixes = self._programs[program_id].prefixes
        if prefix in prefixes:
            return
        if len(prefixes) == REGISTRATIONS_KEPT:
            self._unregister(prefixes[0], program_id)
        prefixes.append(prefix)
        self._branches.setdefault(prefix, []).append(_Branch(program_id))

    def _unregister(self, prefix: bytes, program_id: str) -> None:
        branches = self._branches.get(prefix)
        if branches is None:
            return
        branches[:] = [b for b in branches if b.program_id != program_id]
        if not branches:
            del self._branches[prefix]

    def _new_program(self) -> str:
        program_id = DERIVED_ID_PREFIX + secrets.token_urlsafe(12)
        self._programs[program_id] = _Program()
        return program_id

    @staticmethod
    def _name(source: str, value: str) -> str:
        shown = "".join(ch if ch.isprintable() else "?" for ch in value[:_NAME_VALUE_CHARS])
        return f"{source}={shown}" + ("..." if len(value) > _NAME_VALUE_CHARS else "")


def _key(owner: str, source: str, value: str) -> bytes:
    """What a value is looked up under: the owner's, per source, a fixed size."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (owner, source, value):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.digest()


def _conversation(path: str, body: Mapping[str, Any]) -> list[Any] | None:
    """The items a call's prompt is made of: chat messages, or response input
    items (an input given as one string is one item)."""
    if path == CHAT_COMPLETIONS_PATH:
        items = body.get("messages")
    elif path == RESPONSES_PATH:
        items = body.get("input")
        if isinstance(items, str):
            return [items]
    else:
        return None
    return items if isinstance(items, list) else None


class _Prefixes:
    """The keys of the prefixes of one call's items, each item fingerprinted once."""

    def __init__(self, owner: str, items: list[Any]) -> None:
        self.owner = owner.encode("utf-8", "surrogatepass")
        self.items = items
        self._fingerprints: dict[int, bytes] = {}

    def fingerprint(self, index: int) -> bytes:
        found = self._fingerprints.get(index)
        if found is None:
            found = self._fingerprints[index] = _fingerprint(self.items[index])
        return found

    def key(self, length: int) -> bytes:
        """The key of the first ``length`` items (see the module)."""
        digest = hashlib.blake2b(self.owner, digest_size=16)
        digest.update(length.to_bytes(8, "little"))
        for index in sorted({0, 1, length - 2, length - 1}):
            if 0 <= index < length:
                digest.update(self.fingerprint(index))
                digest.update(b"\x1e")
        return digest.digest()


def _is_reply(item: Any) -> bool:
    if not isinstance(item, Mapping):
        return False
    return item.get("role") in _MODEL_ROLES or item.get("type") in _MODEL_ITEM_TYPES


def _fingerprint(item: Any) -> bytes:
    """Bytes that tell one item from another (see the module): its fields without
    null or empty ones, sorted, long strings by length and ends, walked without
    recursion and up to :data:`_MAX_FINGERPRINT_NODES` values."""
    out: list[str] = []
    pending: list[Any] = [item]
    for _ in range(_MAX_FINGERPRINT_NODES):
        if not pending:
            break
        value = pending.pop()
        if isinstance(value, str):
            if len(value) <= 2 * STRING_ENDS:
                out.append(f"s{len(value)}:{value}")
            else:
                out.append(f"s{len(value)}:{value[:STRING_ENDS]}|{value[-STRING_ENDS:]}")
        elif isinstance(value, Mapping):
            out.append("{")
            for name in sorted(value, reverse=True):  # popped back in order
                inner = value[name]
                if inner is None or inner == "" or inner == [] or inner == {}:
                    continue
                pending.append(inner)
                pending.append(f"k{name}")
        elif isinstance(value, list):
            out.append(f"[{len(value)}")
            pending.extend(reversed(value))
        else:
            out.append(repr(value))
    return "\x1f".join(out).encode("utf-8", "surrogatepass")
