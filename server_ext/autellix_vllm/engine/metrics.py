"""The engine's ``autellix_*`` Prometheus series, read from its process table.

vLLM's API server serves its default registry at ``/metrics``; the endpoint
plugin registers :class:`TableCollector` there once per process
(:func:`register_metrics`). The collector reads the latest table snapshot the
plugin keeps (refreshed from the engine about once a second), so a scrape never
waits for the engine. This module needs only prometheus-client: what the
engines export can be read without vLLM (a dashboard's test does).

Series (counters end in ``_total`` on the wire):

* ``autellix_programs``, ``autellix_running_calls``: gauges of the table;
* ``autellix_queue_depth{level}``: waiting calls per priority level;
* the table's counters (:data:`COUNTERS`) and its labelled ones
  (:data:`LABELLED_COUNTERS`): preemptions, promotions, calls;
* under a KV-aware policy, the holds (``policy/residency.py``):
  ``autellix_held_programs`` and ``autellix_held_blocks`` (gauges: idle
  contexts held now, and their KV blocks), and ``autellix_holds_total{event}``,
  one series per key of ``Residency.counters()`` (``granted``, ``refused``,
  ``taken``, ``expired``, ``broken``, ``cut``).

(With ``--api-server-count > 1`` vLLM serves a multiprocess registry that these
series do not reach.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Monotonic counters of the snapshot -> (metric name, help).
COUNTERS = {
    "preemptions": ("autellix_preemptions", "Running calls preempted (both kinds)"),
    "kv_preemptions": (
        "autellix_kv_preemptions",
        "Running calls vLLM preempted when KV blocks ran out (the others: for better waiters)",
    ),
    "promotions": ("autellix_promotions", "Waiting calls promoted by anti-starvation"),
    "demotions": ("autellix_demotions", "Calls demoted a level after spending their quantum"),
    "calls_admitted": ("autellix_calls_admitted", "Calls registered in the process table"),
    "calls_finished": ("autellix_calls_finished", "Calls completed (including aborts)"),
    "calls_aborted": ("autellix_calls_aborted", "Calls aborted before completing"),
    "calls_without_identity": (
        "autellix_calls_without_identity",
        "Calls that arrived without a program id (each ran as its own program)",
    ),
}
# Monotonic counters of the snapshot by a label -> (metric name, help, label).
LABELLED_COUNTERS = {
    "calls_over_limit": (
        "autellix_calls_over_limit",
        "Calls that would have crossed a program limit (each ran as its own program)",
        "limit",
    ),
    "hook_failures": (
        "autellix_hook_failures",
        "Failures of the Autellix scheduler confined to one call, by hook",
        "hook",
    ),
    "waiter_preemptions": (
        "autellix_waiter_preemptions",
        "Running calls preempted for a better-level waiting call, by what it lacked",
        "reason",
    ),
}
# The residency snapshot's gauges (engine.block_holds.EngineResidency.snapshot).
HELD_GAUGES = {
    "held_programs": ("autellix_held_programs", "Programs whose idle context the engine holds"),
    "held_blocks": ("autellix_held_blocks", "KV blocks of the held idle contexts"),
}
# Its counters (Residency.counters(): "holds_<event>") become one labelled series.
HOLD_EVENT_PREFIX = "holds_"
HOLDS = (
    "autellix_holds",
    "Hold events: granted, refused (no room), taken (the next call used it), expired,"
    " broken (a better-ranked call needed its blocks), cut (a hint's claim cut to the"
    " engine's estimate for its owner's fair share)",
    "event",
)


class TableCollector(Collector):
    """The series of the module docstring, from the table snapshot ``latest`` gives."""

    def __init__(self, latest: Callable[[], dict[str, Any]]) -> None:
        self.latest = latest

    def collect(self) -> Iterator[Metric]:
        snapshot = self.latest()
        if "queue_depth" not in snapshot:  # not fetched yet, or stock vLLM's scheduler
            return iter(())
        return families(snapshot)

    def describe(self) -> Iterator[Metric]:
        """Every family this collector may export, without samples (what a registry
        checks for name clashes, and what a dashboard may query)."""
        return families({})


def families(snapshot: dict[str, Any]) -> Iterator[Metric]:
    """The metric families of a table ``snapshot``; a value the snapshot lacks
    leaves its family without samples."""
    programs = GaugeMetricFamily("autellix_programs", "Programs in the process table", labels=[])
    if "queue_depth" in snapshot:
        programs.add_metric([], snapshot.get("programs_count", len(snapshot.get("programs", ()))))
    yield programs
    yield _gauge("autellix_running_calls", "Calls in the running batch", snapshot.get("running"))
    depth = GaugeMetricFamily(
        "autellix_queue_depth", "Waiting calls per priority level", labels=["level"]
    )
    for level, count in enumerate(snapshot.get("queue_depth", [])):
        depth.add_metric([str(level)], count)
    yield depth
    for key, (name, help_text) in COUNTERS.items():
        counter = CounterMetricFamily(name, help_text, labels=[])
        if key in snapshot:
            counter.add_metric([], snapshot[key])
        yield counter
    for key, (name, help_text, label) in LABELLED_COUNTERS.items():
        yield _labelled_counter(name, help_text, label, snapshot.get(key, {}))
    residency = snapshot.get("residency", {})
    for key, (name, help_text) in HELD_GAUGES.items():
        yield _gauge(name, help_text, residency.get(key))
    events = {
        key.removeprefix(HOLD_EVENT_PREFIX): count
        for key, count in residency.items()
        if key.startswith(HOLD_EVENT_PREFIX)
    }
    yield _labelled_counter(*HOLDS, events)


def _gauge(name: str, help_text: str, value: float | None) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, help_text, labels=[])
    if value is not None:
        gauge.add_metric([], value)
    return gauge


def _labelled_counter(
    name: str, help_text: str, label: str, counts: dict[str, float]
) -> CounterMetricFamily:
    counter = CounterMetricFamily(name, help_text, labels=[label])
    for value, count in counts.items():
        counter.add_metric([value], count)
    return counter


_collector: TableCollector | None = None


def register_metrics(latest: Callable[[], dict[str, Any]]) -> None:
    """Register a collector of the snapshots ``latest`` gives on the default
    registry, once per process."""
    global _collector
    if _collector is None:
        _collector = TableCollector(latest)
        REGISTRY.register(_collector)
