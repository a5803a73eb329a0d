"""``autellix ps`` and ``autellix top``: the router's process table in a terminal.

    autellix ps                                  # one listing, oldest program first
    autellix top                                 # refreshed every second, most service first
    autellix ps --url http://127.0.0.1:8000 --api-key KEY --json

Columns: PROGRAM (id), NAME, ENGINE (its binding; ``!`` marks an engine out of
rotation), THR (threads), RUN (calls in flight), CALLS (completed), SERVICE
(token equivalents over all engines), WAIT (engine-reported waiting, summed
over engines), AGE, OWNER (the name of the key that opened it). ``--url`` and
``--api-key`` default to $AUTELLIX_URL and $AUTELLIX_API_KEY.

The router lists a key's own programs (the admin key's: all), a page at a
time; both commands read the pages in turn, up to ``--max-programs`` programs
(``ps``: all; ``top``: 1000 a frame). Text from the router is printed with
anything a terminal would act on (control characters, escapes) escaped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from autellix_vllm.cli import UsageError
from autellix_vllm.protocol import PROGRAMS_PATH

DEFAULT_URL = "http://127.0.0.1:8000"
CLEAR_SCREEN = "\x1b[H\x1b[2J"
PAGE_SIZE = 1000  # the router's largest page
TOP_MAX_PROGRAMS = 1000


def add_parser(subparsers: argparse._SubParsersAction, name: str) -> None:
    live = name == "top"
    parser = subparsers.add_parser(
        name,
        help="show the router's programs, refreshed live" if live else "list the router's programs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--url", default=os.environ.get("AUTELLIX_URL", DEFAULT_URL), help="the router's URL"
    )
    parser.add_argument("--api-key", default=os.environ.get("AUTELLIX_API_KEY"))
    parser.add_argument(
        "--max-programs",
        type=int,
        default=TOP_MAX_PROGRAMS if live else None,
        help=f"read at most this many programs (ps: all; top: {TOP_MAX_PROGRAMS})",
    )
    if live:
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
        parser.add_argument("--iterations", type=int, help="stop after this many frames")
        parser.set_defaults(func=run_top)
    else:
        parser.add_argument("--json", action="store_true", help="print the raw table as JSON")
        parser.set_defaults(func=run_ps)


def run_ps(args: argparse.Namespace) -> int:
    table = fetch_table(args.url, args.api_key, max_programs=_max_programs(args))
    if args.json:
        print(json.dumps(table, indent=2))
    else:
        print(format_table(table, sort_by="age"))
    return 0


def run_top(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise UsageError("--interval must be positive")
    frames = 0
    while args.iterations is None or frames < args.iterations:
        table = fetch_table(args.url, args.api_key, max_programs=_max_programs(args))
        stamp = time.strftime("%H:%M:%S")
        sys.stdout.write(f"{CLEAR_SCREEN}autellix top - {stamp} - {args.url}\n")
        sys.stdout.write(format_table(table, sort_by="service") + "\n")
        sys.stdout.flush()
        frames += 1
        if args.iterations is None or frames < args.iterations:
            time.sleep(args.interval)
    return 0


def _max_programs(args: argparse.Namespace) -> int | None:
    if args.max_programs is not None and args.max_programs < 1:
        raise UsageError("--max-programs must be at least 1")
    return args.max_programs


def fetch_table(
    url: str, api_key: str | None, timeout_s: float = 5.0, max_programs: int | None = None
) -> dict[str, Any]:
    """The router's table (``GET /autellix/v1/programs``), its pages read in turn
    up to ``max_programs`` programs (None: all)."""
    root = url.rstrip("/").removesuffix("/v1")
    table = _get_page(root, api_key, timeout_s, {"limit": PAGE_SIZE})
    programs = table["programs"] = list(table.get("programs", []))
    while table.get("next_after") is not None and (
        max_programs is None or len(programs) < max_programs
    ):
        page = _get_page(root, api_key, timeout_s, {"limit": PAGE_SIZE,
                                                   "after": table["next_after"]})  # fmt: skip
        programs.extend(page.get("programs", []))
        table["next_after"] = page.get("next_after")
    if max_programs is not None:
        del programs[max_programs:]
    return table


def _get_page(
    root: str, api_key: str | None, timeout_s: float, query: dict[str, Any]
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    address = f"{root}{PROGRAMS_PATH}?{urllib.parse.urlencode(query)}"
    request = urllib.request.Request(address, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as error:
        if error.code == 401:
            raise UsageError(
                "the router needs an API key: --api-key or $AUTELLIX_API_KEY"
            ) from None
        raise UsageError(f"{root}{PROGRAMS_PATH} answered {error.code}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise UsageError(f"cannot reach the router at {root}: {reason}") from None


def format_table(table: dict[str, Any], sort_by: str = "age") -> str:
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
    header = ("PROGRAM", "NAME", "ENGINE", "THR", "RUN", "CALLS", "SERVICE", "WAIT", "AGE",
              "OWNER")  # fmt: skip
    rows = [header]
    for p in programs:
        engine = printable(p.get("engine") or "-")
        if p.get("engine") in down:
            engine += "!"
        rows.append(
            (
                printable(p["program_id"]),
                printable(p.get("name") or "-"),
                engine,
                str(p.get("threads", 0)),
                str(p.get("calls_active", 0)),
                str(p.get("calls_completed", 0)),
                f"{p.get('service', 0.0):.1f}",
                f"{p.get('waiting_time', 0.0):.1f}",
                human_duration(p.get("age_s", 0.0)),
                printable(p.get("owner") or "-"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    total = table.get("total", len(programs))
    shown = "" if total == len(programs) else f" (showing {len(programs)})"
    balancer = printable(str(table.get("balancer", "?")))
    lines = [f"{total} programs{shown}  {balancer}  {summary}".rstrip()]
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
