"""Issue 40's targets on the real CPU engine: tenants.py's cases through a real
router in front of one real vLLM engine.

The engine is the one ``autellix serve`` starts (its own planner, with an engine
key, ``--max-num-seqs --seats`` and level boundaries scaled like the tokens); it
runs for the whole invocation. Each case runs behind a router of its own,
``autellix serve --upstream`` with a keys file, as deployed, and each key's
client sends its programs with its bearer token, its calls timed and sent as
``autellix bench engine`` replays a workload (``bench/replay.py``: prompts of
token ids sharing their program's prefix, forced decode lengths, tool gaps; a
program ended after its last call, as the SDK does). Every case's keys are
fresh, so the engine keeps no service of one case's owners into the next, and
its program ids are too, so no case finds another's prefixes in the cache.

Load is in multiples of the engine's capacity (programs/s of ``--workload`` it
completes when flooded): a probe floods it with the workload and counts the
decode tokens answered per second (``--capacity`` skips the probe). Every case
spans ``--window`` seconds of arrivals. Per seed:

* **classes**: an interactive key at ``--interactive-load`` x capacity, alone
  and beside a batch key's flood at ``--flood`` x capacity, three ways: today
  (the keys file gives the batch key no class), classes (``class=batch``), and
  classes with the router's gate (``autellix serve --flow-control``). A case
  lasts until the interactive key's programs are done. Figure: the interactive
  key's P95 program latency with the flood over alone (target <= 1.2).
* **throughput**: the same flood beside a little interactive load
  (``--little-load``), the same three ways, cut at the window's end. The batch
  key's throughput is the decode tokens of its calls answered in the window
  after its first quarter (the flood's ramp, :data:`RAMP`) over that span (the
  flood keeps the engine saturated from then on, so this is its steady share;
  tenants.py runs the flood to its end instead, which here would double the
  run). Figure: with classes
  (and gated) over today (target >= 0.9). Beside it, ``flood_over_served``: the
  flood's decode tokens per second over what the engine answered the batch key
  today, to show the flood is ~``--flood`` x what the engine completes.
* **split** (``--no-split`` leaves it out): two keys of equal weight at
  ``--split-load`` x capacity each; ``a`` runs its agents as programs, ``b``
  sends every call as a program of its own (a fresh X-Autellix-Program-Id per
  call, never ended) but closed-loop, still waiting for its answers and tool
  gaps (tenants.py's ``closed`` client); once as that, once with ``b`` running
  programs too (``behave``). Service is the decode tokens of each key's calls
  answered by the time the first key had all of its calls answered (tenants.py
  counts whole programs; here ``b``'s programs are calls). Figures: b's
  service over a's (target within 10%; beside it ``behave_service_ratio``,
  the same when both behave: the keys' programs differ, so this is the floor
  it is read against) and a's P95 program latency over the
  run where both behave (target <= 1.1). A split case lasts until ``a``'s
  programs are done.

No case lasts longer than ``--window`` + ``--drain`` seconds: a key's programs
still running then are cut, their latency counted up to the cut (a lower
bound) and the count reported as ``unfinished``. Each case also reports what
the engine saw: the bands its table ranked each key's programs in, each key's
share there (service over weight) and, gated, the most batch calls the
router's gate held at once.

Unlike tenants.py's "today", which puts every program under one owner, here
today's keys are two owners in one band, so the engine's fair share between
keys already acts.

    python bench/experiments/tenants_engine.py --seeds 0,1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from autellix_vllm.bench.replay import (
    BenchSettings,
    CallRequest,
    PromptVocabulary,
    _complete,
    build_workload,
    call_requests,
    scaled_levels,
)
from autellix_vllm.bench.subprocesses import ROUTER_READY, router_command, running
from autellix_vllm.cli import serve
from autellix_vllm.engine.launcher import EngineConfig, EngineProcess
from autellix_vllm.protocol.identity import (
    PARENT_THREAD_ID_HEADER,
    PROGRAM_ID_HEADER,
    THREAD_ID_HEADER,
)
from autellix_vllm.protocol.paths import ENGINE_TABLE_PATH, PROGRAM_PATH
from autellix_vllm.router.keys import owner_of
from autellix_vllm.stats import percentile
from autellix_vllm.workloads import ProgramSpec
from prometheus_client.parser import text_string_to_metric_families
from tenants import AGENTS, BATCH, INTERACTIVE, SPLITTER, _seeds

PROBE = "probe"
HELD_GAUGE = "autellix_router_calls_held"
WATCH_EVERY_S = 0.5  # how often a case reads the engine's table and the router's gate
# Throughput counts the window after this share of it: the flood's programs are
# chains of calls, so the engine fills only once a few of them have arrived (on
# seed 0 the first quarter of a 40 s window had the engine half idle).
RAMP = 0.25


def say(message: str) -> None:
    """One progress line on stderr (stdout carries only the JSON)."""
    print(f"tenants_engine: {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


# ---- the engine and the routers, as autellix serve starts them ----


def bench_settings(args: argparse.Namespace, **overrides: Any) -> BenchSettings:
    """The replay's settings of this run (model, seats, token scale)."""
    return BenchSettings(
        model=args.model,
        workload=args.workload,
        max_num_seqs=args.seats,
        token_scale=args.token_scale,
        **overrides,
    )


def engine_config(args: argparse.Namespace, engine_key: str, log_dir: Path) -> EngineConfig:
    """The one engine ``autellix serve --model M --max-num-seqs N --levels L`` plans
    (serve's own parser and planner), behind ``engine_key``."""
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers(), "serve")
    levels = scaled_levels(bench_settings(args))
    argv = ["serve", "--model", args.model, "--max-num-seqs", str(args.seats),
            "--levels", levels, "--log-dir", str(log_dir)]  # fmt: skip
    (config,) = serve.plan_engines(parser.parse_args(argv), engine_key)
    return config


@dataclass(frozen=True)
class Client:
    """One key in a case: its name in the keys file, a fresh bearer token, its
    programs, and whether it sends every call as a program of its own."""

    key: str
    programs: list[ProgramSpec]
    splitting: bool = False
    token: str = field(default_factory=lambda: f"sk-tenants-{secrets.token_urlsafe(12)}")


@dataclass(frozen=True)
class Bench:
    """What every case runs against: the engine, its key, the run's settings."""

    engine: EngineProcess
    engine_key: str
    admin_key: str
    folder: Path
    vocabulary: PromptVocabulary
    args: argparse.Namespace


@contextlib.contextmanager
def routed(bench: Bench, clients: list[Client], classes: bool, gated: bool) -> Iterator[str]:
    """``autellix serve --upstream`` in front of the engine for the block, with a
    keys file of ``clients`` (the batch key ``class=batch`` if ``classes``) and
    ``--flow-control`` if ``gated``; yields its URL."""
    lines = [
        f"{c.key}: {c.token}" + (" class=batch" if classes and c.key == BATCH else "")
        for c in clients
    ]
    keys = bench.folder / "keys"
    keys.write_text("\n".join(lines) + "\n")
    options = ["--engine-key", bench.engine_key, "--api-keys-file", str(keys),
               "--admin-key", bench.admin_key, *(["--flow-control"] if gated else [])]  # fmt: skip
    with running(router_command([bench.engine.base_url], *options), ROUTER_READY) as router:
        yield router.ready


# ---- the clients ----


@dataclass
class Seen:
    """What a case's clients saw, noted as it happens so that a cut case still tells."""

    # (key, seconds from the case's start to the answer, the call's decode tokens)
    answers: list[tuple[str, float, int]] = field(default_factory=list)
    # key -> program id -> seconds from its arrival to its last answer
    latency: dict[str, dict[str, float]] = field(default_factory=dict)


def split_requests(
    program: ProgramSpec, requests: dict[str, CallRequest]
) -> dict[str, CallRequest]:
    """Each call under a program id of its own, on that program's one thread: a
    client that opens a new program for every call."""
    out = {}
    for call_id, request in requests.items():
        headers = {**request.headers, PROGRAM_ID_HEADER: f"{program.program_id}.{call_id}",
                   THREAD_ID_HEADER: "main"}  # fmt: skip
        headers.pop(PARENT_THREAD_ID_HEADER, None)
        out[call_id] = replace(request, headers=headers)
    return out


async def run_program(
    http: aiohttp.ClientSession,
    url: str,
    client: Client,
    program: ProgramSpec,
    requests: dict[str, CallRequest],
    start: float,
    seen: Seen,
) -> None:
    """One program as the replay runs it (calls after the calls they follow and
    their tool gap), noting each answer; ended after its last call unless its
    client splits (such a client never ends its one-call programs)."""
    await asyncio.sleep(max(0.0, start + program.arrival - time.monotonic()))
    answered = {call.id: asyncio.Event() for call in program.calls}

    async def run_call(call: Any) -> None:
        for before in call.after:
            await answered[before].wait()
        await asyncio.sleep(call.tool_gap)
        await _complete(http, url, call, requests[call.id])
        seen.answers.append((client.key, time.monotonic() - start, call.decode_tokens))
        answered[call.id].set()

    await asyncio.gather(*(run_call(call) for call in program.calls))
    latency = time.monotonic() - start - program.arrival
    seen.latency.setdefault(client.key, {})[program.program_id] = latency
    if not client.splitting:
        path = PROGRAM_PATH.format(program_id=quote(program.program_id, safe=""))
        async with http.delete(url + path) as response:
            if response.status != 200:
                raise RuntimeError(f"ending {program.program_id}: HTTP {response.status}")


def program_tasks(
    sessions: dict[str, aiohttp.ClientSession],
    url: str,
    clients: list[Client],
    bench: Bench,
    start: float,
    seen: Seen,
) -> list[asyncio.Task[None]]:
    """A task per program of every client, each sent with its key's session."""
    model = bench.engine.served_model_name
    tasks = []
    for client in clients:
        for program in client.programs:
            requests = call_requests(program, model, "sent", bench.vocabulary)
            if client.splitting:
                requests = split_requests(program, requests)
            run = run_program(sessions[client.key], url, client, program, requests, start, seen)
            tasks.append(asyncio.create_task(run))
    return tasks


# ---- what the engine and the router saw ----


@dataclass
class Watched:
    """What a case read off the engine's table and the router's gate meanwhile."""

    bands: dict[str, int] = field(default_factory=dict)  # program id -> band on the engine
    shares: dict[str, float] = field(default_factory=dict)  # owner -> service over weight
    held_max: dict[str, float] = field(default_factory=dict)  # class -> most held at once
    idle: bool = False  # no call waiting or running on the engine at the last reading


async def read_engine(http: aiohttp.ClientSession, bench: Bench, watched: Watched) -> None:
    headers = {"Authorization": f"Bearer {bench.engine_key}"}
    async with http.get(bench.engine.base_url + ENGINE_TABLE_PATH, headers=headers) as answer:
        table = await answer.json()
    for row in table["programs"]:
        watched.bands[row["program_id"]] = row["band"]
    watched.shares = {owner: row["share"] for owner, row in table["owners"].items()}
    running = sum(row["active_calls"] for row in table["programs"])
    watched.idle = table["waiting"] == 0 and running == 0


async def read_gate(http: aiohttp.ClientSession, url: str, bench: Bench, watched: Watched) -> None:
    headers = {"Authorization": f"Bearer {bench.admin_key}"}
    async with http.get(url + "/metrics", headers=headers) as answer:
        text = await answer.text()
    for family in text_string_to_metric_families(text):
        if family.name == HELD_GAUGE:
            for sample in family.samples:
                name = sample.labels["class"]
                watched.held_max[name] = max(watched.held_max.get(name, 0.0), sample.value)


async def watch(bench: Bench, url: str, gated: bool, watched: Watched) -> None:
    """Read the engine's table (and, gated, the router's held gauge) every
    :data:`WATCH_EVERY_S` until cancelled; programs ended by their client leave
    the engine's table, so their band is caught while they run."""
    async with aiohttp.ClientSession() as http:
        while True:
            await read_engine(http, bench, watched)
            if gated:
                await read_gate(http, url, bench, watched)
            await asyncio.sleep(WATCH_EVERY_S)


async def until_idle(bench: Bench, timeout_s: float = 120.0) -> None:
    """Wait until the engine has no call waiting or running (a cut case's calls
    are aborted when their connections close), so that cases do not overlap."""
    watched = Watched()
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while True:
            await read_engine(http, bench, watched)
            if watched.idle or time.monotonic() > deadline:
                return
            await asyncio.sleep(0.5)


# ---- one case ----


@dataclass
class CaseRun:
    """A case's outcome: what the clients saw, when it stopped, what was watched."""

    clients: list[Client]
    seen: Seen
    stopped_s: float
    watched: Watched


async def drive(
    bench: Bench, url: str, clients: list[Client], wait_for: tuple[str, ...], window: float,
    gated: bool,
) -> CaseRun:  # fmt: skip
    """Run the clients until every program of the keys ``wait_for`` is done (none:
    until the window has passed), at most ``--drain`` seconds past the window,
    then cut the rest: their arrivals span the window, and what comes after
    their end would measure nothing."""
    seen, watched = Seen(), Watched()
    timeout = aiohttp.ClientTimeout(total=None)
    sessions = {
        c.key: aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {c.token}"},
            timeout=timeout,
            # The router closes idle keep-alive connections; keep them for less.
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0),
        )  # fmt: skip
        for c in clients
    }
    expected = {c.key: len(c.programs) for c in clients if c.key in wait_for}
    start = time.monotonic()
    tasks = program_tasks(sessions, url, clients, bench, start, seen)
    watcher = asyncio.create_task(watch(bench, url, gated, watched))
    try:
        while True:
            await asyncio.sleep(0.2)
            for task in tasks:  # a failed call stops the run with its error
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            elapsed = time.monotonic() - start
            if expected:  # the keys measured by their latency: until they are done
                over = all(len(seen.latency.get(k, {})) == n for k, n in expected.items())
            else:  # measured by their throughput in the window: until it ends
                over = elapsed >= window
            if over or elapsed >= window + bench.args.drain:
                break
    finally:
        stopped_s = time.monotonic() - start
        for task in [*tasks, watcher]:
            task.cancel()
        await asyncio.gather(*tasks, watcher, return_exceptions=True)
        for session in sessions.values():
            await session.close()
    return CaseRun(clients, seen, stopped_s, watched)


def run_case(
    bench: Bench, name: str, clients: list[Client], wait_for: tuple[str, ...] = (),
    classes: bool = False, gated: bool = False, window: float | None = None,
) -> CaseRun:  # fmt: skip
    """One case behind a router of its own; returns once the engine is idle again."""
    say(f"{name}: {', '.join(f'{c.key} {len(c.programs)} programs' for c in clients)}")
    with routed(bench, clients, classes, gated) as url:
        run = asyncio.run(drive(bench, url, clients, wait_for, window or bench.args.window, gated))
    asyncio.run(until_idle(bench))
    say(f"{name}: stopped after {run.stopped_s:.1f} s")
    return run


def key_summary(run: CaseRun, client: Client, window: float) -> dict[str, Any]:
    """One key's figures in a case: P95 program latency (an unfinished program
    counts up to the cut), throughput in the window past its :data:`RAMP`, bands
    and share on the engine."""
    done = run.seen.latency.get(client.key, {})
    latency = [done.get(p.program_id, run.stopped_s - p.arrival) for p in client.programs]
    ramp = window * RAMP
    tokens = sum(t for key, at, t in run.seen.answers if key == client.key and ramp < at <= window)
    ids = {p.program_id for p in client.programs}
    prefixes = tuple(f"{i}." for i in ids)  # a splitting client's one-call programs
    bands = {band for pid, band in run.watched.bands.items()
             if pid in ids or pid.startswith(prefixes)}  # fmt: skip
    return {
        "programs": len(client.programs),
        "unfinished": len(client.programs) - len(done),
        "p95_s": round(percentile(latency, 95), 3),
        "decode_tokens_past_ramp": tokens,
        "throughput_tokens_per_s": round(tokens / (window - ramp), 3),
        "engine_bands": sorted(bands),
        "engine_share": run.watched.shares.get(owner_of(client.token)),
    }


def served_by(run: CaseRun) -> dict[str, int]:
    """Decode tokens of each key's calls answered by the time the first key had all
    of its calls answered (by the cut, if none had)."""
    ends = []
    for client in run.clients:
        calls = sum(len(p.calls) for p in client.programs)
        times = sorted(at for key, at, _ in run.seen.answers if key == client.key)
        if len(times) == calls:
            ends.append(times[-1])
    until = min(ends, default=run.stopped_s)
    return {
        c.key: sum(t for key, at, t in run.seen.answers if key == c.key and at <= until)
        for c in run.clients
    }


# ---- the workload and the probe ----


def programs_of(
    args: argparse.Namespace, key: str, load: float, seed: int, case: str, capacity: float
) -> list[ProgramSpec]:
    """``key``'s programs in ``case``: ``load`` x capacity over the window, scaled
    to the CPU model as the engine bench scales them, ids unique to the case."""
    count = max(1, round(load * capacity * args.window))
    settings = bench_settings(args, programs=count, seed=seed, rate=load * capacity)
    return [
        replace(p, program_id=f"s{seed}.{case}.{key}.{p.program_id}", owner=key)
        for p in build_workload(settings)
    ]


def mean_decode(args: argparse.Namespace) -> float:
    """The workload's mean decode tokens per program, as scaled (500 programs)."""
    programs = build_workload(bench_settings(args, programs=500, seed=99))
    return statistics.fmean(p.decode_tokens for p in programs)


def probe_capacity(bench: Bench) -> dict[str, float]:
    """Programs/s the engine completes when flooded: four times its seats of the
    workload's programs at once for ``--probe`` seconds; decode tokens answered
    per second after the first third (a warm, full engine) over the workload's
    mean decode tokens per program."""
    args = bench.args
    count = 4 * args.seats
    settings = bench_settings(args, programs=count, seed=7777, rate=1.0)
    programs = [replace(p, arrival=0.0, program_id=f"probe.{p.program_id}")
                for p in build_workload(settings)]  # fmt: skip
    run = run_case(bench, PROBE, [Client(PROBE, programs)], window=args.probe)
    warm = args.probe / 3
    tokens = sum(t for _, at, t in run.seen.answers if warm < at <= args.probe)
    tokens_per_s = tokens / (args.probe - warm)
    mean = mean_decode(args)
    return {"tokens_per_s": round(tokens_per_s, 2), "mean_decode_per_program": round(mean, 2),
            "capacity": round(tokens_per_s / mean, 4)}  # fmt: skip


# ---- the cases of one seed ----


def classes_cases(bench: Bench, seed: int, capacity: float) -> dict[str, Any]:
    """The classes and throughput cases of one seed, by name."""
    args = bench.args

    def keys(case: str, interactive_load: float) -> list[Client]:
        return [
            Client(INTERACTIVE, programs_of(args, INTERACTIVE, interactive_load, seed, case,
                                            capacity)),
            Client(BATCH, programs_of(args, BATCH, args.flood, seed + 1000, case, capacity)),
        ]  # fmt: skip

    only = [Client(INTERACTIVE, programs_of(args, INTERACTIVE, args.interactive_load, seed,
                                            "alone", capacity))]  # fmt: skip
    runs = {"alone": run_case(bench, "alone", only, (INTERACTIVE,))}
    ways = {"today": (False, False), "classes": (True, False), "gated": (True, True)}
    for way, (classes, gated) in ways.items():
        name = f"flood_{way}"
        runs[name] = run_case(bench, name, keys(name, args.interactive_load), (INTERACTIVE,),
                              classes, gated)  # fmt: skip
        name = f"little_{way}"
        runs[name] = run_case(bench, name, keys(name, args.little_load), (), classes, gated)
    return runs


def split_cases(bench: Bench, seed: int, capacity: float) -> dict[str, Any]:
    """The two split cases of one seed: both keys behave; ``b`` splits."""
    args = bench.args
    runs = {}
    for name, splitting in (("behave", False), ("split", True)):
        clients = [
            Client(AGENTS, programs_of(args, AGENTS, args.split_load, seed + 2000, name,
                                       capacity)),
            Client(SPLITTER, programs_of(args, SPLITTER, args.split_load, seed + 3000, name,
                                         capacity), splitting),
        ]  # fmt: skip
        runs[name] = run_case(bench, name, clients, (AGENTS,))
    return runs


def seed_row(bench: Bench, seed: int, capacity: float) -> dict[str, Any]:
    """Every case of one seed, its figures and each case's per-key summary."""
    args = bench.args
    runs = classes_cases(bench, seed, capacity)
    if args.split:
        runs |= split_cases(bench, seed, capacity)
    cases = {
        name: {"stopped_s": round(run.stopped_s, 1), "held_max": run.watched.held_max,
               **{c.key: key_summary(run, c, args.window) for c in run.clients}}
        for name, run in runs.items()
    }  # fmt: skip
    alone = cases["alone"][INTERACTIVE]["p95_s"]
    today = cases["little_today"][BATCH]["throughput_tokens_per_s"]
    flood_tokens = sum(p.decode_tokens for p in runs["little_today"].clients[1].programs)
    row: dict[str, Any] = {
        "seed": seed,
        "interactive_p95_alone_s": alone,
        "interactive_p95_ratio_today": cases["flood_today"][INTERACTIVE]["p95_s"] / alone,
        "interactive_p95_ratio": cases["flood_classes"][INTERACTIVE]["p95_s"] / alone,
        "interactive_p95_ratio_gated": cases["flood_gated"][INTERACTIVE]["p95_s"] / alone,
        "batch_throughput_ratio": cases["little_classes"][BATCH]["throughput_tokens_per_s"] / today,
        "batch_throughput_ratio_gated": cases["little_gated"][BATCH]["throughput_tokens_per_s"]
        / today,
        "flood_over_served": flood_tokens / args.window / today,
    }
    if args.split:
        served = served_by(runs["split"])
        row["split_service_ratio"] = served[SPLITTER] / served[AGENTS]
        # The keys run different programs: their service when both behave is the
        # floor the split ratio is read against (tenants.py's behave_service_ratio).
        behaving = served_by(runs["behave"])
        row["behave_service_ratio"] = behaving[SPLITTER] / behaving[AGENTS]
        row["agents_p95_ratio"] = cases["split"][AGENTS]["p95_s"] / cases["behave"][AGENTS]["p95_s"]
        row["split_served_decode_tokens"] = served
    row["cases"] = cases
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The worst of every figure over the seeds, as tenants.py sums up."""
    out = {}
    for name in ("interactive_p95_ratio", "interactive_p95_ratio_gated", "agents_p95_ratio"):
        if name in rows[0]:
            out[f"worst_{name}"] = max(row[name] for row in rows)
    for name in ("batch_throughput_ratio", "batch_throughput_ratio_gated"):
        out[f"worst_{name}"] = min(row[name] for row in rows)
    if "split_service_ratio" in rows[0]:
        out["worst_split_service_gap"] = max(abs(row["split_service_ratio"] - 1) for row in rows)
    return out


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Start the engine, probe it (unless ``--capacity``), run every seed's cases."""
    engine_key, admin_key = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="tenants-engine-") as folder:
        config = engine_config(args, engine_key, Path(folder))
        say(f"starting the {args.model} engine ({args.seats} seats)")
        with EngineProcess(config) as engine:
            vocabulary = PromptVocabulary.of_model(engine.model.path)
            bench = Bench(engine, engine_key, admin_key, Path(folder), vocabulary, args)
            probe = {"capacity": args.capacity} if args.capacity else probe_capacity(bench)
            say(f"capacity {probe['capacity']:.3f} programs/s")
            rows = [seed_row(bench, seed, probe["capacity"]) for seed in args.seeds]
    settings = {key: value for key, value in vars(args).items() if key != "seeds"}
    return {"settings": settings, "probe": probe, "seeds": rows, **summary(rows)}


# ---- the command ----


QUICK = {"model": "tiny", "seats": 4, "window": 6.0, "probe": 2.0, "drain": 0.5,
         "token_scale": 0.05}  # fmt: skip
"""``--quick``: the tiny model and seconds a case (the test's run). Its window is
shorter than an interactive program and the gate's linger (4 s) after it, so
gated, the batch key's calls may stay held for the whole of a little case."""


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--model", default="smollm2", help="(default: %(default)s)")
    add("--workload", default="bfcl", help="(default: %(default)s)")
    add("--seats", type=int, default=8, help="the engine's --max-num-seqs (default: %(default)s)")
    add("--token-scale", type=float, default=0.125, help="(default: %(default)s)")
    add("--capacity", type=float, default=None,
        help="programs/s the engine completes when flooded (default: probed)")  # fmt: skip
    add("--probe", type=float, default=20.0, help="seconds the probe floods (default: %(default)s)")
    add("--window", type=float, default=40.0, help="seconds of arrivals (default: %(default)s)")
    add("--drain", type=float, default=60.0,
        help="seconds past the window a case may last (default: %(default)s)")  # fmt: skip
    add("--interactive-load", type=float, default=0.3, help="x capacity (default: %(default)s)")
    add("--little-load", type=float, default=0.05, help="x capacity (default: %(default)s)")
    add("--flood", type=float, default=2.0, help="x capacity (default: %(default)s)")
    add("--split-load", type=float, default=1.0,
        help="x capacity, each of the split cases' two keys (default: %(default)s)")  # fmt: skip
    add("--no-split", dest="split", action="store_false", help="leave out the split cases")
    add("--seeds", type=_seeds, default=[0], help="SEED,... (default: 0)")
    add("--quick", action="store_true", help=f"the tiny model, short cases: {QUICK}")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    print(json.dumps(compare(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
