"""``make demo``: ReAct agents and MCTS searches at once on ``autellix serve``.

    python examples/demo.py                                    # 8 ReAct + 2 MCTS, 1 engine
    python examples/demo.py --engines 2 --react-agents 16 --mcts-programs 4
    python examples/demo.py --upstream http://127.0.0.1:8001   # a running engine, router only

1. starts ``autellix serve`` on the embedded tiny model (free loopback port,
   engine logs in a temporary folder) and waits until it is ready;
2. runs ``react_agent.py`` and ``mcts_agent.py`` against it at the same time,
   printing ``autellix ps`` every few seconds while they run;
3. prints a table of the programs of each;
4. stops every process it started: the agents, the router and the engines,
   also on Ctrl-C, SIGTERM or an error.

Exit code 0 when every program finished (the temporary folder is then
removed; otherwise its logs are kept and named), 130 after Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from _common import OneLineArgumentParser, ProgramReport, format_reports, positive_int

EXAMPLES = Path(__file__).resolve().parent
AUTELLIX = [sys.executable, "-m", "autellix_vllm"]
# The random-weight model fills every JSON field it may; without free whitespace
# between the fields its structured replies are about a third shorter.
COMPACT_JSON = [
    "--structured-outputs-config",
    '{"backend": "xgrammar", "disable_any_whitespace": true}',
]
STOP_GRACE_S = 60.0  # serve itself gives each engine 20 s before SIGKILL
FIRST_PS_AFTER_S = 3.0  # by then every program has opened and made its first calls


class ServeError(RuntimeError):
    """``autellix serve`` exited before it was ready."""


@dataclass
class Serve:
    """One ``autellix serve`` process, started in its own session; the engines it
    starts run in process groups of their own, whose ids it prints."""

    process: subprocess.Popen[str]
    url: str = ""
    engine_pids: list[int] = field(default_factory=list)
    output: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, *options: str) -> Serve:
        command = [*AUTELLIX, "serve", "--port", "0", *options]
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # Ctrl-C reaches us; we stop it in order
        )
        return cls(process)

    def wait_ready(self, echo: IO[str] | None = None) -> None:
        """Read serve's output until the router is ready; raise if serve exits first."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            if echo is not None:
                echo.write(line)
                echo.flush()
            if found := re.search(r"engine \d+ ready at \S+ \(pid (\d+)\)", line):
                self.engine_pids.append(int(found[1]))
            if found := re.search(r"router ready at (\S+);", line):
                self.url = found[1]
                return
        self.process.wait()
        tail = "".join(self.output[-15:])
        raise ServeError(f"autellix serve exited with code {self.process.returncode}:\n{tail}")

    def stop(self) -> None:
        """SIGTERM (serve stops the router, then its engines); SIGKILL whatever is
        left after the grace period, engines included."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _kill_group(self.process.pid)
                self.process.wait()
        for pid in self.engine_pids:
            _kill_group(pid)
        if self.process.stdout is not None:
            self.process.stdout.close()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@dataclass
class Example:
    """One example script running in the background, its output in files."""

    name: str
    process: subprocess.Popen[bytes]
    reports: Path
    log: Path

    @classmethod
    def start(cls, script: str, folder: Path, base_url: str, *options: str) -> Example:
        name = script.removesuffix(".py")
        reports, log = folder / f"{name}.json", folder / f"{name}.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                [sys.executable, str(EXAMPLES / script), "--base-url", base_url,
                 "--json", str(reports), *options],
                stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        return cls(name, process, reports, log)

    def stop(self) -> None:
        """SIGTERM first: the example ends its open programs on the server. (Not
        SIGINT, which a shell may have set to be ignored in background jobs.)"""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _kill_group(self.process.pid)
                self.process.wait()

    def read_reports(self) -> list[ProgramReport]:
        if not self.reports.is_file():
            return []
        return [ProgramReport(**row) for row in json.loads(self.reports.read_text())]


def show_ps(url: str) -> None:
    try:
        ps = subprocess.run(
            [*AUTELLIX, "ps", "--url", url], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        print("--- autellix ps did not answer within 30 s", flush=True)
        return
    stamp = time.strftime("%H:%M:%S")
    print(f"--- autellix ps ({stamp})\n{(ps.stdout or ps.stderr).rstrip()}", flush=True)


def start_serve(args: argparse.Namespace, folder: Path) -> Serve:
    """``autellix serve`` with its own engines, or (``--upstream``) over a running one."""
    if args.upstream:
        print(f"demo: starting the router over {args.upstream}", flush=True)
        return Serve.start("--upstream", args.upstream, "--chars-per-token", "1")
    engines = args.engines or 1
    print(f"demo: starting autellix serve ({engines} engine(s), embedded tiny model;"
          f" engine logs in {folder})", flush=True)  # fmt: skip
    return Serve.start(
        "--engines", str(engines), "--log-dir", str(folder), "--model", "tiny",
        "--chars-per-token", "1",
        "--", *COMPACT_JSON,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Start serve, run the load, and always stop everything; the exit code."""
    started = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="autellix-demo-"))
    serve: Serve | None = None
    examples: list[Example] = []
    code = 1
    try:
        serve = start_serve(args, folder)
        serve.wait_ready(echo=sys.stdout)
        print(f"demo: serve ready after {time.monotonic() - started:.0f} s", flush=True)
        code = run_examples(args, serve, folder, examples)
    except ServeError as error:
        print(f"demo: error: {error}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("\ndemo: interrupted; stopping everything", flush=True)
        code = 130
    finally:
        # A second Ctrl-C or SIGTERM must not cut the cleanup short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for example in examples:
            example.stop()
        if serve is not None:
            serve.stop()
        if code == 0:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"demo: logs kept in {folder}", flush=True)
        print(f"demo: all processes stopped; total {time.monotonic() - started:.0f} s", flush=True)
    return code


def run_examples(
    args: argparse.Namespace, serve: Serve, folder: Path, examples: list[Example]
) -> int:
    """Run both examples at once (appended to ``examples`` as they start, so that the
    caller can stop them), print ``autellix ps`` meanwhile, then their tables."""
    print(f"demo: running {args.react_agents} ReAct agents and {args.mcts_programs} MCTS"
          " programs", flush=True)  # fmt: skip
    started = time.monotonic()
    base_url = serve.url + "/v1"
    examples.append(
        Example.start("react_agent.py", folder, base_url, "--agents", str(args.react_agents),
                      "--max-steps", str(args.max_steps))
    )  # fmt: skip
    examples.append(
        Example.start("mcts_agent.py", folder, base_url, "--programs", str(args.mcts_programs),
                      "--width", str(args.width), "--iterations", str(args.iterations))
    )  # fmt: skip
    next_ps = time.monotonic() + min(FIRST_PS_AFTER_S, args.ps_every)
    while any(example.process.poll() is None for example in examples):
        if time.monotonic() >= next_ps:
            show_ps(serve.url)
            next_ps = time.monotonic() + args.ps_every
        time.sleep(0.2)
    programs = sum(len(example.read_reports()) for example in examples)
    print(f"\ndemo: {programs} programs finished in {time.monotonic() - started:.0f} s")
    for example in examples:
        print(f"\n{example.name}:\n{format_reports(example.read_reports())}")
    failed = [example for example in examples if example.process.returncode != 0]
    for example in failed:
        print(f"\ndemo: {example.name} exited with code {example.process.returncode}:")
        print(example.log.read_text(errors="replace")[-3000:])
    return 1 if failed else 0


def parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=positive_int, help="vLLM engines to start (default 1)")
    parser.add_argument("--react-agents", type=positive_int, default=8)
    parser.add_argument("--max-steps", type=positive_int, default=3, help="per ReAct agent")
    parser.add_argument("--mcts-programs", type=positive_int, default=2)
    parser.add_argument("--width", type=positive_int, default=3, help="MCTS children per step")
    parser.add_argument("--iterations", type=positive_int, default=4, help="MCTS expansions")
    parser.add_argument("--ps-every", type=float, default=10.0, help="seconds between ps")
    parser.add_argument(
        "--upstream", metavar="URL", help="route over this running engine instead of starting one"
    )
    return parser


def main() -> int:
    args = parser().parse_args()
    if args.ps_every <= 0:
        parser().error("--ps-every must be positive")
    if args.upstream and args.engines is not None:
        parser().error("--upstream uses a running engine: drop --engines")
    # SIGTERM (e.g. from a supervisor) cleans up exactly like Ctrl-C.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
