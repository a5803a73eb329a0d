"""What the example agents share: the endpoint, JSON replies, and the per-program report.

Each example is a command-line program that runs N agents, each its own
autellix program, against any OpenAI-compatible endpoint::

    python examples/react_agent.py --base-url http://127.0.0.1:8000/v1 --agents 4
    python examples/react_agent.py --base-url https://api.openai.com/v1 --model gpt-4o-mini \\
        --api-key $OPENAI_API_KEY

and ends with a table of its programs: calls, time in LLM calls and in tools,
the waiting time the server reports (an autellix router's
``GET /autellix/v1/programs``; ``-`` on other servers) and the answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import autellix
import openai
from autellix import AsyncOpenAI
from autellix._programs_api import programs_url
from autellix_vllm.cli._arguments import HelpFormatter

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
# Context assumed when the server does not say (vLLM lists max_model_len per model).
DEFAULT_CONTEXT_TOKENS = 8192


class ExampleError(Exception):
    """Ends the example with a one-line ``error: ...`` and exit code 1."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, but bad input gets one line (``prog: error: ...``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def example_parser(description: str) -> OneLineArgumentParser:
    """A parser with the endpoint flags every example takes; help shows defaults
    as the ``autellix`` commands do."""
    parser = OneLineArgumentParser(description=description, formatter_class=HelpFormatter)
    endpoint = parser.add_argument_group("endpoint (any OpenAI-compatible server)")
    # Not $OPENAI_BASE_URL or $OPENAI_API_KEY: a shell set up for a hosted API
    # would send the agents' calls (or its key) there without a word.
    endpoint.add_argument(
        "--base-url",
        default=DEFAULT_BASE_URL,
        help="the server's /v1 URL (default: autellix serve's router on this machine, %(default)s)",
    )
    endpoint.add_argument("--model", help="model name (default: the first the server lists)")
    endpoint.add_argument(
        "--api-key",
        default=os.environ.get("AUTELLIX_API_KEY") or "-",
        help='API key, e.g. "$OPENAI_API_KEY" for OpenAI (default: $AUTELLIX_API_KEY, else none)',
    )
    parser.add_argument(
        "--start-every", type=float, default=0.0, metavar="SECONDS",
        help="start the programs this far apart, in order (default: 0, all at once)",
    )  # fmt: skip
    parser.add_argument(
        "--seed", type=int,
        help="sample every reply with a seed derived from this and its prompt, so that"
        " a rerun makes the same calls (default: unseeded)",
    )  # fmt: skip
    parser.add_argument(
        "--json", type=Path, metavar="FILE", help="also write the reports here (default: none)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser


@dataclass
class Endpoint:
    """The model the agents talk to: one shared client, the model name, its context size."""

    client: AsyncOpenAI
    model: str
    context_tokens: int
    seed: int | None = None  # see prompt_seed
    _has_program_table: bool = True

    async def program_row(self) -> dict[str, Any] | None:
        """The server's process-table row of the current program, or None where the
        server keeps no table. Read it before the program ends: ended programs
        leave the table."""
        program_id = autellix.current_program()
        if program_id is None or not self._has_program_table:
            return None
        try:
            table = await self.client.get(programs_url(self.client), cast_to=object)
        except openai.NotFoundError:
            self._has_program_table = False  # a plain OpenAI-compatible server
            return None
        except openai.APIError:
            return None
        rows = table.get("programs", []) if isinstance(table, dict) else []
        return next((row for row in rows if row.get("program_id") == program_id), None)


async def connect(args: argparse.Namespace) -> Endpoint:
    """The endpoint named by ``--base-url/--model/--api-key``, checked with one
    ``GET /v1/models``; raises :class:`ExampleError` when it cannot be used."""
    # Created before any program starts: @program opens programs on this client.
    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, timeout=300.0)
    try:
        models = [model async for model in client.models.list()]
    except openai.AuthenticationError:
        raise ExampleError(f"{args.base_url} refused the API key (--api-key)") from None
    except openai.APIConnectionError:
        raise ExampleError(f"cannot reach {args.base_url} (--base-url)") from None
    except openai.APIStatusError as error:
        raise ExampleError(f"{args.base_url}/models answered {error.status_code}") from None
    by_name = {model.id: model for model in models}
    if args.model is None and not by_name:
        raise ExampleError(f"{args.base_url} lists no models; pass --model")
    name = args.model or models[0].id
    listed = by_name.get(name)
    context = (listed.model_extra or {}).get("max_model_len") if listed is not None else None
    context_tokens = int(context) if context else DEFAULT_CONTEXT_TOKENS
    return Endpoint(client, name, context_tokens, seed=args.seed)


@dataclass
class ProgramReport:
    """What one program did, filled in while it runs."""

    label: str
    program_id: str | None = None
    calls: int = 0
    threads: int = 1  # threads that made calls, as the program counted them
    llm_seconds: float = 0.0  # summed over calls (parallel calls overlap)
    tool_seconds: float = 0.0
    wall_seconds: float = 0.0
    answer: str = ""
    error: str | None = None
    columns: dict[str, str] = field(default_factory=dict)  # the example's own columns
    server: dict[str, Any] | None = None  # the server's table row, near the end

    @contextlib.contextmanager
    def timing_tool(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.tool_seconds += time.perf_counter() - start

    @property
    def waiting_time(self) -> float | None:
        return None if self.server is None else self.server.get("waiting_time")


@dataclass
class JsonReply:
    """A structured-output reply: the parsed object (None if unusable) and the raw text."""

    data: dict[str, Any] | None
    text: str
    finish_reason: str | None


def object_schema(**fields: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema for an object with exactly these fields, all required."""
    return {
        "type": "object",
        "properties": fields,
        "required": list(fields),
        "additionalProperties": False,
    }


def text_field(max_length: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": max_length}


def choice_field(options: Iterable[str]) -> dict[str, Any]:
    return {"type": "string", "enum": list(options)}


async def ask_json(
    endpoint: Endpoint,
    report: ProgramReport,
    messages: list[dict[str, str]],
    schema: dict[str, Any],
    *,
    schema_name: str,
    max_tokens: int,
    temperature: float,
    attempt: int = 0,
) -> JsonReply:
    """One chat call constrained to ``schema`` (``response_format`` json_schema).

    Non-strict, because OpenAI's strict mode refuses ``maxLength``; vLLM
    enforces the schema either way. The reply is parsed leniently and never
    raises for bad model output: a cut-off or malformed reply has ``data=None``.
    ``attempt`` counts the tries of the same prompt (it changes the seed).
    """
    seed = prompt_seed(endpoint.seed, messages, attempt)
    start = time.perf_counter()
    try:
        completion = await endpoint.client.chat.completions.create(
            model=endpoint.model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=temperature,
            seed=openai.NOT_GIVEN if seed is None else seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": schema_name, "schema": schema, "strict": False},
            },
        )
    finally:
        report.calls += 1
        report.llm_seconds += time.perf_counter() - start
    choice = completion.choices[0] if completion.choices else None
    text = (choice.message.content or "") if choice is not None else ""
    return JsonReply(parse_json_object(text), text, choice.finish_reason if choice else None)


def prompt_seed(seed: int | None, messages: list[dict[str, str]], attempt: int) -> int | None:
    """The sampling seed of one call: a function of the run's seed and the prompt,
    not of the order in which concurrent calls happen to be made, so that a rerun
    with the same seed makes the same calls (up to the server's numerics)."""
    if seed is None:
        return None
    text = json.dumps([seed, attempt, messages], sort_keys=True)
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in ``text`` (also inside code fences or prose), or None."""
    for candidate in (text, text[text.find("{") : text.rfind("}") + 1]):
        try:
            value = json.loads(candidate)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return None


async def run_programs(
    prefix: str,
    count: int,
    run_one: Callable[[int, ProgramReport], Awaitable[object]],
    start_every_s: float = 0.0,
) -> list[ProgramReport]:
    """Run ``run_one(i, report)`` for i in 0..count-1 concurrently, the i-th starting
    ``i * start_every_s`` seconds after the first (each call starts one program;
    its report is labelled ``prefix-(i+1)``, its wall time counts from its own
    start). A program that fails is reported with its error; the others keep going."""

    async def run(index: int) -> ProgramReport:
        report = ProgramReport(f"{prefix}-{index + 1}")
        await asyncio.sleep(index * start_every_s)
        start = time.perf_counter()
        try:
            await run_one(index, report)
        except Exception as error:  # one program's failure is its own row, not the run's
            report.error = one_line(error)
        report.wall_seconds = time.perf_counter() - start
        return report

    return list(await asyncio.gather(*(run(index) for index in range(count))))


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text}"[:200]


def shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def format_reports(reports: list[ProgramReport], answer_width: int = 48) -> str:
    """The per-program table. CALLS and THREADS are the server's counts where it
    reports them (the client's otherwise); WAIT is the server's waiting time."""
    extra = list(dict.fromkeys(name for report in reports for name in report.columns))
    header = ["PROGRAM", "ID", "CALLS", "THREADS", "LLM s", "TOOL ms", "WAIT", "WALL s", *extra]
    rows = [[*header, "ANSWER"]]
    for report in reports:
        server = report.server or {}
        wait = report.waiting_time
        rows.append(
            [
                report.label,
                shorten(report.program_id or "-", 14),
                str(server.get("calls_completed", report.calls)),
                str(server.get("threads", report.threads)),
                f"{report.llm_seconds:.1f}",
                f"{report.tool_seconds * 1000:.1f}",
                "-" if wait is None else f"{wait:.0f}",
                f"{report.wall_seconds:.1f}",
                *(report.columns.get(name, "-") for name in extra),
                shorten(f"error: {report.error}" if report.error else report.answer, answer_width),
            ]
        )
    # Every column padded to its widest cell, except the answer, which comes last.
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]])  # noqa: B905
             for row in rows]  # fmt: skip
    if any(report.server is not None for report in reports):
        lines.append(
            "WAIT: how long the program's calls waited in the engines' queues, in engine"
            " steps (the router's process table; docs/glossary.md)"
        )
    return "\n".join(line.rstrip() for line in lines)


def write_reports(path: Path, reports: list[ProgramReport]) -> None:
    path.write_text(json.dumps([asdict(report) for report in reports], indent=2) + "\n")


def run_example(
    parser: argparse.ArgumentParser,
    main: Callable[[argparse.Namespace, Endpoint], Awaitable[list[ProgramReport]]],
    check_args: Callable[[argparse.Namespace], None] = lambda args: None,
) -> int:
    """Parse the command line, connect, run ``main``, print the table; the exit code:
    0 if every program finished, 1 if one failed or the endpoint is unusable,
    2 for bad command-line input, 130 after Ctrl-C."""
    args = parser.parse_args()
    logging.basicConfig(format="%(message)s", stream=sys.stderr)
    logging.getLogger("examples").setLevel(logging.WARNING if args.quiet else logging.INFO)
    try:
        if args.start_every < 0:
            raise ExampleError("--start-every must be >= 0")
        check_args(args)
    except ExampleError as error:
        parser.error(str(error))
    # SIGTERM ends the run like Ctrl-C, so open programs are still ended on the server.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    async def connect_and_run() -> list[ProgramReport]:
        return await main(args, await connect(args))

    try:
        reports = asyncio.run(connect_and_run())
    except ExampleError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    print(format_reports(reports))
    if args.json is not None:
        write_reports(args.json, reports)
    return 1 if any(report.error for report in reports) else 0
