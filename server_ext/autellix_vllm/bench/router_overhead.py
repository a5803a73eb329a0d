"""What the router adds to a call, measured alone: ``autellix bench router-overhead``.

Three processes on loopback: a minimal upstream that answers at once
(:mod:`autellix_vllm.bench.fake_upstream`), the router in front of it
(``autellix serve --upstream``, exactly as deployed), and this load generator,
which speaks HTTP/1.1 over raw asyncio streams (keep-alive, one call in flight
per connection) so that it costs as little CPU as possible.

* Latency: one connection to the upstream and one to the router, calls
  alternating between them; the router's overhead is the difference of the
  medians (p50) and of the 99th percentiles.
* Throughput: ``concurrency`` connections to the router for ``seconds``; the
  completed calls per second.
* The router's own view: the median of its ``proxy_overhead_seconds``
  histogram (handling time minus engine time, interpolated within buckets).

Every call is a chat completion tagged with a program id (one per connection),
so the router does its full work: parsing, identity checks, the process table,
the balancer, prior service, usage accounting and metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import statistics
import time
from typing import Any

from autellix_vllm.bench.fake_upstream import MODEL
from autellix_vllm.bench.subprocesses import (
    FAKE_UPSTREAM_COMMAND,
    FAKE_UPSTREAM_READY,
    ROUTER_READY,
    cpu_seconds,
    router_command,
    running,
)
from autellix_vllm.protocol.identity import PROGRAM_ID_HEADER
from autellix_vllm.protocol.paths import CHAT_COMPLETIONS_PATH
from autellix_vllm.stats import percentile

_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")
_BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 1}
).encode()


class Connection:
    """One keep-alive HTTP/1.1 connection posting the same chat call."""

    def __init__(self, host: str, port: int, program_id: str) -> None:
        self.host, self.port = host, port
        self.request = (
            f"POST {CHAT_COMPLETIONS_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(_BODY)}\r\n"
            f"{PROGRAM_ID_HEADER}: {program_id}\r\n\r\n"
        ).encode() + _BODY
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def call(self) -> float:
        """One call; returns its latency in seconds."""
        assert self.reader is not None and self.writer is not None
        started = time.perf_counter()
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        match = _CONTENT_LENGTH.search(head)
        if not head.startswith(b"HTTP/1.1 200") or match is None:
            raise RuntimeError(f"unexpected answer: {head[:200]!r}")
        await self.reader.readexactly(int(match.group(1)))
        return time.perf_counter() - started

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError):
                await self.writer.wait_closed()


async def measure_latency(
    direct: tuple[str, int], routed: tuple[str, int], calls: int, warmup: int
) -> dict[str, float]:
    upstream = await Connection(*direct, "bench-direct").open()
    router = await Connection(*routed, "bench-latency").open()
    try:
        for _ in range(warmup):
            await upstream.call()
            await router.call()
        direct_s, routed_s = [], []
        for _ in range(calls):
            direct_s.append(await upstream.call())
            routed_s.append(await router.call())
    finally:
        await upstream.close()
        await router.close()
    return {
        "calls": calls,
        "direct_p50_ms": _ms(statistics.median(direct_s)),
        "routed_p50_ms": _ms(statistics.median(routed_s)),
        "overhead_p50_ms": _ms(statistics.median(routed_s) - statistics.median(direct_s)),
        "direct_p99_ms": _ms(percentile(direct_s, 99)),
        "routed_p99_ms": _ms(percentile(routed_s, 99)),
        "overhead_p99_ms": _ms(percentile(routed_s, 99) - percentile(direct_s, 99)),
    }


async def measure_throughput(
    target: tuple[str, int], concurrency: int, seconds: float, server_pid: int | None = None
) -> dict[str, Any]:
    """Calls/s over ``concurrency`` connections; with ``server_pid``, also the CPU time
    that process spent per call (independent of what else the machine runs)."""
    connections = [await Connection(*target, f"bench-load-{i}").open() for i in range(concurrency)]
    latencies: list[float] = []
    stop_at = 0.0

    async def drive(connection: Connection) -> None:
        while time.perf_counter() < stop_at:
            latencies.append(await connection.call())

    try:
        stop_at = time.perf_counter() + 1.0  # warm up
        await asyncio.gather(*(drive(c) for c in connections))
        latencies.clear()
        cpu_before = cpu_seconds(server_pid) if server_pid else None
        started = time.perf_counter()
        stop_at = started + seconds
        await asyncio.gather(*(drive(c) for c in connections))
        elapsed = time.perf_counter() - started
        cpu_after = cpu_seconds(server_pid) if server_pid else None
    finally:
        for connection in connections:
            await connection.close()
    return {
        "concurrency": concurrency,
        "seconds": round(elapsed, 2),
        "calls": len(latencies),
        "calls_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": _ms(statistics.median(latencies)),
        "p99_ms": _ms(percentile(latencies, 99)),
        "server_cpu_ms_per_call": (
            _ms((cpu_after - cpu_before) / len(latencies))
            if cpu_before is not None and cpu_after is not None
            else None
        ),
    }


def histogram_median_ms(metrics_text: str, name: str) -> float | None:
    """The median of a Prometheus histogram, interpolated linearly within its bucket."""
    buckets = [
        (float(bound), float(count))
        for bound, count in re.findall(
            rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', metrics_text, re.MULTILINE
        )
    ]
    if not buckets or buckets[-1][1] == 0:
        return None
    half = buckets[-1][1] / 2
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= half:
            if bound == float("inf"):
                return _ms(lower_bound)
            share = (half - lower_count) / (count - lower_count) if count > lower_count else 0
            return _ms(lower_bound + share * (bound - lower_bound))
        lower_bound, lower_count = bound, count
    return None


async def _router_metrics(host: str, port: int) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return data.split(b"\r\n\r\n", 1)[1].decode()


def run_router_overhead(
    seconds: float = 10.0, concurrency: int = 32, latency_calls: int = 2000
) -> dict[str, Any]:
    with running(FAKE_UPSTREAM_COMMAND, FAKE_UPSTREAM_READY) as upstream:
        upstream_url = f"http://127.0.0.1:{upstream.ready}"
        with running(router_command([upstream_url]), ROUTER_READY) as router:
            direct = ("127.0.0.1", int(upstream.ready))
            routed = ("127.0.0.1", int(router.ready.rsplit(":", 1)[1]))
            return asyncio.run(
                _measure(direct, routed, router.pid, seconds, concurrency, latency_calls)
            )


async def _measure(
    direct: tuple[str, int],
    routed: tuple[str, int],
    router_pid: int,
    seconds: float,
    concurrency: int,
    latency_calls: int,
) -> dict[str, Any]:
    latency = await measure_latency(direct, routed, latency_calls, warmup=200)
    throughput = await measure_throughput(routed, concurrency, seconds, router_pid)
    metrics = await _router_metrics(*routed)
    return {
        "latency": latency,
        "throughput": throughput,
        "router_reported_overhead_p50_ms": histogram_median_ms(
            metrics, "autellix_router_proxy_overhead_seconds"
        ),
        "targets": {"overhead_p50_ms_at_most": 2.0, "calls_per_s_at_least": 1000},
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
