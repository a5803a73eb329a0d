"""``make demo``: ReAct agents next to MCTS searches, under stock vLLM and under autellix.

    python examples/demo.py                                    # SmolLM2, both schedulers
    python examples/demo.py --model tiny --react-agents 4      # random weights, quick
    python examples/demo.py --no-compare                       # autellix only
    python examples/demo.py --upstream http://127.0.0.1:8001   # a running engine, router only

1. measures how busy the machine is (its load average, and how much of a core
   a short compute loop gets), then starts two ``autellix serve`` at once on
   the real model (``--model``, default smollm2), with the same flags and few
   seats (``--max-num-seqs``), so that calls queue: one with the autellix
   scheduler, one with stock vLLM's (``--scheduler vllm``); free loopback
   ports, engine logs in a temporary folder;
2. runs the agent mix in short rounds that alternate between the two, in the
   order autellix, stock, stock, autellix, ... (``--rounds`` each), so that a
   load that comes and goes falls on both alike. A round: MCTS searches
   (``mcts_agent.py``) start at once, and short ReAct questions
   (``react_agent.py``) arrive one every ``--react-every`` seconds from
   ``--react-after`` seconds on, while they search; the same seeds every round,
   so the agents make the same calls up to the engine's numerics. The first
   round prints the agents' steps, ``autellix ps`` every few seconds and a
   table per example; every round, how many answers were right;
3. prints each example's average and p95 program latency under both, their
   ratio, the ratio of each pair of rounds, and whether the machine was too
   busy for the comparison to mean anything (another load on the cores slows
   the two schedulers' runs unevenly: on a machine at load 2.5-6.7, one long
   run each showed autellix behind, all 0.97x, MCTS 0.87x);
4. stops every process it started: the agents, the routers and the engines,
   also on Ctrl-C, SIGTERM or an error.

With ``--upstream`` it runs the rounds through a router over that engine
(whose scheduler it cannot change). Exit code 0 when every program finished
(the temporary folder is then removed; otherwise its logs are kept and
named), 130 after Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from _common import OneLineArgumentParser, ProgramReport, format_reports, positive_int
from autellix_vllm.cli._arguments import HelpFormatter
from autellix_vllm.engine.models import ModelNotInstalledError, resolve_model
from autellix_vllm.stats import percentile

EXAMPLES = Path(__file__).resolve().parent
AUTELLIX = [sys.executable, "-m", "autellix_vllm"]
# Without free whitespace between JSON fields, structured replies are shorter
# (a third shorter on the random-weight model, which fills every field it may).
COMPACT_JSON = [
    "--structured-outputs-config",
    '{"backend": "xgrammar", "disable_any_whitespace": true}',
]
STOP_GRACE_S = 60.0  # serve itself gives each engine 20 s before SIGKILL
FIRST_PS_AFTER_S = 3.0  # by then every program has opened and made its first calls
# The two runs of the comparison: scheduler (serve's --scheduler) -> its name here.
SCHEDULERS = {"autellix": "autellix", "vllm": "stock vLLM"}
# The column of each example's report that says whether its answer was right.
RIGHT_COLUMN = {"react_agent": "RIGHT", "mcts_agent": "SOLVED"}
# A core gives a compute loop this share of its time or less: others' work is
# taking the cores, and both schedulers' latencies measure it as much as them.
BUSY_CORE_SHARE = 0.67
PROBE_S = 0.2  # how long the compute loop of one busy-ness probe runs


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

    shown: int = 0  # bytes of the log already printed by show_progress

    @classmethod
    def start(cls, script: str, folder: Path, base_url: str, *options: str) -> Example:
        """Its progress lines (stderr) go to ``NAME.log``, its table (stdout) to ``NAME.out``."""
        name = script.removesuffix(".py")
        reports, log = folder / f"{name}.json", folder / f"{name}.log"
        with log.open("wb") as progress, (folder / f"{name}.out").open("wb") as table:
            process = subprocess.Popen(
                [sys.executable, str(EXAMPLES / script), "--base-url", base_url,
                 "--json", str(reports), *options],
                stdout=table, stderr=progress, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        return cls(name, process, reports, log)

    def show_progress(self) -> None:
        """Print the complete progress lines written since the last call."""
        with self.log.open("rb") as log:
            log.seek(self.shown)
            lines = log.read().decode(errors="replace").splitlines(keepends=True)
        for line in lines:
            if not line.endswith("\n"):
                break  # the example is still writing it
            self.shown += len(line.encode())
            print(f"  {line.rstrip()}", flush=True)

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


def start_serves(args: argparse.Namespace, folder: Path) -> dict[str, Serve]:
    """Scheduler -> ``autellix serve`` for each run: both schedulers' engines at
    once, or (``--upstream``) one router over a running engine."""
    if args.upstream:
        print(f"demo: starting the router over {args.upstream}", flush=True)
        return {"upstream": Serve.start("--upstream", args.upstream, *chars_per_token(args))}
    try:  # once here, not in both serves at once: the first use converts the model
        resolve_model(args.model)
    except ModelNotInstalledError as error:
        raise ServeError(str(error)) from None
    schedulers = list(SCHEDULERS) if args.compare else ["autellix"]
    engines = args.engines or 1
    print(f"demo: starting {len(schedulers)} autellix serve at once, {engines} engine(s) each,"
          f" model {args.model}, {args.max_num_seqs} seats an engine (engine logs in"
          f" {folder})", flush=True)  # fmt: skip
    options = [
        "--model", args.model, "--engines", str(engines), "--max-num-seqs",
        str(args.max_num_seqs), *chars_per_token(args),
    ]  # fmt: skip
    serves = {}
    for scheduler in schedulers:
        log_dir = ["--log-dir", str(folder / scheduler)]
        serves[scheduler] = Serve.start("--scheduler", scheduler, *options, *log_dir,
                                        "--", *COMPACT_JSON)  # fmt: skip
    return serves


def chars_per_token(args: argparse.Namespace) -> list[str]:
    """The router's prompt-size estimate: the tiny model has a token per character."""
    return ["--chars-per-token", "1"] if args.model == "tiny" else []


@dataclass(frozen=True)
class CpuSample:
    """How busy the machine is: the 1-minute load average and the share of a core
    a short compute loop got (its CPU time over its wall time; 1.0 on an idle core)."""

    load: float
    core_share: float

    @classmethod
    def take(cls) -> CpuSample:
        wall, cpu = time.perf_counter(), time.process_time()
        while time.process_time() - cpu < PROBE_S and time.perf_counter() - wall < 10 * PROBE_S:
            sum(range(10_000))
        share = (time.process_time() - cpu) / (time.perf_counter() - wall)
        return cls(os.getloadavg()[0], min(1.0, share))


def round_order(schedulers: list[str], rounds: int) -> list[str]:
    """The schedulers' rounds, alternating and mirrored (A B B A A B ...), so that
    neither always runs first or while the machine warms up."""
    order: list[str] = []
    for pair in range(rounds):
        order += schedulers if pair % 2 == 0 else schedulers[::-1]
    return order


def run(args: argparse.Namespace) -> int:
    """Start the serves, run the rounds on each in turn, compare; always stop everything."""
    started = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="autellix-demo-"))
    before = CpuSample.take()
    print(f"demo: {os.cpu_count()} cores, load average {before.load:.1f}, a core gives"
          f" {before.core_share:.0%} of its time", flush=True)  # fmt: skip
    serves: dict[str, Serve] = {}
    examples: list[Example] = []
    samples: list[CpuSample] = []
    code = 1
    try:
        serves = start_serves(args, folder)
        for serve in serves.values():
            serve.wait_ready(echo=sys.stdout)
        print(f"demo: ready after {time.monotonic() - started:.0f} s", flush=True)
        runs: dict[str, list[list[Example]]] = {scheduler: [] for scheduler in serves}
        order = round_order(list(serves), args.rounds)
        for number, scheduler in enumerate(order, start=1):
            samples.append(CpuSample.take())  # between rounds: only others' work runs
            name = SCHEDULERS.get(scheduler, "the upstream engine's")
            print(f"\n=== round {number} of {len(order)}: {name} scheduling ===", flush=True)
            folder_of_round = folder / f"round-{number}-{scheduler}"
            this_round = run_round(args, serves[scheduler], folder_of_round, examples, number == 1)
            runs[scheduler].append(this_round)
            if any(example.process.returncode != 0 for example in this_round):
                break
        finished = [round_ for rounds in runs.values() for round_ in rounds]
        code = 1 if any(e.process.returncode != 0 for r in finished for e in r) else 0
        if code == 0:
            print(f"\n{format_answers(runs)}", flush=True)
        if code == 0 and len(runs) > 1:
            print(f"\n{format_comparison(runs)}", flush=True)
            print(busy_verdict(before, samples), flush=True)
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
        for serve in serves.values():
            serve.stop()
        if code == 0:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"demo: logs kept in {folder}", flush=True)
        print(f"demo: all processes stopped; total {time.monotonic() - started:.0f} s", flush=True)
    return code


def run_round(
    args: argparse.Namespace, serve: Serve, folder: Path, examples: list[Example], live: bool
) -> list[Example]:
    """Run both examples at once (appended to ``examples`` as they start, so that the
    caller can stop them): the searches at once, the ReAct agents one every
    ``--react-every`` seconds. ``live``: print their steps and ``autellix ps``
    meanwhile, and a table per example at the end."""
    folder.mkdir(parents=True)
    if live:
        print(f"demo: a round: {args.mcts_programs} MCTS searches (width {args.width}, up to"
              f" {args.iterations} expansions) start at once; {args.react_agents} ReAct agents"
              f" (up to {args.max_steps} steps) arrive one every {args.react_every:g} s from"
              f" {args.react_after:g} s on", flush=True)  # fmt: skip
    started = time.monotonic()
    base_url = serve.url + "/v1"
    seed = ["--seed", str(args.seed)]
    mcts_options = ["--programs", str(args.mcts_programs), "--width", str(args.width),
                    "--iterations", str(args.iterations), *seed]  # fmt: skip
    mcts = Example.start("mcts_agent.py", folder, base_url, *mcts_options)
    react_options = ["--agents", str(args.react_agents), "--max-steps", str(args.max_steps),
                     "--start-every", str(args.react_every), *seed]  # fmt: skip
    this_round = [mcts]
    examples.append(mcts)
    react_at = started + args.react_after
    next_ps = time.monotonic() + min(FIRST_PS_AFTER_S, args.ps_every)
    while len(this_round) < 2 or any(example.process.poll() is None for example in this_round):
        if len(this_round) < 2 and time.monotonic() >= react_at:
            react = Example.start("react_agent.py", folder, base_url, *react_options)
            this_round.append(react)
            examples.append(react)
        if live:
            for example in this_round:
                example.show_progress()
            if time.monotonic() >= next_ps:
                show_ps(serve.url)
                next_ps = time.monotonic() + args.ps_every
        time.sleep(0.2)
    reports = {example.name: example.read_reports() for example in this_round}
    if live:
        for example in this_round:
            example.show_progress()
            print(f"\n{example.name}:\n{format_reports(reports[example.name])}")
    answers = "; ".join(f"{name}: {right_answers(name, rows)}" for name, rows in reports.items())
    print(f"demo: {sum(map(len, reports.values()))} programs finished in"
          f" {time.monotonic() - started:.0f} s; {answers}", flush=True)  # fmt: skip
    for example in this_round:
        if example.process.returncode != 0:
            print(f"\ndemo: {example.name} exited with code {example.process.returncode}:")
            print(example.log.read_text(errors="replace")[-3000:])
    return this_round


def right_answers(example: str, reports: list[ProgramReport]) -> str:
    right = sum(report.columns.get(RIGHT_COLUMN[example]) == "yes" for report in reports)
    return f"{right} of {len(reports)} {'solved' if example == 'mcts_agent' else 'answered right'}"


def reports_of(rounds: list[list[Example]]) -> dict[str, list[ProgramReport]]:
    """Example name -> its programs' reports over ``rounds``, and ``all`` of them."""
    by_example: dict[str, list[ProgramReport]] = {}
    for examples in rounds:
        for example in examples:
            by_example.setdefault(example.name, []).extend(example.read_reports())
    by_example["all"] = [report for rows in list(by_example.values()) for report in rows]
    return by_example


def format_answers(runs: dict[str, list[list[Example]]]) -> str:
    """How many answers were right, per example, over every round of every scheduler."""
    rounds = [round_ for rounds in runs.values() for round_ in rounds]
    by_example = reports_of(rounds)
    del by_example["all"]
    counts = "; ".join(f"{name}: {right_answers(name, rows)}" for name, rows in by_example.items())
    return f"demo: over all {len(rounds)} rounds: {counts}"


def format_comparison(runs: dict[str, list[list[Example]]]) -> str:
    """Each example's program latency (wall seconds from its start to its answer)
    under stock vLLM and under autellix, and stock over autellix (> 1: faster);
    then the same ratio for each pair of rounds, to show how much it varies."""
    reports = {scheduler: reports_of(rounds) for scheduler, rounds in runs.items()}
    header = ["EXAMPLE", "PROGRAMS", "CALLS stock/autellix", "stock vLLM avg / p95 s",
              "autellix avg / p95 s", "RATIO avg / p95"]  # fmt: skip
    rows = [header]
    slower = []  # examples that autellix serves later than stock vLLM on average
    for name in reports["vllm"]:
        stock, ours = reports["vllm"][name], reports["autellix"][name]
        walls = [[r.wall_seconds for r in stock], [r.wall_seconds for r in ours]]
        avg = [statistics.fmean(w) for w in walls]
        p95 = [percentile(w, 95) for w in walls]
        rows.append([
            name.removesuffix("_agent"), str(len(ours)),
            f"{sum(r.calls for r in stock)}/{sum(r.calls for r in ours)}",
            f"{avg[0]:.1f} / {p95[0]:.1f}", f"{avg[1]:.1f} / {p95[1]:.1f}",
            f"{avg[0] / avg[1]:.2f}x / {p95[0] / p95[1]:.2f}x",
        ])  # fmt: skip
        if avg[0] < avg[1] and name != "all":
            slower.append(name.removesuffix("_agent"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]  # fmt: skip
    pairs = [
        statistics.fmean(r.wall_seconds for r in reports_of([stock])["all"])
        / statistics.fmean(r.wall_seconds for r in reports_of([ours])["all"])
        for stock, ours in zip(runs["vllm"], runs["autellix"], strict=False)
    ]
    why = (
        f"\ndemo: {', '.join(slower)} slower under autellix: its programs have received"
        " the most service, so the shorter programs go first (PLAS)"
        if slower
        else ""
    )
    return (
        "demo: program latency, the same agents on the same engine settings:\n"
        + "\n".join(lines)
        + why
        + "\ndemo: avg ratio of each pair of rounds: "
        + ", ".join(f"{ratio:.2f}x" for ratio in pairs)
    )


def busy_verdict(before: CpuSample, between_rounds: list[CpuSample]) -> str:
    """Whether the machine was quiet enough for the comparison to mean something:
    the share of a core a compute loop got before the engines started and
    between rounds (when only others' work runs), and the load averages."""
    shares = [before.core_share, *(sample.core_share for sample in between_rounds)]
    loads = [sample.load for sample in between_rounds] or [before.load]
    measured = (
        f"a core gave {min(shares):.0%}-{max(shares):.0%} of its time to a compute loop"
        f" between rounds; load average {min(loads):.1f}-{max(loads):.1f} on"
        f" {os.cpu_count()} cores"
    )
    if statistics.median(shares) <= BUSY_CORE_SHARE:
        return (
            f"demo: the machine was too busy for this comparison to mean anything: {measured}."
            " Other work took the cores from both schedulers' rounds unevenly; run it again"
            " on a quieter machine"
        )
    return f"demo: the machine was quiet enough: {measured}"


def parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny or a model folder")
    parser.add_argument(
        "--engines", type=positive_int, help="vLLM engines per scheduler (default: 1)"
    )
    parser.add_argument(
        "--max-num-seqs", type=positive_int, default=4, help="seats (calls at once) an engine"
    )
    parser.add_argument(
        "--react-agents", type=positive_int, default=5, help="ReAct agents (programs) a round"
    )
    parser.add_argument(
        "--max-steps", type=positive_int, default=2, help="tool steps per ReAct agent"
    )
    parser.add_argument(
        "--react-every", type=float, default=2.0, help="seconds between ReAct arrivals"
    )
    parser.add_argument(
        "--react-after", type=float, default=8.0,
        help="seconds from the searches' start to the first ReAct agent",
    )  # fmt: skip
    parser.add_argument(
        "--mcts-programs", type=positive_int, default=1, help="MCTS searches (programs) a round"
    )
    parser.add_argument(
        "--rounds", type=positive_int, default=2, help="rounds of the mix per scheduler"
    )
    parser.add_argument("--width", type=positive_int, default=6, help="MCTS children per step")
    parser.add_argument("--iterations", type=positive_int, default=6, help="MCTS expansions")
    parser.add_argument("--seed", type=int, default=0, help="the agents' sampling seed")
    parser.add_argument(
        "--no-compare", dest="compare", action="store_false",
        help="run the mix under autellix only, not also under stock vLLM",
    )  # fmt: skip
    parser.add_argument("--ps-every", type=float, default=10.0, help="seconds between ps")
    parser.add_argument(
        "--upstream",
        metavar="URL",
        help="route over this running engine instead of starting engines (default: none)",
    )
    return parser


def main() -> int:
    args = parser().parse_args()
    if args.ps_every <= 0:
        parser().error("--ps-every must be positive")
    if args.react_every < 0 or args.react_after < 0:
        parser().error("--react-every and --react-after must be >= 0")
    if args.upstream and args.engines is not None:
        parser().error("--upstream uses a running engine: drop --engines")
    # SIGTERM (e.g. from a supervisor) cleans up exactly like Ctrl-C.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
