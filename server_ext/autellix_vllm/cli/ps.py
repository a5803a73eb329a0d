"""``autellix ps`` and ``autellix top``: the router's process table in a terminal.

    autellix ps                                  # one listing, oldest program first
    autellix top                                 # refreshed every second, most service first
    autellix ps --url http://127.0.0.1:8000 --api-key KEY --json

Columns: PROGRAM (id), NAME, ENGINE (its binding; ``!`` marks an engine out of
rotation), THR (threads), RUN (calls in flight), CALLS (completed), SERVICE
(token equivalents over all engines), WAIT (engine-reported waiting, summed
over engines), AGE. ``--url`` and ``--api-key`` default to $AUTELLIX_URL and
$AUTELLIX_API_KEY.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from autellix_vllm.cli import UsageError
from autellix_vllm.protocol import PROGRAMS_PATH

DEFAULT_URL = "http://127.0.0.1:8000"
CLEAR_SCREEN = "\x1b[H\x1b[2J"


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
    if live:
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
        parser.add_argument("--iterations", type=int, help="stop after this many frames")
        parser.set_defaults(func=run_top)
    else:
        parser.add_argument("--json", action="store_true", help="print the raw table as JSON")
        parser.set_defaults(func=run_ps)


def run_ps(args: argparse.Namespace) -> int:
    table = fetch_table(args.url, args.api_key)
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
        table = fetch_table(args.url, args.api_key)
        stamp = time.strftime("%H:%M:%S")
        sys.stdout.write(f"{CLEAR_SCREEN}autellix top - {stamp} - {args.url}\n")
        sys.stdout.write(format_table(table, sort_by="service") + "\n")
        sys.stdout.flush()
        frames += 1
        if args.iterations is None or frames < args.iterations:
            time.sleep(args.interval)
    return 0


def fetch_table(url: str, api_key: str | None, timeout_s: float = 5.0) -> dict[str, Any]:
    root = url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(root + PROGRAMS_PATH, headers=headers)
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
        f"{e['name']} {'up' if e.get('healthy') else 'DOWN'} load {e.get('load', 0)}"
        for e in engines
    )
    header = ("PROGRAM", "NAME", "ENGINE", "THR", "RUN", "CALLS", "SERVICE", "WAIT", "AGE")
    rows = [header]
    for p in programs:
        engine = p.get("engine") or "-"
        if engine in down:
            engine += "!"
        rows.append(
            (
                p["program_id"],
                p.get("name") or "-",
                engine,
                str(p.get("threads", 0)),
                str(p.get("calls_active", 0)),
                str(p.get("calls_completed", 0)),
                f"{p.get('service', 0.0):.1f}",
                f"{p.get('waiting_time', 0.0):.1f}",
                human_duration(p.get("age_s", 0.0)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"{len(programs)} programs  {table.get('balancer', '?')}  {summary}".rstrip()]
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)


def human_duration(seconds: float) -> str:
    seconds = int(max(0.0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
