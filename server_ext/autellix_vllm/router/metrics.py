"""The router's Prometheus metrics, on a registry of its own (served at ``/metrics``).

Series (all prefixed ``autellix_router_``):

* ``programs_active``: programs in the router's table;
* ``calls_total{engine, reason}``: calls sent to an engine, by the balancer's
  reason (``sticky``, ``bind``, ``least-loaded``, ``round-robin``, ``hash``);
* ``calls_without_program_total``: calls that carried no program id (each is
  routed on its own; a missing identity should be visible, not silent);
* ``retries_total{engine}``: calls retried elsewhere because ``engine`` failed them;
* ``engine_healthy{engine}`` (1/0) and ``engine_load{engine}`` (the load signal);
* ``errors_total{code}``: errors the router answered itself (4xx/5xx, by code);
* ``proxy_overhead_seconds``: time a non-streaming call spent in the router
  itself (its handling time minus the time waiting for the engine);
* ``call_seconds{key, class}``: a generation call's latency, from the router
  getting it to its answer relayed in full (a stream's last event), by the
  name of the caller's key (``anonymous`` on a router without keys) and the
  call's class (``interactive``, ``batch`` or a band's number: at most
  ``MAX_PRIORITY_BAND + 1`` values, so the series stay bounded by the keys):
  what each client and each class waits for a call, wherever the time went.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from autellix_vllm.protocol.identity import band_name

OVERHEAD_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.5,
)  # fmt: skip
# A call's latency: from a cache hit's few milliseconds to a long generation's minutes.
CALL_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip


class RouterMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.programs_active = Gauge(
            "autellix_router_programs_active", "Programs in the router's table", registry=r
        )
        self.calls = Counter(
            "autellix_router_calls",
            "Calls sent to an engine, by engine and routing reason",
            ["engine", "reason"],
            registry=r,
        )
        self.calls_without_program = Counter(
            "autellix_router_calls_without_program",
            "Calls that carried no program id",
            registry=r,
        )
        self.retries = Counter(
            "autellix_router_retries",
            "Calls retried on another engine after this engine failed them",
            ["engine"],
            registry=r,
        )
        self.engine_healthy = Gauge(
            "autellix_router_engine_healthy", "1 if the engine is in rotation", ["engine"],
            registry=r,
        )  # fmt: skip
        self.engine_load = Gauge(
            "autellix_router_engine_load",
            "Load signal: calls in flight from the router plus the engine's waiting queue",
            ["engine"],
            registry=r,
        )
        self.errors = Counter(
            "autellix_router_errors", "Errors answered by the router itself", ["code"], registry=r
        )
        self.proxy_overhead = Histogram(
            "autellix_router_proxy_overhead_seconds",
            "Time a non-streaming call spent in the router itself (not waiting for the engine)",
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.call_seconds = Histogram(
            "autellix_router_call_seconds",
            "Latency of a generation call, from its arrival to its answer relayed, by key name"
            " and class",
            ["key", "class"],
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.calls_held = Gauge(
            "autellix_router_calls_held",
            "Calls held at the router while the pool is saturated for their class",
            ["class"],
            registry=r,
        )
        self._calls_by_route: dict[tuple[str, str], Counter] = {}
        self._latency_by_key: dict[tuple[str, int], Histogram] = {}
        self._held_bands: set[int] = set()  # bands ever held: each reads 0 once empty

    def routed(self, engine: str, reason: str) -> None:
        """Count a call sent to ``engine`` for ``reason`` (labelled children are cached)."""
        child = self._calls_by_route.get((engine, reason))
        if child is None:
            child = self._calls_by_route[(engine, reason)] = self.calls.labels(engine, reason)
        child.inc()

    def answered(self, key_name: str, band: int, seconds: float) -> None:
        """Observe the latency of a call of ``band`` answered for the key named ``key_name``."""
        child = self._latency_by_key.get((key_name, band))
        if child is None:
            child = self.call_seconds.labels(key_name, band_name(band))
            self._latency_by_key[(key_name, band)] = child
        child.observe(seconds)

    def held(self, by_band: Mapping[int, int]) -> None:
        """Set the calls held at the flow-control gate now, by band (``router.flow_control``)."""
        self._held_bands |= by_band.keys()
        for band in self._held_bands:
            self.calls_held.labels(band_name(band)).set(by_band.get(band, 0))

    def retried(self, failed_engine: str) -> None:
        self.retries.labels(failed_engine).inc()

    def track_programs(self, count: Callable[[], int]) -> None:
        self.programs_active.set_function(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)
