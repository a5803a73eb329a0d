"""vLLM's own counters, read from engines' Prometheus ``/metrics``.

Stock vLLM and autellix's scheduler count preemptions and prefix-cache lookups
the same way, so benchmarks compare both schedulers on these numbers (autellix's
table counts only what its own scheduler does).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "vllm:num_preemptions": "preemptions",
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
}
"""vLLM's counter names (as the parser gives them, without ``_total``) and ours."""


def read_counters(engine_urls: Iterable[str], timeout_s: float = 30.0) -> dict[str, float]:
    """:data:`COUNTERS`, summed over ``engine_urls`` (and over each engine's labels)."""
    totals = dict.fromkeys(COUNTERS.values(), 0.0)
    for url in engine_urls:
        with urllib.request.urlopen(url + "/metrics", timeout=timeout_s) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            name = COUNTERS.get(family.name)
            if name is None:
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    totals[name] += sample.value
    return totals


def counted_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """What the engines counted between two readings, with the prefix-cache hit
    rate over that span (``None`` when nothing was looked up)."""
    differences = {name: after[name] - before[name] for name in before}
    queries = differences["prefix_cache_queries"]
    hits = differences["prefix_cache_hits"]
    counted: dict[str, float | None] = {**differences}
    counted["prefix_cache_hit_rate"] = round(hits / queries, 4) if queries else None
    return counted
