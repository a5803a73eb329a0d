"""The soak's watch on the router: ``GET /health`` every 100 ms and serve's resident
memory, from a process of its own, and where the slowest probes' time went.

Part of ``autellix bench soak`` (:mod:`autellix_vllm.bench.soak`).
"""

from __future__ import annotations

import contextlib
import http.client
import multiprocessing
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


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
