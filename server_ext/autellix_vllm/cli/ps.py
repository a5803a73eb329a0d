"""``autellix ps`` and ``autellix top``: the router's process table in a terminal.

    autellix ps                                  # one listing, oldest program first
    autellix ps --all                            # and the programs that ended last
    autellix top                                 # refreshed every second, most service first
    autellix ps --url http://127.0.0.1:8000 --api-key KEY --json
    autellix ps PROGRAM                          # where one program's time went
    autellix ps PROGRAM --chrome-trace t.json    # the same for Perfetto
    autellix ps PROGRAM --plot t.png             # the same as a picture

Columns: PROGRAM (id), NAME, CLASS (its priority class: the band its latest
call ran in, ``interactive``, ``batch`` or a band's number), ENGINE (the
engine the program is bound to, else
the engines its calls ran on, with ``*`` after them: short prompts bind to no
engine; ``!`` marks an engine out of rotation), THR (threads), RUN (calls in
flight), CALLS (completed), SERVICE (token equivalents over all engines), WAIT
(how long its calls waited in the engines' queues, in engine steps, summed
over engines), AGE, OWNER (the name of the key that opened it); for ended
programs, AGE is how long the program lived and ENDED how long ago it ended.
Then a line per key (the caller's own; every key for the admin key): its
CLASS (the keys file's), WEIGHT, SERVICE (over all its programs since the
router started), SHARE (service over weight: what the engines balance
between keys inside a band) and its PROGRAMS in the table.
docs/glossary.md explains binding, service and waiting.
``--url`` and ``--api-key`` default to $AUTELLIX_URL and $AUTELLIX_API_KEY.

``autellix ps PROGRAM`` prints the program's timeline (its newest 64 calls,
while the router keeps the program or its final row): per call, when it arrived, its
thread, how long it waited in the engine's queue (QUEUE), its PREFILL and
DECODE, the rest of its time at the router (OTHER: the router, the network,
the engine's API server), its prompt tokens, those the prefix cache served,
its generated tokens, and GAP, the program's own time after it (no call in
flight) until its next call; then a waterfall, one line per call. ``-`` where
the engine did not say (an engine started without
``--enable-per-request-metrics``; cached tokens need
``--enable-prompt-tokens-details``). ``--chrome-trace FILE`` writes it in the
Trace Event Format, which https://ui.perfetto.dev and chrome://tracing open;
``--plot FILE`` draws the waterfall to a PNG (matplotlib, the ``sim`` extra).

The router lists a key's own programs (the admin key's: all), a page at a
time; both commands read the pages in turn, up to ``--max-programs`` programs
(``ps``: all; ``top``: 1000 a frame). The router keeps the final rows of the
last 100 programs each key ended (``ps --all``), so a program of a few seconds
can be looked at after it ended. ``top`` keeps running while the router is
down or restarting, with a line that says so. Text from the router is printed
with anything a terminal would act on (control characters, escapes) escaped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from autellix_vllm.cli import UsageError
from autellix_vllm.cli._arguments import HelpFormatter
from autellix_vllm.router.admin_client import (
    DEFAULT_URL,
    AdminClientError,
    RouterUnavailable,
    fetch_ended,
    fetch_table,
    fetch_timeline,
)
from autellix_vllm.router.timeline import chrome_trace

CLEAR_SCREEN = "\x1b[H\x1b[2J"
TOP_MAX_PROGRAMS = 1000
WATERFALL_WIDTH = 60  # characters for the program's whole latency


def add_parser(subparsers: argparse._SubParsersAction, name: str) -> None:
    live = name == "top"
    parser = subparsers.add_parser(
        name,
        help="show the router's programs, refreshed live" if live else "list the router's programs",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("AUTELLIX_URL", DEFAULT_URL),
        help=f"the router's URL, as autellix serve prints it (default: $AUTELLIX_URL, else"
        f" {DEFAULT_URL})",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("AUTELLIX_API_KEY"),
        help="a client key of the router, or its admin key to see every program"
        " (default: $AUTELLIX_API_KEY; none for a router without keys)",
    )
    parser.add_argument(
        "--max-programs",
        type=int,
        default=TOP_MAX_PROGRAMS if live else None,
        help=f"read at most this many programs (default: ps all, top {TOP_MAX_PROGRAMS})",
    )
    if live:
        parser.add_argument(
            "--interval", type=float, default=1.0, help="seconds between frames (and retries)"
        )
        parser.add_argument(
            "--iterations", type=int, help="stop after this many frames (default: until Ctrl-C)"
        )
        parser.set_defaults(func=run_top)
    else:
        parser.add_argument(
            "--all",
            action="store_true",
            help="also list the programs that ended last, newest first",
        )
        parser.add_argument("--json", action="store_true", help="print the raw table as JSON")
        parser.add_argument(
            "program",
            nargs="?",
            help="a program id: print where its time went (its timeline) instead of the table",
        )
        parser.add_argument(
            "--chrome-trace",
            metavar="FILE",
            help="with PROGRAM: also write its timeline to FILE in the Trace Event Format, for"
            " Perfetto (default: no file)",
        )
        parser.add_argument(
            "--plot",
            metavar="PNG",
            help="with PROGRAM: also draw its timeline as a waterfall to this PNG (needs the"
            " sim extra) (default: no file)",
        )
        parser.set_defaults(func=run_ps)


def run_ps(args: argparse.Namespace) -> int:
    if args.program is not None:
        return run_timeline(args)
    for option, value in (("--chrome-trace", args.chrome_trace), ("--plot", args.plot)):
        if value is not None:
            raise UsageError(f"{option} needs a PROGRAM: autellix ps PROGRAM {option} FILE")
    try:
        table = fetch_table(args.url, args.api_key, max_programs=_max_programs(args))
        ended = fetch_ended(args.url, args.api_key) if args.all else None
    except AdminClientError as error:
        raise UsageError(str(error)) from None
    if args.json:
        if ended is not None:
            table["ended_programs"] = ended["programs"]
        print(json.dumps(table, indent=2))
        return 0
    print(format_table(table, sort_by="age"))
    if table.get("keys"):
        print()
        print(format_keys(table["keys"]))
    if ended is not None:
        print()
        print(format_ended(ended))
    return 0


def run_timeline(args: argparse.Namespace) -> int:
    if args.all:
        raise UsageError("--all lists programs; it does not go with a PROGRAM")
    if args.plot is not None:
        import matplotlib  # noqa: F401  (missing: one line before asking the router)
    try:
        timeline = fetch_timeline(args.url, args.api_key, args.program)
    except AdminClientError as error:
        raise UsageError(str(error)) from None
    write_timeline_files(args.program, timeline, args.chrome_trace, args.plot)
    if args.json:
        print(json.dumps(timeline, indent=2))
    else:
        print(format_timeline(timeline))
    return 0


def write_timeline_files(
    program_id: str, timeline: dict[str, Any], chrome_trace_path: str | None, plot_path: str | None
) -> None:
    """Write ``timeline`` to ``chrome_trace_path`` (Trace Event Format) and draw it to
    ``plot_path`` (PNG), each if given; one line on stderr per file written."""
    try:
        if chrome_trace_path is not None:
            with open(chrome_trace_path, "w") as out:
                json.dump(chrome_trace(program_id, timeline), out)
            print(f"wrote {chrome_trace_path}: open it in https://ui.perfetto.dev", file=sys.stderr)
        if plot_path is not None:
            from autellix_vllm.plots import save_timeline

            save_timeline(plot_path, f"program {program_id}", timeline)
            print(f"wrote {plot_path}", file=sys.stderr)
    except OSError as error:
        raise UsageError(f"cannot write {error.filename}: {error.strerror}") from None


def run_top(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise UsageError("--interval must be positive")
    max_programs = _max_programs(args)
    frames = 0
    down_since: str | None = None
    while args.iterations is None or frames < args.iterations:
        stamp = time.strftime("%H:%M:%S")
        try:
            table = fetch_table(args.url, args.api_key, max_programs=max_programs)
            shown = format_table(table, sort_by="service")
            down_since = None
        except RouterUnavailable as error:
            down_since = down_since or stamp
            shown = f"{error} (since {down_since}); trying again every {args.interval:g} s"
        except AdminClientError as error:
            raise UsageError(str(error)) from None
        sys.stdout.write(f"{CLEAR_SCREEN}autellix top - {stamp} - {args.url}\n{shown}\n")
        sys.stdout.flush()
        frames += 1
        if args.iterations is None or frames < args.iterations:
            time.sleep(args.interval)
    return 0


def _max_programs(args: argparse.Namespace) -> int | None:
    if args.max_programs is not None and args.max_programs < 1:
        raise UsageError("--max-programs must be at least 1")
    return args.max_programs


# ---- formatting ----------------------------------------------------------------------


def format_table(table: dict[str, Any], sort_by: str = "age") -> str:
    """The live table: a summary line (programs, balancer, engines), then a row per
    program, oldest first (``sort_by="age"``) or most service first (``"service"``)."""
    engines = table.get("engines", [])
    down = {e["name"] for e in engines if not e.get("healthy")}
    programs = list(table.get("programs", []))
    if sort_by == "service":
        programs.sort(key=lambda p: -p.get("service", 0.0))
    else:
        programs.sort(key=lambda p: -p.get("age_s", 0.0))
    summary = "  ".join(
        f"{printable(e['name'])} {'up' if e.get('healthy') else 'DOWN'} load {e.get('load', 0)}"
        for e in engines
    )
    header = ("PROGRAM", "NAME", "CLASS", "ENGINE", "THR", "RUN", "CALLS", "SERVICE", "WAIT",
              "AGE", "OWNER")  # fmt: skip
    rows: list[tuple[str, ...]] = [header]
    for p in programs:
        rows.append((*_program_cells(p, down), printable(p.get("owner") or "-")))
    total = table.get("total", len(programs))
    shown = "" if total == len(programs) else f" (showing {len(programs)})"
    balancer = printable(str(table.get("balancer", "?")))
    return _lines(f"{total} programs{shown}  {balancer}  {summary}", rows)


def format_ended(ended: dict[str, Any]) -> str:
    """The programs that ended last (``fetch_ended``), newest first: AGE is how long
    each lived, ENDED how long ago it ended."""
    programs = ended.get("programs", [])
    header = ("PROGRAM", "NAME", "CLASS", "ENGINE", "THR", "RUN", "CALLS", "SERVICE", "WAIT",
              "AGE", "ENDED", "OWNER")  # fmt: skip
    rows: list[tuple[str, ...]] = [header]
    for p in programs:
        ago = f"{human_duration(p.get('ended_ago_s', 0.0))} ago"
        rows.append((*_program_cells(p, set()), ago, printable(p.get("owner") or "-")))
    total = ended.get("total", len(programs))
    shown = "" if total == len(programs) else f" (showing {len(programs)})"
    return _lines(f"{total} ended programs{shown}, the last ended first", rows)


def format_keys(keys: list[dict[str, Any]]) -> str:
    """The keys' accounts (the listing's ``keys``), by name: each key's class,
    weight, service, share (service over weight) and programs in the table."""
    rows: list[tuple[str, ...]] = [("KEY", "CLASS", "WEIGHT", "SERVICE", "SHARE", "PROGRAMS")]
    for k in keys:
        rows.append((
            printable(k.get("name") or "-"),
            printable(str(k.get("class", "-"))),
            f"{k.get('weight', 1.0):g}",
            f"{k.get('service', 0.0):.1f}",
            f"{k.get('share', 0.0):.1f}",
            str(k.get("programs", 0)),
        ))  # fmt: skip
    return _lines("keys (a share is service / weight)", rows)


def format_timeline(timeline: dict[str, Any]) -> str:
    """A program's timeline (``fetch_timeline``): a summary line, a row per call
    in order of arrival, and a waterfall (``q`` queue, ``p`` prefill, ``d``
    decode, ``=`` the rest of the call, ``#`` a call the engine gave no timings
    for, ``.`` the program's own time after it)."""
    calls = timeline.get("calls", [])
    name = timeline.get("name")
    title = printable(timeline.get("program_id", "?")) + (f" ({printable(name)})" if name else "")
    dropped = timeline.get("calls_dropped", 0)
    older = f", {dropped} older not kept" if dropped else ""
    active = timeline.get("calls_active", 0)
    running = f", {active} in flight" if active else ""
    summary = (
        f"{title}: {len(calls)} calls{older}{running} in {_seconds(timeline.get('latency_s'))}:"
        f" in calls {_seconds(timeline.get('in_calls_s'))} (queue"
        f" {_seconds(timeline.get('queue_s'))}, prefill {_seconds(timeline.get('prefill_s'))},"
        f" decode {_seconds(timeline.get('decode_s'))}, other {_seconds(timeline.get('other_s'))}),"
        f" own time {_seconds(timeline.get('own_time_s'))}; prompt tokens"
        f" {timeline.get('prompt_tokens', 0)}, {timeline.get('cached_tokens', 0)} from the cache"
    )
    header = ("START", "THREAD", "CALL", "ENGINE", "QUEUE", "PREFILL", "DECODE", "OTHER",
              "PROMPT", "CACHED", "OUT", "GAP")  # fmt: skip
    rows: list[tuple[str, ...]] = [header]
    for call in calls:
        rows.append((
            _seconds(call["start_s"]),
            printable(call.get("thread_id") or "-"),
            printable(call.get("call_id") or "-"),
            printable(call.get("engine") or "-") + ("" if call.get("completed") else "!"),
            *(_seconds(call.get(part)) for part in ("queue_s", "prefill_s", "decode_s",
                                                      "other_s")),
            *(_count(call.get(part)) for part in ("prompt_tokens", "cached_tokens",
                                                  "completion_tokens")),
            _seconds(call.get("gap_after_s")),
        ))  # fmt: skip
    table = _lines(summary, rows)
    bars = [_waterfall(call, timeline.get("latency_s") or 0.0) for call in calls]
    return table + ("\n\n" + "\n".join(bars) if bars else "")


def _waterfall(call: dict[str, Any], latency_s: float) -> str:
    """One call's line of the waterfall, ``WATERFALL_WIDTH`` characters for ``latency_s``."""
    scale = WATERFALL_WIDTH / latency_s if latency_s > 0 else 0.0
    phases = [(call.get(p), mark) for p, mark in (("queue_s", "q"), ("prefill_s", "p"),
                                                  ("decode_s", "d"), ("other_s", "="))]  # fmt: skip
    parts = [(seconds, mark) for seconds, mark in phases if seconds is not None]
    if len(parts) < len(phases):  # a phase without timings: the call as one
        parts = [(call["duration_s"], "#")]
    parts.append((call.get("gap_after_s") or 0.0, "."))
    bar = " " * round(call["start_s"] * scale)
    for seconds, mark in parts:
        bar += mark * (round(seconds * scale) or (1 if seconds else 0))
    label = printable(call.get("call_id") or call.get("thread_id") or "-")
    return f"{bar.ljust(WATERFALL_WIDTH)}  {label}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _program_cells(p: dict[str, Any], down: set[str]) -> tuple[str, ...]:
    """A program's cells from PROGRAM to AGE; ``down``: engines out of rotation."""
    return (
        printable(p["program_id"]),
        printable(p.get("name") or "-"),
        printable(str(p.get("class", "-"))),
        _engine_cell(p, down),
        str(p.get("threads", 0)),
        str(p.get("calls_active", 0)),
        str(p.get("calls_completed", 0)),
        f"{p.get('service', 0.0):.1f}",
        f"{p.get('waiting_time', 0.0):.1f}",
        human_duration(p.get("age_s", 0.0)),
    )


def _engine_cell(p: dict[str, Any], down: set[str]) -> str:
    """The ENGINE cell: the binding; else the engines its calls ran on, each with
    ``*`` (ran there, not bound); ``-`` before its first call. ``!``: out of rotation."""
    bound = p.get("engine")
    names = [bound] if bound else sorted(p.get("engines") or {})
    if not names:
        return "-"
    mark = "" if bound else "*"
    return ",".join(printable(n) + mark + ("!" if n in down else "") for n in names)


def _lines(title: str, rows: list[tuple[str, ...]]) -> str:
    """``title``, then ``rows`` (the first is the header) in aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [title.rstrip()]
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on (control characters,
    escapes, bidirectional marks) written as its Python escape."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)


def human_duration(seconds: float) -> str:
    seconds = int(max(0.0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
