"""A program's timeline: where the time of each of its calls went, and the
program's own time between them.

When an agent is slow, its owner asks whether it waited for the engine,
computed, or spent the time in its own tools. The router sees each call
arrive and its answer leave (:class:`CallSpan`); the engine's final answer says
how long the call waited in the engine's queue, its prefill and its decode, and
how many of its prompt tokens the prefix cache served
(:class:`~autellix_vllm.router.usage.CallReport`). :func:`timeline` lays them
out in order of arrival, with:

* per call, ``other_s``: its time at the router not spent in the engine's
  queue, prefill or decode (the router, the network, the engine's API server
  tokenizing and detokenizing); None if the engine reported no timings;
* per call, ``gap_after_s``: the program's own time after it, while none of
  its calls was in flight, until its next call arrived (its tools, its code,
  its client's network);
* in total: ``latency_s`` (the first call's arrival to the last one's end),
  split into ``in_calls_s`` (some call in flight) and ``own_time_s`` (none).

The router keeps each program's newest :data:`TIMELINE_CALLS_KEPT` calls, as
long as it keeps the program. :func:`chrome_trace` writes a timeline in the
Trace Event Format that Perfetto and ``chrome://tracing`` open.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from autellix_vllm.router.usage import CallReport

# Calls kept per program for its timeline (the newest; older ones are counted).
TIMELINE_CALLS_KEPT = 64
# The engine's parts of a call, in the order they happen.
ENGINE_PARTS = ("queue_s", "prefill_s", "decode_s")
# A call's fields a trace event carries as its arguments.
CALL_ARGS = (
    "engine",
    "completed",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "other_s",
)


@dataclass(frozen=True, slots=True)
class CallSpan:
    """One finished call of a program, as the router saw it."""

    call_id: str | None
    thread_id: str | None
    engine: str | None  # the engine that answered (None: none did)
    arrived_s: float  # the router's clock (seconds since the epoch)
    finished_s: float
    completed: bool
    report: CallReport


def new_spans() -> deque[CallSpan]:
    """A program's span list, bounded to its newest :data:`TIMELINE_CALLS_KEPT` calls."""
    return deque(maxlen=TIMELINE_CALLS_KEPT)


def timeline(spans: list[CallSpan], calls_finished: int) -> dict[str, Any]:
    """Plain data for the timeline endpoint: ``calls`` (one row per span, by
    arrival), the totals, and ``calls_dropped`` (of ``calls_finished``, the
    older calls no longer kept)."""
    ordered = sorted(spans, key=lambda span: span.arrived_s)
    rows = [_row(span, ordered[0].arrived_s) for span in ordered]
    own_time = 0.0
    busy_until = float("-inf")
    last_to_end: dict[str, Any] | None = None  # the row of the call that ended last so far
    for span, row in zip(ordered, rows, strict=True):
        if last_to_end is not None and span.arrived_s > busy_until:
            gap = span.arrived_s - busy_until
            last_to_end["gap_after_s"] = gap
            own_time += gap
        if span.finished_s > busy_until:
            busy_until, last_to_end = span.finished_s, row
    latency = busy_until - ordered[0].arrived_s if ordered else 0.0
    totals = {part: sum(row[part] or 0.0 for row in rows) for part in (*ENGINE_PARTS, "other_s")}
    return {
        "calls": rows,
        "calls_dropped": max(0, calls_finished - len(rows)),
        "latency_s": latency,
        "in_calls_s": latency - own_time,
        "own_time_s": own_time,
        **totals,
        "prompt_tokens": sum(row["prompt_tokens"] or 0 for row in rows),
        "cached_tokens": sum(row["cached_tokens"] or 0 for row in rows),
        "completion_tokens": sum(row["completion_tokens"] or 0 for row in rows),
    }


def _row(span: CallSpan, origin_s: float) -> dict[str, Any]:
    report = span.report
    duration = span.finished_s - span.arrived_s
    parts = [report.queue_s, report.prefill_s, report.decode_s]
    other = None if None in parts else duration - sum(p for p in parts if p is not None)
    return {
        "call_id": span.call_id,
        "thread_id": span.thread_id,
        "engine": span.engine,
        "completed": span.completed,
        "arrived_s": span.arrived_s,
        "start_s": span.arrived_s - origin_s,
        "duration_s": duration,
        "queue_s": report.queue_s,
        "prefill_s": report.prefill_s,
        "decode_s": report.decode_s,
        "other_s": other,
        "prompt_tokens": report.prompt_tokens,
        "cached_tokens": report.cached_tokens,
        "completion_tokens": report.completion_tokens,
        "gap_after_s": None,  # set above for the call after which the program ran alone
    }


def chrome_trace(program_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a :func:`timeline`) in the Trace Event Format: one track per
    thread, each call a complete event (``ph: "X"``, microseconds from the
    first call) with its queue, prefill and decode nested in it from its start
    (the rest of the call, ``other_s``, follows them), and the program's own
    time on a track of its own."""
    threads: dict[str, int] = {}
    events: list[dict[str, Any]] = [_metadata("process_name", 0, f"program {program_id}")]
    own_track = 0
    events.append(_metadata("thread_name", own_track, "program's own time"))
    for row in data["calls"]:
        thread = row["thread_id"] or "-"
        if thread not in threads:
            threads[thread] = len(threads) + 1
            events.append(_metadata("thread_name", threads[thread], f"thread {thread}"))
        track = threads[thread]
        start = row["start_s"]
        name = row["call_id"] or "call"
        args = {key: row[key] for key in CALL_ARGS}
        events.append(_complete(name, "call", start, row["duration_s"], track, args))
        for part in ENGINE_PARTS:
            if row[part] is not None:
                events.append(_complete(part.removesuffix("_s"), "engine", start, row[part], track))
                start += row[part]
        if row["gap_after_s"]:
            end = row["start_s"] + row["duration_s"]
            events.append(_complete("own time", "program", end, row["gap_after_s"], own_track))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _complete(
    name: str, category: str, start_s: float, duration_s: float, track: int, args: Any = None
) -> dict[str, Any]:
    event = {
        "name": name,
        "cat": category,
        "ph": "X",
        "ts": round(start_s * 1e6, 3),
        "dur": round(duration_s * 1e6, 3),
        "pid": 1,
        "tid": track,
    }
    if args:
        event["args"] = args
    return event


def _metadata(kind: str, track: int, name: str) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": 1, "tid": track, "args": {"name": name}}
