"""A soak test of ``autellix serve`` under faults: ``autellix bench soak --minutes M``.

It starts ``autellix serve --engines 2 --model tiny`` (a subprocess in its own
session, with a keys file of two client keys, ``alice`` and ``mallory``, and an
admin key; two tiny engines are what two CPU cores hold) and, for M minutes:

* **honest agents** (key ``alice``), written with the SDK (``autellix.AsyncOpenAI``
  and ``@program``), arrive at a steady rate: single-threaded chains of calls,
  and fork/join programs (a plan, three calls in parallel with
  ``asyncio.gather``, a streamed merge). Each call asks for a few tokens. A
  program is *lost* when it raises anything but a documented outcome; the only
  one the run can cause is a stream the killed engine broke after its first
  byte (``engine_failed_mid_stream``), which is counted apart;
* **an engine dies**: at a third of the run, one engine's API server gets
  SIGKILL. serve must restart it; the run measures how long the engine was out
  of rotation (``GET /autellix/v1/engines``) and whether its process group
  (engine core, worker) was reaped;
* **a client misbehaves** (key ``mallory``), every few seconds: scheduling
  fields forged in headers and in ``vllm_xargs`` (with a live honest program's
  id, with its own program's id, and straight at an engine port without the
  engine key), call ids reused after completion and at once, a 100,000-deep
  JSON body and a 950-deep ``messages``, and a flood of programs up to its
  per-key cap. Each kind has one expected answer; any other is reported;
* **the router is watched**: ``GET /health`` every 100 ms from a process of its
  own (the longest answer is ``max_health_ms``), and the resident memory of
  serve's process, where the router runs (``router_rss_mb``, at the end). The
  slowest probes are listed with where their time went (the router's event
  loop on a CPU or waiting for one, the probe waiting for one), which tells a
  router that stalls from a machine too busy to run it.

``forged_accepted`` counts the programs whose record on an engine ever showed a
forged prior service (both engines' tables are read every 2 s with the engine
key, which the bench holds as an operator would), plus any engine call
answered without the engine key. The run passes when no program is lost, no
forgery was accepted, every misbehaviour got its expected answer and the
killed engine came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import multiprocessing
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from autellix import AsyncOpenAI, current_program, program

from autellix_vllm.bench.subprocesses import (
    ENGINE_EXITED,
    ENGINE_READY,
    ENGINE_RESTARTED,
    ROUTER_READY,
)
from autellix_vllm.engine.reaper import dies_with_parent, group_members
from autellix_vllm.protocol.bearer import ENGINE_KEY_VARIABLE
from autellix_vllm.protocol.identity import (
    CALL_ID_HEADER,
    PRIOR_SERVICE,
    PRIOR_SERVICE_HEADER,
    PROGRAM_ID,
    PROGRAM_ID_HEADER,
    XARGS_FIELD,
)
from autellix_vllm.protocol.paths import (
    CHAT_COMPLETIONS_PATH,
    ENGINE_PROGRAM_PATH,
    ENGINE_TABLE_PATH,
    ENGINES_PATH,
    PROGRAMS_PATH,
)

ENGINES = 2
MODEL = "tiny"
# What a forger claims its victim has received; anything near it on an engine
# means the forgery counted. Honest programs here stay below a few hundred.
FORGED_SERVICE = 1e300
FORGED_FLOOR = 1e6
CHAIN_STEPS = 3
FANOUT = 3
# Outcomes that are documented and that the run itself causes: not lost.
EXPECTED_FAILURES = frozenset({"engine_failed_mid_stream"})
MISBEHAVE_EVERY_S = 5.0
FLOOD_EVERY_ROUNDS = 3
TABLE_SCAN_EVERY_S = 2.0
PROGRESS_EVERY_S = 30.0


@dataclass(frozen=True)
class SoakSettings:
    minutes: float = 10.0
    rate: float = 1.0  # honest programs started per second
    seed: int = 0
    max_tokens: int = 8  # per call
    kill_at: float = 1 / 3  # of the run
    max_programs_per_key: int = 200  # serve's cap; what mallory's flood reaches
    health_interval_s: float = 0.1
    startup_timeout_s: float = 600.0
    # How long programs still running when arrivals stop may take to finish.
    drain_timeout_s: float = 180.0


def say(message: str) -> None:
    print(f"autellix bench soak: {message}", file=sys.stderr, flush=True)


# ---- autellix serve, in a subprocess -------------------------------------------------


@dataclass(frozen=True)
class Keys:
    alice: str
    mallory: str
    admin: str
    engine: str

    @classmethod
    def fresh(cls) -> Keys:
        return cls(*(f"sk-soak-{secrets.token_urlsafe(16)}" for _ in range(4)))

    def write_file(self, path: Path) -> Path:
        path.write_text(f"alice: {self.alice}\nmallory: {self.mallory}\n")
        path.chmod(0o600)
        return path


_ENGINE_READY = re.compile(ENGINE_READY)
_ENGINE_EXITED = re.compile(ENGINE_EXITED)
_ENGINE_BACK = re.compile(ENGINE_RESTARTED)


@dataclass
class Served:
    """A running ``autellix serve``, from what it prints."""

    process: subprocess.Popen[str]
    url: str = ""
    engine_urls: dict[int, str] = field(default_factory=dict)
    # Engine -> its reaper's pid, which is also its process group (the newest start).
    engine_groups: dict[int, int] = field(default_factory=dict)
    groups_seen: set[int] = field(default_factory=set)
    deaths: int = 0
    restarts: int = 0
    ready: threading.Event = field(default_factory=threading.Event)

    def read_output(self) -> None:
        """Echo serve's lines to stderr and note engines, deaths and restarts."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            print(f"  serve| {line}", end="", file=sys.stderr, flush=True)
            if found := _ENGINE_READY.search(line):
                self.engine_urls[int(found[1])] = found[2]
                self._engine_started(int(found[1]), int(found[3]))
            elif found := _ENGINE_BACK.search(line):
                self.restarts += 1
                self._engine_started(int(found[1]), int(found[3]))
            elif _ENGINE_EXITED.search(line):
                self.deaths += 1
            elif found := re.search(ROUTER_READY, line):
                self.url = found[1]
                self.ready.set()

    def _engine_started(self, engine: int, group: int) -> None:
        self.engine_groups[engine] = group
        self.groups_seen.add(group)


@contextlib.contextmanager
def serving(settings: SoakSettings, keys: Keys, folder: Path) -> Iterator[Served]:
    """``autellix serve`` for the duration of the block; stopped (SIGTERM, then
    SIGKILL of its group and of every engine group it had) however the block ends."""
    command = [
        sys.executable, "-m", "autellix_vllm", "serve", "--port", "0",
        "--engines", str(ENGINES), "--model", MODEL, "--chars-per-token", "1",
        "--max-model-len", "1024", "--max-num-seqs", "8", "--health-interval", "0.5",
        "--api-keys-file", str(keys.write_file(folder / "keys")), "--admin-key", keys.admin,
        "--max-programs-per-key", str(settings.max_programs_per_key),
        "--log-dir", str(folder), "--startup-timeout", str(settings.startup_timeout_s),
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a terminal's Ctrl-C reaches the bench, which stops serve
        preexec_fn=dies_with_parent(),  # and a bench killed outright takes serve along
        env={**os.environ, ENGINE_KEY_VARIABLE: keys.engine},
    )
    served = Served(process)
    threading.Thread(target=served.read_output, daemon=True).start()
    try:
        deadline = time.monotonic() + settings.startup_timeout_s + 60
        while not served.ready.wait(0.5):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"autellix serve did not get ready (exit code {process.poll()})")
        yield served
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            process.wait()
        for group in served.groups_seen:  # nothing may outlive the run
            _kill_group(group)


def _kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


# ---- the router's health and memory, from a process of its own ----------------------


@dataclass(frozen=True)
class Probe:
    """One ``GET /health``: when, how long, and where the time went, from the
    kernel's schedstat. The router's event loop (the main thread of serve's
    process) ran on a CPU, or was ready to run and waited for one (a machine busy
    elsewhere), or slept (for the request, for I/O, or for the GIL while serve's
    other threads ran: they pump the engines' logs and supervise them); the
    probe itself may have waited for a CPU too."""

    at_s: float
    ms: float
    router_on_cpu_ms: float
    router_waiting_for_cpu_ms: float
    serve_other_threads_on_cpu_ms: float
    probe_waiting_for_cpu_ms: float


@dataclass(frozen=True)
class WatchControl:
    """Shared between the bench and :func:`watch_router`'s process."""

    stop: Any  # a multiprocessing Event: set to stop probing
    worst_ms: Any  # multiprocessing Values (doubles), for the progress lines
    rss_mb: Any


@dataclass
class Watched:
    """What :func:`watch_router` saw; sent back to the bench when it stops."""

    probes: list[Probe] = field(default_factory=list)
    not_ok: Counter[str] = field(default_factory=Counter)
    rss_mb: list[float] = field(default_factory=list)


def watch_router(
    url: str,
    key: str,
    pid: int,
    interval_s: float,
    began: float,
    shared: WatchControl,
    results: Any,
) -> None:
    """``GET /health`` every ``interval_s`` on one kept-alive connection, and the
    resident memory (VmRSS) of the router's process ``pid`` every second, until
    ``shared.stop`` is set; then :class:`Watched` goes through ``results``. Runs
    in a process of its own, so that nothing the bench does (its event loop, its
    garbage collector) delays a probe. ``began`` is the run's start on the
    system-wide monotonic clock."""
    watched = Watched()
    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80
    connection = http.client.HTTPConnection(host, port, timeout=30)
    headers = {"Authorization": f"Bearer {key}"}

    def health() -> int | None:
        try:
            connection.request("GET", "/health", headers=headers)
            answer = connection.getresponse()
            answer.read()
            return answer.status
        except (OSError, http.client.HTTPException):
            connection.close()  # the next request opens a new connection
            return None

    next_rss = 0.0
    bench = os.getppid()
    while not shared.stop.wait(interval_s) and os.getppid() == bench:  # ends with the bench
        before = cpu_times(pid, os.getpid())
        sent = time.perf_counter()
        status = health() or health()  # a closed keep-alive connection gets one more try
        elapsed_ms = (time.perf_counter() - sent) * 1000
        spent = (max(0.0, a - b) for a, b in zip(cpu_times(pid, os.getpid()), before, strict=True))
        watched.probes.append(Probe(time.monotonic() - began, elapsed_ms, *spent))
        shared.worst_ms.value = max(shared.worst_ms.value, elapsed_ms)
        if status != 200:
            watched.not_ok[str(status)] += 1
        if time.monotonic() >= next_rss:
            next_rss = time.monotonic() + 1.0
            if (rss := resident_mb(pid)) is not None:
                watched.rss_mb.append(rss)
                shared.rss_mb.value = rss
    connection.close()
    results.send(watched)


class RouterWatch:
    """:func:`watch_router` in a process of its own, and what it saw."""

    def __init__(self, url: str, key: str, pid: int, interval_s: float, began: float) -> None:
        context = multiprocessing.get_context("spawn")  # no copy of the bench's threads
        self.shared = WatchControl(
            stop=context.Event(), worst_ms=context.Value("d", 0.0), rss_mb=context.Value("d", 0.0)
        )
        self._results, sending = context.Pipe(duplex=False)
        self._process = context.Process(
            target=watch_router,
            args=(url, key, pid, interval_s, began, self.shared, sending),
            daemon=True,
        )
        self.watched = Watched()

    def start(self) -> None:
        self._process.start()

    def stop(self) -> None:
        self.shared.stop.set()
        if self._results.poll(30):
            self.watched = self._results.recv()
        self._process.join(10)

    @property
    def worst_ms(self) -> float:
        """So far (read while it runs)."""
        return self.shared.worst_ms.value

    @property
    def rss_mb(self) -> float:
        """The latest sample (read while it runs)."""
        return self.shared.rss_mb.value

    def summary(self, events: list[Event]) -> dict[str, Any]:
        """Percentiles, and the five slowest probes with the events they fell in."""
        probes = self.watched.probes
        ordered = sorted(probe.ms for probe in probes) or [0.0]
        slowest = sorted(probes, key=lambda probe: probe.ms, reverse=True)[:5]
        return {
            "probes": len(probes),
            "p50_ms": round(ordered[len(ordered) // 2], 1),
            "p99_ms": round(ordered[int(len(ordered) * 0.99)], 1),
            "max_ms": round(ordered[-1], 1),
            # The longest the router's own work can have held up one probe.
            "max_router_on_cpu_ms": round(max((p.router_on_cpu_ms for p in probes), default=0), 1),
            "slowest": [
                {
                    **{name: round(value, 1) for name, value in vars(probe).items()},
                    "during": [event.name for event in events if event.covers(probe.at_s)],
                }
                for probe in slowest
            ],
            "not_200": dict(self.watched.not_ok),
        }


@dataclass(frozen=True)
class Event:
    """Something the run did to the system, from ``start_s`` to ``end_s`` into the run."""

    name: str
    start_s: float
    end_s: float

    def covers(self, at_s: float) -> bool:
        return self.start_s <= at_s <= self.end_s


def cpu_times(serve: int, probe: int) -> tuple[float, float, float, float]:
    """Milliseconds so far: serve's main thread on a CPU and waiting for one, serve's
    other threads on a CPU, and the probe's thread waiting for one (Linux
    ``/proc/<pid>/task/<tid>/schedstat``; zeros elsewhere)."""
    main_on_cpu, main_waiting = schedstat(serve, serve)
    others = 0.0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{serve}/task"):
            if int(tid) != serve:
                others += schedstat(serve, int(tid))[0]
    return main_on_cpu, main_waiting, others, schedstat(probe, probe)[1]


def schedstat(pid: int, tid: int) -> tuple[float, float]:
    """Milliseconds thread ``tid`` of ``pid`` has run on a CPU, and waited for one."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
            on_cpu_ns, waiting_ns, _ = stat.read().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(on_cpu_ns) / 1e6, int(waiting_ns) / 1e6


def resident_mb(pid: int) -> float | None:
    """VmRSS of ``pid`` in MB (Linux /proc; None elsewhere or once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


# ---- honest agents -------------------------------------------------------------------


def failure_kind(error: BaseException) -> str:
    """A short name for what a program raised: the error code when there is one."""
    code = getattr(error, "code", None)
    status = getattr(error, "status_code", None)
    parts = [str(part) for part in (status, code) if part is not None]
    return " ".join(parts) if parts else type(error).__name__


@dataclass
class HonestAgents:
    """Programs of key ``alice``, made with the SDK as an agent author would."""

    client: AsyncOpenAI
    model: str
    max_tokens: int
    started: Counter[str] = field(default_factory=Counter)
    completed: int = 0
    calls: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    # Failed programs: (seconds into the run, kind), to place them against the kill.
    failure_times: list[tuple[float, str]] = field(default_factory=list)
    # Ids of the programs running now: the misbehaving client's victims.
    live: set[str] = field(default_factory=set)
    # Reads a program's engine rows; called once per program, after its first
    # answer, when the engine has charged that call and the program has not ended.
    look_up: Callable[[list[str]], Awaitable[None]] | None = None
    looked_up: set[str] = field(default_factory=set)  # live programs already read

    async def wait_for_live(self, within_s: float) -> None:
        """Return once a program runs, or after ``within_s`` (the agents arrive one
        at a time, so a round of the misbehaving client may fall between two)."""
        deadline = time.monotonic() + within_s
        while not self.live and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def ask(self, prompt: str) -> str:
        answer = await self.client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=self.max_tokens,
        )
        self.calls += 1
        await self._look_up_once()
        return answer.choices[0].message.content or ""

    async def _look_up_once(self) -> None:
        program_id = current_program()
        if self.look_up is not None and program_id and program_id not in self.looked_up:
            self.looked_up.add(program_id)
            await self.look_up([program_id])

    async def ask_streamed(self, prompt: str) -> str:
        stream = await self.client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=self.max_tokens,
            stream=True,
        )
        text = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        self.calls += 1
        return "".join(text)

    async def chain(self, task: str) -> None:
        """One thread: each call continues from the answer before it."""
        text = task
        for step in range(CHAIN_STEPS):
            text = f"{task}, step {step}: {(await self.ask(text))[-64:]}"

    async def fork_join(self, task: str) -> None:
        """A plan, three child threads at once, then a streamed merge on the main thread."""
        plan = await self.ask(f"plan {task}")
        parts = await asyncio.gather(
            *(self.ask(f"{task}, part {i}: {plan[-32:]}") for i in range(FANOUT))
        )
        await self.ask_streamed(f"merge {task}: " + " | ".join(p[-16:] for p in parts))

    async def run_one(self, number: int, kind: str, began: float) -> None:
        body: Callable[[str], Awaitable[None]] = getattr(self, kind)

        async def agent(task: str) -> None:
            program_id = current_program()
            assert program_id is not None
            self.live.add(program_id)
            try:
                await body(task)
            finally:
                self.live.discard(program_id)
                self.looked_up.discard(program_id)

        self.started[kind] += 1
        try:
            await program(name=kind, client=self.client)(agent)(f"task {number}")
        except Exception as error:  # every kind is counted and reported
            kind_name = failure_kind(error)
            self.failures[kind_name] += 1
            self.failure_times.append((round(time.monotonic() - began, 1), kind_name))
        else:
            self.completed += 1

    async def arrive(
        self, duration_s: float, rate: float, rng: random.Random, began: float, drain_s: float
    ) -> int:
        """Start programs at ``rate`` per second for ``duration_s``, then wait for them;
        returns how many were still running after ``drain_s`` more (those are cancelled)."""
        running: set[asyncio.Task[None]] = set()
        number = 0
        while (due := began + number / rate) < began + duration_s:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            kind = rng.choice(("chain", "fork_join"))
            task = asyncio.create_task(self.run_one(number, kind, began))
            running.add(task)
            task.add_done_callback(running.discard)
            number += 1
        if not running:
            return 0
        _, unfinished = await asyncio.wait(set(running), timeout=drain_s)
        for task in unfinished:
            task.cancel()
        return len(unfinished)

    @property
    def programs(self) -> int:
        return sum(self.started.values())

    @property
    def lost(self) -> int:
        return sum(n for kind, n in self.failures.items() if kind not in EXPECTED_FAILURES)


# ---- the misbehaving client ----------------------------------------------------------


@dataclass
class Tally:
    """One kind of misbehaviour: the answers it may get, and what else it got."""

    expected: tuple[str, ...]
    sent: int = 0
    unexpected: Counter[str] = field(default_factory=Counter)

    def record(self, got: str) -> None:
        self.sent += 1
        if got not in self.expected:
            self.unexpected[got] += 1

    def summary(self) -> dict[str, Any]:
        return {
            "expected": " or ".join(self.expected),
            "sent": self.sent,
            "unexpected": dict(self.unexpected),
        }


async def answer_of(response: aiohttp.ClientResponse) -> str:
    """``"<status> <error code>"``, or the bare status when the body names no error."""
    text = await response.text()
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        error = None
    code = error.get("code") if isinstance(error, dict) else error
    return f"{response.status} {code}" if code is not None else str(response.status)


@dataclass
class EngineTables:
    """Reads both engines' tables with the engine key, as an operator may, and
    notes every program whose service shows a forged prior service."""

    http: aiohttp.ClientSession
    engine_urls: dict[int, str]  # serve's, as it prints them (a restart keeps the port)
    engine_key: str
    forged: set[str] = field(default_factory=set)
    largest_service: float = 0.0
    scans: int = 0
    lookups: int = 0

    async def scan(self, program_ids: list[str] | None = None) -> None:
        """Read every engine's whole table, or only ``program_ids``' rows."""
        headers = {"Authorization": f"Bearer {self.engine_key}"}
        for url in list(self.engine_urls.values()):
            if program_ids is None:
                reading = self.http.get(url + ENGINE_TABLE_PATH, headers=headers)
            else:
                body = {"program_ids": program_ids}
                reading = self.http.post(url + ENGINE_TABLE_PATH, headers=headers, json=body)
            try:
                async with reading as answer:
                    table = await answer.json() if answer.status == 200 else {}
            except (aiohttp.ClientError, ValueError):
                continue  # the killed engine, until it is back
            for row in table.get("programs", []):
                service = float(row.get("attained_service") or 0.0)
                if service >= FORGED_FLOOR:
                    self.forged.add(row["program_id"])
                else:
                    self.largest_service = max(self.largest_service, service)
        if program_ids is None:
            self.scans += 1
        else:
            self.lookups += 1


@dataclass
class Mallory:
    """Key ``mallory``: does every documented kind of harm, each with its expected answer."""

    http: aiohttp.ClientSession
    served: Served
    key: str
    model: str
    honest: HonestAgents
    tables: EngineTables
    cap: int
    rng: random.Random
    tallies: dict[str, Tally] = field(init=False)
    # Calls an engine answered without the engine key.
    engine_accepted: int = 0
    rounds: int = 0
    # When each flood ran (the run's start is set by misbehave()).
    floods: list[Event] = field(default_factory=list)
    began: float = 0.0

    def __post_init__(self) -> None:
        self.tallies = {
            "forged_victim_via_router": Tally(("404 program_not_found",)),
            "forged_own_via_router": Tally(("200",)),
            # vLLM's own --api-key check guards /v1/*; the extension's guards its paths
            # (both answer in the router's error shape).
            "forged_at_engine_without_key": Tally(("401 invalid_api_key",)),
            "engine_admin_without_key": Tally(("401 invalid_api_key",)),
            "call_id_reused": Tally(("409 call_id_reused",)),
            "call_id_concurrent": Tally(("200 + 409 call_id_reused",)),
            "deep_json_body": Tally(("400 invalid_json",)),
            # Python's parser takes 950 levels: the router passes the body on, and
            # vLLM's request validation refuses it (code invalid_request in our shape).
            "deep_messages": Tally(("400 invalid_json", "400 invalid_request")),
            # Counting the programs the key already had (the router derives one for
            # a call that names none, as deep_messages is).
            "program_flood": Tally((f"{self.cap} open, then 429 too_many_programs",)),
        }

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    async def misbehave(self, began: float, until: float) -> None:
        self.began = began
        while time.monotonic() < until:
            round_began = time.monotonic()
            await self.one_round()
            await asyncio.sleep(max(0.0, MISBEHAVE_EVERY_S - (time.monotonic() - round_began)))

    async def one_round(self) -> None:
        own = await self.open_program("mallory")
        await self.forge(own)
        await self.reuse_call_ids(own)
        await self.send_deep_json()
        await self.end_program(own)
        if self.rounds % FLOOD_EVERY_ROUNDS == 0:
            flood_began = time.monotonic() - self.began
            await self.flood()
            self.floods.append(Event("flood", flood_began, time.monotonic() - self.began))
        await self.tables.scan()  # did any forgery of this round count?
        self.rounds += 1

    def forged_call(self, program_id: str, call_id: str | None = None) -> tuple[dict, dict]:
        """Headers and body of a chat call claiming a huge prior service for ``program_id``."""
        headers = {PROGRAM_ID_HEADER: program_id, PRIOR_SERVICE_HEADER: str(FORGED_SERVICE)}
        if call_id is not None:
            headers[CALL_ID_HEADER] = call_id
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "me first"}],
            "max_tokens": 2,
            XARGS_FIELD: {PROGRAM_ID: program_id, PRIOR_SERVICE: FORGED_SERVICE},
        }
        return headers, body

    async def forge(self, own: str) -> None:
        await self.honest.wait_for_live(within_s=MISBEHAVE_EVERY_S)
        victim = self.rng.choice(sorted(self.honest.live)) if self.honest.live else None
        if victim is not None:
            headers, body = self.forged_call(victim)
            got = await self.post(CHAT_COMPLETIONS_PATH, headers, body)
            self.tallies["forged_victim_via_router"].record(got)
        headers, body = self.forged_call(own)
        self.tallies["forged_own_via_router"].record(
            await self.post(CHAT_COMPLETIONS_PATH, headers, body)
        )
        target = victim or own
        for url in list(self.served.engine_urls.values()):
            headers, body = self.forged_call(target)
            for key in (None, "wrong-key"):
                sent = {**headers, **({"Authorization": f"Bearer {key}"} if key else {})}
                got = await self.at_engine("POST", url + CHAT_COMPLETIONS_PATH, sent, body)
                if got is not None:
                    self.tallies["forged_at_engine_without_key"].record(got)
                    self.engine_accepted += got.startswith("2")
            for method, path in (
                ("GET", ENGINE_TABLE_PATH),
                ("DELETE", ENGINE_PROGRAM_PATH.format(program_id=target)),
            ):
                got = await self.at_engine(method, url + path, {}, None)
                if got is not None:
                    self.tallies["engine_admin_without_key"].record(got)
                    self.engine_accepted += got.startswith("2")

    async def reuse_call_ids(self, own: str) -> None:
        headers, body = self.forged_call(own, call_id=f"once-{self.rounds}")
        await self.post(CHAT_COMPLETIONS_PATH, headers, body)
        self.tallies["call_id_reused"].record(await self.post(CHAT_COMPLETIONS_PATH, headers, body))
        headers, body = self.forged_call(own, call_id=f"twice-{self.rounds}")
        both = await asyncio.gather(
            *(self.post(CHAT_COMPLETIONS_PATH, headers, body) for _ in range(2))
        )
        self.tallies["call_id_concurrent"].record(" + ".join(sorted(both)))

    async def send_deep_json(self) -> None:
        url = self.served.url + CHAT_COMPLETIONS_PATH
        messages = "[" * 950 + '{"role": "user", "content": "hi"}' + "]" * 950
        deep_messages = f'{{"model": "{self.model}", "messages": {messages}}}'.encode()
        for kind, data in (("deep_json_body", b"[" * 100_000), ("deep_messages", deep_messages)):
            async with self.http.post(url, data=data, headers=self.auth) as answer:
                self.tallies[kind].record(await answer_of(answer))

    async def flood(self) -> None:
        """Open programs until the router refuses one, then end them all."""
        async with self.http.get(self.served.url + PROGRAMS_PATH, headers=self.auth) as answer:
            answer.raise_for_status()
            already_open = (await answer.json())["total"]
        opened: list[str] = []
        refusals: list[str] = []

        async def open_until_refused() -> None:
            while not refusals:
                async with self.http.post(
                    self.served.url + PROGRAMS_PATH, json={"name": "flood"}, headers=self.auth
                ) as answer:
                    if answer.status == 200:
                        opened.append((await answer.json())["program_id"])
                    else:
                        refusals.append(await answer_of(answer))

        await asyncio.gather(*(open_until_refused() for _ in range(8)))
        open_at_refusal = already_open + len(opened)
        self.tallies["program_flood"].record(f"{open_at_refusal} open, then {refusals[0]}")
        for start in range(0, len(opened), 32):
            await asyncio.gather(*(self.end_program(p) for p in opened[start : start + 32]))

    async def open_program(self, name: str) -> str:
        async with self.http.post(
            self.served.url + PROGRAMS_PATH, json={"name": name}, headers=self.auth
        ) as answer:
            answer.raise_for_status()
            return (await answer.json())["program_id"]

    async def end_program(self, program_id: str) -> None:
        url = f"{self.served.url}{PROGRAMS_PATH}/{program_id}"
        async with self.http.delete(url, headers=self.auth) as answer:
            await answer.read()

    async def post(self, path: str, headers: dict[str, str], body: dict) -> str:
        async with self.http.post(
            self.served.url + path, json=body, headers={**headers, **self.auth}
        ) as answer:
            return await answer_of(answer)

    async def at_engine(
        self, method: str, url: str, headers: dict[str, str], body: dict | None
    ) -> str | None:
        """A request straight to an engine; None when it is down (the killed one)."""
        try:
            async with self.http.request(method, url, json=body, headers=headers) as answer:
                return await answer_of(answer)
        except aiohttp.ClientConnectionError:
            return None


# ---- the engine kill -----------------------------------------------------------------


@dataclass
class Kill:
    engine: int
    api_server_pid: int
    group: int
    at_s: float
    out_of_rotation_s: float | None = None
    back_in_rotation_s: float | None = None
    group_reaped_s: float | None = None


def api_server_of(reaper_pid: int) -> int:
    """The vLLM API server of an engine: the only child of its reaper."""
    children = Path(f"/proc/{reaper_pid}/task/{reaper_pid}/children").read_text().split()
    if len(children) != 1:
        raise RuntimeError(f"engine reaper {reaper_pid} has children {children}, not one")
    return int(children[0])


async def kill_and_watch(
    served: Served,
    http: aiohttp.ClientSession,
    admin_key: str,
    at: float,
    began: float,
    engine: int,
    timeout_s: float,
) -> Kill:
    """SIGKILL ``engine``'s API server at ``at``; follow it out of rotation and back,
    until serve has also reported the restart."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    group = served.engine_groups[engine]
    server = api_server_of(group)
    restarts = served.restarts
    os.kill(server, signal.SIGKILL)
    killed = time.monotonic()
    kill = Kill(engine, server, group, round(killed - began, 1))
    say(f"killed engine {engine}'s API server (pid {server}) at {kill.at_s:.0f} s")
    name = f"engine-{engine}"
    while time.monotonic() - killed < timeout_s:
        async with http.get(
            served.url + ENGINES_PATH, headers={"Authorization": f"Bearer {admin_key}"}
        ) as answer:
            healthy = {row["name"]: row["healthy"] for row in (await answer.json())["engines"]}
        since = round(time.monotonic() - killed, 2)
        if kill.group_reaped_s is None and not group_members(group):
            kill.group_reaped_s = since
        if not healthy[name] and kill.out_of_rotation_s is None:
            kill.out_of_rotation_s = since
        elif (
            healthy[name] and kill.out_of_rotation_s is not None and kill.back_in_rotation_s is None
        ):
            kill.back_in_rotation_s = since
            say(f"engine {engine} back in rotation {since:.0f} s after the kill")
        if kill.back_in_rotation_s is not None and served.restarts > restarts:
            break
        await asyncio.sleep(0.2)
    return kill


# ---- the run -------------------------------------------------------------------------


def run_soak(settings: SoakSettings) -> dict[str, Any]:
    """Run the soak; the result's ``passed`` says whether every invariant held."""
    keys = Keys.fresh()
    folder = Path(tempfile.mkdtemp(prefix="autellix-soak-"))
    say(f"starting autellix serve: {ENGINES} engines, model {MODEL} (logs: {folder})")
    try:
        with serving(settings, keys, folder) as served:
            return asyncio.run(Soak(settings, served, keys).run())
    finally:
        (folder / "keys").unlink(missing_ok=True)


class Soak:
    """One run against a started serve: the agents, the misbehaving client, the
    kill and the watchers, and the result they add up to."""

    # Made in run(), with its HTTP session and the model the router serves.
    honest: HonestAgents
    tables: EngineTables
    mallory: Mallory
    watch: RouterWatch

    def __init__(self, settings: SoakSettings, served: Served, keys: Keys) -> None:
        self.settings = settings
        self.served = served
        self.keys = keys
        self.duration_s = settings.minutes * 60
        self.rng = random.Random(settings.seed)

    async def run(self) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            model = await self._model(http)
            client = AsyncOpenAI(
                base_url=self.served.url + "/v1", api_key=self.keys.alice, timeout=120
            )
            self.tables = EngineTables(http, self.served.engine_urls, self.keys.engine)
            self.honest = HonestAgents(
                client, model, self.settings.max_tokens, look_up=self.tables.scan
            )
            self.mallory = Mallory(
                http=http,
                served=self.served,
                key=self.keys.mallory,
                model=model,
                honest=self.honest,
                tables=self.tables,
                cap=self.settings.max_programs_per_key,
                rng=random.Random(self.settings.seed + 1),
            )
            try:
                return await self._load_and_faults(http)
            finally:
                await client.close()

    async def _model(self, http: aiohttp.ClientSession) -> str:
        headers = {"Authorization": f"Bearer {self.keys.alice}"}
        async with http.get(self.served.url + "/v1/models", headers=headers) as answer:
            return (await answer.json())["data"][0]["id"]

    async def _load_and_faults(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        settings = self.settings
        kill_at_s = settings.kill_at * self.duration_s
        rss_at_start = resident_mb(self.served.process.pid)
        say(
            f"running {settings.minutes:g} min: {settings.rate:g} programs/s, one engine"
            f" killed at {kill_at_s:.0f} s, a misbehaving client"
        )
        began = time.monotonic()
        until = began + self.duration_s
        self.watch = RouterWatch(
            self.served.url, self.keys.admin, self.served.process.pid,
            settings.health_interval_s, began,
        )  # fmt: skip
        self.watch.start()
        background = [
            asyncio.create_task(self.mallory.misbehave(began, until)),
            asyncio.create_task(_every(TABLE_SCAN_EVERY_S, until, self.tables.scan)),
            asyncio.create_task(_every(PROGRESS_EVERY_S, until, lambda: self._progress(began))),
        ]
        killing = asyncio.create_task(
            kill_and_watch(
                self.served,
                http,
                self.keys.admin,
                at=began + kill_at_s,
                began=began,
                engine=self.rng.randrange(ENGINES),
                timeout_s=settings.startup_timeout_s,
            )
        )
        try:
            unfinished = await self.honest.arrive(
                self.duration_s, settings.rate, self.rng, began, settings.drain_timeout_s
            )
            await asyncio.gather(*background)
            kill = await killing
            await self.tables.scan()
        finally:
            self.watch.stop()
            for task in (*background, killing):
                task.cancel()
        metrics = await _router_metrics(http, self.served.url, self.keys.admin)
        return self._result(kill, unfinished, metrics, rss_at_start, time.monotonic() - began)

    async def _progress(self, began: float) -> None:
        honest, watch = self.honest, self.watch
        worst, rss = watch.worst_ms, watch.rss_mb
        say(
            f"{time.monotonic() - began:.0f} s: {honest.programs} programs ({honest.completed}"
            f" done, {len(honest.live)} running, {honest.lost} lost), {honest.calls} calls;"
            f" {self.mallory.rounds} misbehaviour rounds; /health max {worst:.0f} ms;"
            f" router {rss:.0f} MB"
        )

    def _result(
        self,
        kill: Kill,
        unfinished: int,
        metrics: dict[str, Any],
        rss_at_start: float | None,
        seconds: float,
    ) -> dict[str, Any]:
        honest, mallory, watch = self.honest, self.mallory, self.watch
        lost = honest.lost + unfinished
        forged_accepted = len(self.tables.forged) + mallory.engine_accepted
        unexpected = sum(sum(t.unexpected.values()) for t in mallory.tallies.values())
        events = [*mallory.floods]
        if kill.back_in_rotation_s is not None:
            events.append(Event("engine down", kill.at_s, kill.at_s + kill.back_in_rotation_s))
        health = watch.summary(events)
        rss_mb = watch.watched.rss_mb
        failed_checks = [
            check
            for check, failed in (
                ("programs_lost", lost > 0),
                ("forged_accepted", forged_accepted > 0),
                ("misbehaviour_unexpected", unexpected > 0),
                ("engine_not_back", kill.back_in_rotation_s is None),
                ("engine_not_restarted", self.served.restarts < 1),
            )
            if failed
        ]
        settings = self.settings
        return {
            "programs": honest.programs,
            "programs_lost": lost,
            "engine_restarts": self.served.restarts,
            "forged_accepted": forged_accepted,
            "max_health_ms": health["max_ms"],
            "router_rss_mb": _rounded(rss_mb[-1] if rss_mb else None),
            "passed": not failed_checks,
            "failed_checks": failed_checks,
            "settings": {
                "minutes": settings.minutes,
                "rate": settings.rate,
                "seed": settings.seed,
                "max_tokens": settings.max_tokens,
                "engines": ENGINES,
                "model": MODEL,
                "max_programs_per_key": settings.max_programs_per_key,
            },
            "seconds": round(seconds, 1),
            "programs_by_kind": dict(honest.started),
            "programs_completed": honest.completed,
            "programs_unfinished": unfinished,
            "calls": honest.calls,
            "failures": dict(honest.failures),
            "failure_times_s": honest.failure_times[:20],
            "engine_deaths": self.served.deaths,
            "kill": vars(kill),
            "health": health,
            "router_rss_start_mb": _rounded(rss_at_start),
            "router_rss_max_mb": _rounded(max(rss_mb, default=None)),
            "misbehaviour_rounds": mallory.rounds,
            "misbehaviour_unexpected": unexpected,
            "misbehaviour": {kind: tally.summary() for kind, tally in mallory.tallies.items()},
            "engine_table_scans": self.tables.scans,
            "engine_table_lookups": self.tables.lookups,
            "largest_honest_service": round(self.tables.largest_service, 1),
            **metrics,
            "serve_pid": self.served.process.pid,
            "engine_groups": sorted(self.served.groups_seen),
            "load_average": [round(load, 2) for load in os.getloadavg()],
            "cpu_cores": os.cpu_count(),
        }


def _rounded(megabytes: float | None) -> float | None:
    return round(megabytes, 1) if megabytes is not None else None


async def _every(period_s: float, until: float, action: Callable[[], Awaitable[None]]) -> None:
    while time.monotonic() < until:
        await asyncio.sleep(min(period_s, max(0.0, until - time.monotonic())))
        await action()


_COUNTER = re.compile(r"^(autellix_router_(?:retries|errors)_total)\{([^}]*)\} (\S+)$", re.M)


async def _router_metrics(http: aiohttp.ClientSession, url: str, key: str) -> dict[str, Any]:
    """The router's retries (all engines) and its own error answers by code."""
    async with http.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"}) as answer:
        text = await answer.text()
    retries = 0
    errors: Counter[str] = Counter()
    for name, labels, value in _COUNTER.findall(text):
        if name == "autellix_router_retries_total":
            retries += int(float(value))
        elif found := re.search(r'code="([^"]+)"', labels):
            errors[found[1]] += int(float(value))
    return {"router_retries": retries, "router_errors": dict(errors)}
