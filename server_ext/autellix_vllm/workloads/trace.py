"""Programs as the simulator replays them, and the JSONL trace format.

One program per line::

    {"program_id": "A", "arrival": 0.0, "calls": [
        {"id": "a1", "thread": "main", "parent_thread": null, "after": [],
         "prompt_tokens": 0, "decode_tokens": 4, "tool_gap": 0.0}, ...]}

A call starts ``tool_gap`` seconds after every call in ``after`` has completed
(an empty ``after`` means at the program's arrival), so chains, forks and joins
are all expressible. A call's prompt extends the program's one context (the
token sequence its prefix cache holds) unless it names another with
``"context"``, as a subagent with a fresh context of its own does. Extra keys are
allowed and ignored; an optional ``"owner"`` names who runs the program (the
router's key owner; without it, the anonymous owner), and an optional
``"priority"`` its class: ``"interactive"``, ``"batch"`` or a band's number
(:func:`~autellix_vllm.protocol.identity.validate_priority`; without it, the
owner's band, ``TenantConfig.bands``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..protocol.identity import IdentityError, validate_priority


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the line and the problem."""


@dataclass(frozen=True, slots=True)
class CallSpec:
    id: str
    decode_tokens: int
    prompt_tokens: int = 0
    thread: str = "main"
    parent_thread: str | None = None
    after: tuple[str, ...] = ()
    tool_gap: float = 0.0
    # Which of its program's contexts the prompt extends (None: the program's own).
    context: str | None = None


@dataclass(frozen=True, slots=True)
class ProgramSpec:
    program_id: str
    arrival: float
    calls: tuple[CallSpec, ...]
    kind: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    owner: str | None = None  # who runs it (None: the anonymous owner)
    priority: int | None = None  # its band (None: its owner's)

    @property
    def decode_tokens(self) -> int:
        return sum(c.decode_tokens for c in self.calls)

    @property
    def threads(self) -> int:
        return len({c.thread for c in self.calls})

    def to_json(self) -> str:
        out: dict[str, Any] = {
            "program_id": self.program_id,
            "arrival": self.arrival,
            "kind": self.kind,
            "calls": [_call_json(c) for c in self.calls],
        }
        if self.owner is not None:
            out["owner"] = self.owner
        if self.priority is not None:
            out["priority"] = self.priority
        return json.dumps(out)


def _call_json(call: CallSpec) -> dict[str, Any]:
    out = {
        "id": call.id,
        "thread": call.thread,
        "parent_thread": call.parent_thread,
        "after": list(call.after),
        "prompt_tokens": call.prompt_tokens,
        "decode_tokens": call.decode_tokens,
        "tool_gap": call.tool_gap,
    }
    if call.context is not None:
        out["context"] = call.context
    return out


def required_field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]``, which must be there and of ``kind`` (a bool is never a number)."""
    if key not in obj:
        raise TraceError(f"{where}: missing key {key!r}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TraceError(f"{where}: {key!r} has the wrong type ({type(value).__name__})")
    return value


def parse_program(obj: Any, where: str) -> ProgramSpec:
    """Validate one decoded trace line into a :class:`ProgramSpec`."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: a program must be a JSON object")
    pid = str(required_field(obj, "program_id", (str, int), where))
    arrival = float(required_field(obj, "arrival", (int, float), where))
    if arrival < 0:
        raise TraceError(f"{where}: arrival must be >= 0")
    raw_calls = required_field(obj, "calls", list, where)
    if not raw_calls:
        raise TraceError(f"{where}: program {pid!r} has no calls")
    calls: list[CallSpec] = []
    seen: set[str] = set()
    for n, raw in enumerate(raw_calls):
        at = f"{where}, call {n}"
        if not isinstance(raw, dict):
            raise TraceError(f"{at}: a call must be a JSON object")
        cid = str(required_field(raw, "id", (str, int), at))
        if cid in seen:
            raise TraceError(f"{at}: duplicate call id {cid!r}")
        after = tuple(str(a) for a in raw.get("after", []) or [])
        for dep in after:
            if dep not in seen:
                raise TraceError(f"{at}: 'after' names {dep!r}, which is not an earlier call")
        decode = required_field(raw, "decode_tokens", int, at)
        prompt = raw.get("prompt_tokens", 0)
        gap = raw.get("tool_gap", 0.0)
        if decode < 1:
            raise TraceError(f"{at}: decode_tokens must be >= 1")
        if isinstance(prompt, bool) or not isinstance(prompt, int) or prompt < 0:
            raise TraceError(f"{at}: prompt_tokens must be an integer >= 0")
        if isinstance(gap, bool) or not isinstance(gap, int | float) or gap < 0:
            raise TraceError(f"{at}: tool_gap must be a number >= 0")
        parent = raw.get("parent_thread")
        context = raw.get("context")
        if context is not None and not isinstance(context, str):
            raise TraceError(f"{at}: 'context' must be a string")
        calls.append(
            CallSpec(
                id=cid,
                decode_tokens=decode,
                prompt_tokens=prompt,
                thread=str(raw.get("thread") or "main"),
                parent_thread=None if parent is None else str(parent),
                after=after,
                tool_gap=float(gap),
                context=context,
            )
        )
        seen.add(cid)
    owner = obj.get("owner")
    if owner is not None and (not isinstance(owner, str) or not owner):
        raise TraceError(f"{where}: 'owner' must be a non-empty string")
    priority = obj.get("priority")
    if priority is not None:
        try:
            priority = validate_priority(priority, "priority")
        except IdentityError as error:
            raise TraceError(f"{where}: {error}") from None
    return ProgramSpec(
        pid, arrival, tuple(calls), kind=str(obj.get("kind", "")), owner=owner, priority=priority
    )


def read_rows(path: str | Path) -> list[tuple[str, Any]]:
    """The decoded JSON lines of a trace file, each with where it is (``file:line``);
    blank lines are skipped. Every trace format (``trace_formats``) reads through it."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None
    rows: list[tuple[str, Any]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rows.append((where, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not valid JSON ({exc.msg})") from None
    if not rows:
        raise TraceError(f"{path}: the trace is empty")
    return rows


def programs_from_rows(rows: list[tuple[str, Any]]) -> list[ProgramSpec]:
    """Programs of this module's format, one a row; program ids must be unique."""
    programs: list[ProgramSpec] = []
    ids: set[str] = set()
    for where, obj in rows:
        program = parse_program(obj, where)
        if program.program_id in ids:
            raise TraceError(f"{where}: duplicate program_id {program.program_id!r}")
        ids.add(program.program_id)
        programs.append(program)
    return programs


def load_trace(path: str | Path) -> list[ProgramSpec]:
    """Read a JSONL trace of this module's format; anything malformed is a TraceError.
    ``trace_formats.import_trace`` also reads Mooncake and Dynamo traces."""
    return programs_from_rows(read_rows(path))


def write_trace(programs: Iterable[ProgramSpec], path: str | Path) -> None:
    Path(path).write_text("".join(p.to_json() + "\n" for p in programs))
