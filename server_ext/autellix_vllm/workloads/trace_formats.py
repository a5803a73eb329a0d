"""Trace formats people publish and record, read into the simulator's programs.

A trace file is in one of three formats, detected per file (:func:`detect_format`)
or named (``autellix simulate run --trace F --trace-format NAME``):

* ``autellix``: this project's own, one program a line (:mod:`.trace`).
* ``mooncake``: Mooncake's request trace (FAST'25), one request a line,
  ``{"timestamp": ms, "input_length": N, "output_length": M, "hash_ids": [...]}``,
  one hash id per 512-token block of the prompt, equal ids for equal prefixes.
* ``dynamo``: the agentic rows of NVIDIA Dynamo's agent-trace converter
  (``agent_trace_to_mooncake --agentic``), which aiperf also replays: Mooncake rows
  plus ``request_id``, ``session_id``, ``wait_for`` (the request ids a row waits
  for), ``delay`` (ms after they end, not counting tools) and ``tool_wait_ms``
  (ms of tool calls in between). aiperf's multi-turn files (``session_id`` and
  ``delay`` only) read as this format too.

Whatever the format, the result is the same :class:`ProgramSpec` and
:class:`CallSpec` objects, so the simulator cannot tell them apart. A request
becomes one call whose prompt is the request's whole input: the part it shares
with its context's earlier calls is what the simulator's prefix cache may hold.
Anything malformed is a :class:`TraceError` naming the file, line and problem.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .trace import (
    CallSpec,
    ProgramSpec,
    TraceError,
    programs_from_rows,
    read_rows,
    required_field,
)

AUTO = "auto"
MOONCAKE_BLOCK_TOKENS = 512
# Keys only Dynamo's rows have: a file where any row has one is read as Dynamo's.
_DYNAMO_KEYS = frozenset({"request_id", "session_id", "wait_for", "delay", "tool_wait_ms"})

Rows = list[tuple[str, Any]]  # (where: "file:line", the decoded line)


def import_trace(path: str | Path, trace_format: str = AUTO) -> list[ProgramSpec]:
    """Read a trace of any format in :data:`TRACE_FORMATS` (``auto``: detected)."""
    rows = read_rows(path)
    name = detect_format(rows) if trace_format == AUTO else trace_format
    if name not in TRACE_FORMATS:
        raise TraceError(f"unknown trace format {name!r}; known: {', '.join(TRACE_FORMATS)}")
    return TRACE_FORMATS[name](rows)


def detect_format(rows: Rows) -> str:
    """The format of a file's rows: a program with ``calls`` is the project's own; a
    request with ``input_length`` is Dynamo's if any row has a key only Dynamo's
    rows have, Mooncake's otherwise."""
    where, first = rows[0]
    if isinstance(first, dict) and "calls" in first:
        return "autellix"
    if isinstance(first, dict) and "input_length" in first:
        dynamo = any(isinstance(obj, dict) and _DYNAMO_KEYS & obj.keys() for _, obj in rows)
        return "dynamo" if dynamo else "mooncake"
    raise TraceError(
        f"{where}: not a row of a known trace format (a program has 'calls', a Mooncake"
        " or Dynamo request 'input_length'); name one with --trace-format"
    )


# ---- the rows' common fields ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Request:
    """One request row's Mooncake fields, checked."""

    timestamp_ms: float | None
    input_length: int
    decode_tokens: int
    hash_ids: tuple[int, ...]

    @property
    def full_blocks(self) -> tuple[int, ...]:
        """The ids of the prompt's full blocks. A trailing partial block's id is left
        out: the next turn fills that block, so its id there differs."""
        return self.hash_ids[: self.input_length // MOONCAKE_BLOCK_TOKENS]


def _request(obj: Any, where: str) -> _Request:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: a request must be a JSON object")
    input_length = required_field(obj, "input_length", int, where)
    output_length = required_field(obj, "output_length", int, where)
    if input_length < 0 or output_length < 0:
        raise TraceError(f"{where}: input_length and output_length must be >= 0")
    hash_ids = obj.get("hash_ids") or []
    if not isinstance(hash_ids, list) or any(
        isinstance(h, bool) or not isinstance(h, int) for h in hash_ids
    ):
        raise TraceError(f"{where}: 'hash_ids' must be a list of integers")
    return _Request(
        timestamp_ms=_milliseconds(obj, "timestamp", where),
        input_length=input_length,
        # A recorded empty output still sampled a token, as vLLM always does.
        decode_tokens=max(output_length, 1),
        hash_ids=tuple(hash_ids),
    )


def _milliseconds(obj: dict[str, Any], key: str, where: str) -> float | None:
    """``obj[key]`` as a number of ms >= 0; None where absent or null."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise TraceError(f"{where}: {key!r} must be a number of milliseconds >= 0")
    return float(value)


def _seconds_between(earlier_ms: float, later_ms: float) -> float:
    return max(later_ms - earlier_ms, 0.0) / 1000


# ---- Mooncake ------------------------------------------------------------------------


class _ConversationTails:
    """The last request of every open conversation, by its full blocks' hash ids: a
    trie that finds the one whose ids are the longest prefix of a new request's."""

    _END = None  # the key under which a node keeps the conversation ending there

    def __init__(self) -> None:
        self._root: dict[Any, Any] = {}

    def add(self, key: tuple[int, ...], conversation: int) -> None:
        node = self._root
        for block in key:
            node = node.setdefault(block, {})
        node[self._END] = conversation

    def remove(self, key: tuple[int, ...], conversation: int) -> None:
        node: dict[Any, Any] | None = self._root
        for block in key:
            node = node.get(block) if node is not None else None
        if node is not None and node.get(self._END) == conversation:
            del node[self._END]

    def longest_prefix_of(self, hash_ids: tuple[int, ...]) -> int | None:
        node = self._root
        found: int | None = None
        for block in hash_ids:
            child = node.get(block)
            if child is None:
                break
            node = child
            found = node.get(self._END, found)
        return found


def programs_from_mooncake(rows: Rows) -> list[ProgramSpec]:
    """Mooncake requests as conversations, one program each.

    Requests are taken in timestamp order. A request continues the open
    conversation whose last request's full blocks its ``hash_ids`` start with (the
    longest such); otherwise it starts a new conversation. Each conversation is a
    chain: one call a request, ``after`` the one before, its prompt the request's
    ``input_length`` in the program's one context.

    Arrival timestamps alone cannot tell how long the recorded engine took to
    answer, so the gap between a call and its predecessor (``tool_gap``) is the
    whole difference of their timestamps: the recorded service time plus the user's
    or tool's time. A replayed conversation is therefore closed-loop and never
    faster than it was recorded; a program arrives at its first request's
    timestamp.
    """
    timed: list[tuple[float, _Request]] = []
    for where, obj in rows:
        request = _request(obj, where)
        if request.timestamp_ms is None:
            raise TraceError(f"{where}: missing key 'timestamp'")
        timed.append((request.timestamp_ms, request))
    timed.sort(key=lambda pair: pair[0])  # stable: equal timestamps keep file order
    conversations: list[list[tuple[float, _Request]]] = []
    tails = _ConversationTails()
    for at_ms, request in timed:
        n = tails.longest_prefix_of(request.hash_ids)
        if n is None:
            n = len(conversations)
            conversations.append([])
        else:
            tails.remove(conversations[n][-1][1].full_blocks, n)
        conversations[n].append((at_ms, request))
        if request.full_blocks:
            tails.add(request.full_blocks, n)
    return [_conversation(f"c{n}", turns) for n, turns in enumerate(conversations)]


def _conversation(program_id: str, turns: list[tuple[float, _Request]]) -> ProgramSpec:
    """A chain of calls, one a request (``turns``: arrival ms and request, in order)."""
    calls = []
    for i, (at_ms, request) in enumerate(turns):
        calls.append(
            CallSpec(
                id=str(i),
                decode_tokens=request.decode_tokens,
                prompt_tokens=request.input_length,
                after=(str(i - 1),) if i else (),
                tool_gap=_seconds_between(turns[i - 1][0], at_ms) if i else 0.0,
            )
        )
    return ProgramSpec(program_id, turns[0][0] / 1000, tuple(calls), "mooncake")


# ---- Dynamo --------------------------------------------------------------------------


@dataclass(slots=True)
class _Turn:
    """One Dynamo row, placed: what it waits for and its session's previous turn."""

    request_id: str
    session: str
    request: _Request
    waits_for: list[int]  # indices of earlier turns
    gap_s: float
    prompt_tokens: int
    group: int  # its program, before programs merge (see _Groups)


class _Groups:
    """Union-find over turns: turns linked by ``wait_for`` are one program."""

    def __init__(self) -> None:
        self.parent: list[int] = []

    def new(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def find(self, g: int) -> int:
        while self.parent[g] != g:
            self.parent[g] = self.parent[self.parent[g]]
            g = self.parent[g]
        return g

    def join(self, groups: list[int]) -> int:
        root = self.find(groups[0])
        for g in groups[1:]:
            self.parent[self.find(g)] = root
        return root


def programs_from_dynamo(rows: Rows) -> list[ProgramSpec]:
    """Dynamo's agentic rows (and aiperf's multi-turn rows) as programs.

    A row waits for the requests its ``wait_for`` names, which must be earlier rows;
    without ``wait_for``, for its session's previous row, if any. Rows linked so are
    one program; a row that waits for nothing arrives at its ``timestamp``. A
    waiting row starts ``delay + tool_wait_ms`` after the last of those it waits for
    ends (Dynamo's own replay rule); with neither, the difference of the rows'
    timestamps (as for Mooncake), or at once where there are none.

    A session (``session_id``; without one, the row alone) is a thread: the
    program's first is ``main`` and keeps the program's context; every other one is
    a subagent's thread, named by its session, with a fresh context of its own and
    the thread it was spawned from (that of the first row it waits for) as parent.

    A row's prompt is its ``input_length`` where that repeats the session so far,
    as Dynamo's converter writes it: the row's ``hash_ids`` start with the same
    block as its session's previous row's. Otherwise (other hash ids, or none) the
    row carries only the turn's new tokens, as aiperf's multi-turn files do, and its
    prompt is the previous row's prompt and output plus those. Tool events beyond
    ``tool_wait_ms`` are not read.
    """
    turns: list[_Turn] = []
    index_of: dict[str, int] = {}
    last_of_session: dict[str, int] = {}
    groups = _Groups()
    for where, obj in rows:
        request = _request(obj, where)
        # A row without an id (aiperf's) is named by its line.
        request_id = _name(obj, "request_id", where) or f"line{where.rsplit(':', 1)[1]}"
        if request_id in index_of:
            raise TraceError(f"{where}: duplicate request_id {request_id!r}")
        session = _name(obj, "session_id", where) or request_id
        previous = last_of_session.get(session)
        waits_for = _waits_for(obj, where, index_of, previous)
        if waits_for:
            group = groups.join([turns[i].group for i in waits_for])
            gap_s = _wait_gap(obj, where, request, [turns[i].request for i in waits_for])
        elif request.timestamp_ms is None:
            raise TraceError(f"{where}: a request that waits for nothing needs a 'timestamp'")
        else:
            group, gap_s = groups.new(), 0.0
        prompt = request.input_length
        if previous is not None and not _repeats_history(request, turns[previous].request):
            before = turns[previous]
            prompt += before.prompt_tokens + before.request.decode_tokens
        index_of[request_id] = last_of_session[session] = len(turns)
        turns.append(_Turn(request_id, session, request, waits_for, gap_s, prompt, group))
    members: dict[int, list[_Turn]] = {}
    for turn in turns:
        members.setdefault(groups.find(turn.group), []).append(turn)
    programs = [_session_program(linked, turns) for linked in members.values()]
    return sorted(programs, key=lambda p: p.arrival)


def _session_program(members: list[_Turn], turns: list[_Turn]) -> ProgramSpec:
    """One program: ``members`` (linked turns, in file order) of all ``turns``."""
    main = members[0].session
    roots_ms = [t.request.timestamp_ms or 0.0 for t in members if not t.waits_for]
    arrival_ms = min(roots_ms)
    parent_of: dict[str, str | None] = {main: None}
    calls = []
    for turn in members:
        if turn.session not in parent_of:
            spawner = turns[turn.waits_for[0]] if turn.waits_for else None
            parent_of[turn.session] = None if spawner is None else _thread(spawner, main)
        calls.append(
            CallSpec(
                id=turn.request_id,
                decode_tokens=turn.request.decode_tokens,
                prompt_tokens=turn.prompt_tokens,
                thread=_thread(turn, main),
                parent_thread=parent_of[turn.session],
                after=tuple(turns[i].request_id for i in turn.waits_for),
                tool_gap=turn.gap_s
                if turn.waits_for
                else _seconds_between(arrival_ms, turn.request.timestamp_ms or 0.0),
                context=None if turn.session == main else turn.session,
            )
        )
    return ProgramSpec(main, arrival_ms / 1000, tuple(calls), "dynamo")


def _thread(turn: _Turn, main_session: str) -> str:
    """A turn's thread: ``main`` for the program's first session, else its session."""
    return "main" if turn.session == main_session else turn.session


def _name(obj: dict[str, Any], key: str, where: str) -> str | None:
    """An id field (a string or an integer) as a string; None where absent or null."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise TraceError(f"{where}: {key!r} must be a non-empty string or an integer")
    return str(value)


def _waits_for(
    obj: dict[str, Any], where: str, index_of: dict[str, int], previous: int | None
) -> list[int]:
    """The earlier turns a row waits for: its ``wait_for``, else its session's
    previous turn, else none."""
    names = obj.get("wait_for")
    if names is None:
        return [] if previous is None else [previous]
    if not isinstance(names, list):
        raise TraceError(f"{where}: 'wait_for' must be a list of request ids")
    waits_for: list[int] = []
    for name in names:
        if isinstance(name, bool) or not isinstance(name, str | int):
            raise TraceError(f"{where}: 'wait_for' must be a list of request ids")
        if str(name) not in index_of:
            raise TraceError(f"{where}: 'wait_for' names {name!r}, which is not an earlier row")
        if index_of[str(name)] not in waits_for:
            waits_for.append(index_of[str(name)])
    return waits_for


def _wait_gap(obj: dict[str, Any], where: str, request: _Request, waited: list[_Request]) -> float:
    """Seconds from the last awaited request's end to this one's start."""
    delay = _milliseconds(obj, "delay", where)
    tools = _milliseconds(obj, "tool_wait_ms", where)
    if delay is not None or tools is not None:
        return ((delay or 0.0) + (tools or 0.0)) / 1000
    stamps = [w.timestamp_ms for w in waited]
    if request.timestamp_ms is None or None in stamps:
        return 0.0
    return _seconds_between(max(s for s in stamps if s is not None), request.timestamp_ms)


def _repeats_history(request: _Request, previous: _Request) -> bool:
    """Whether a row's prompt repeats its session so far (its first block is the
    previous row's first), rather than carrying only the turn's new tokens."""
    return bool(request.hash_ids and previous.hash_ids) and (
        request.hash_ids[0] == previous.hash_ids[0]
    )


# Each format's reader: the rows of one file in, the programs out.
TRACE_FORMATS: dict[str, Callable[[Rows], list[ProgramSpec]]] = {
    "autellix": programs_from_rows,
    "mooncake": programs_from_mooncake,
    "dynamo": programs_from_dynamo,
}
