"""Locality-aware routing vs round-robin on real engines: ``autellix bench router``.

One run starts the engines once (the embedded tiny model, Autellix scheduler)
and replays the same seeded workload through the router twice, once with
``round-robin`` and once with ``locality`` (paper Algorithm 2), each time with
a fresh ``autellix serve --upstream`` router in front of the same engines.

The workload is the engine benchmark's (:mod:`autellix_vllm.bench.engine`):
multi-call programs whose calls carry the program's growing transcript, so a
program's later calls share a long prefix with its earlier ones. The two runs
use different program ids, hence different transcripts, so the second run
finds nothing of the first in the prefix caches.

Reported per policy: the paper's program latency per token (avg, P95), the
makespan, the engines' prefix-cache hit rate over the run (vLLM's own
counters), the calls per routing reason, and how many programs ran all their
calls on one engine. ``avg_ratio`` = round-robin avg / locality avg (> 1 means
locality is faster).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from dataclasses import replace
from typing import Any

from autellix_vllm.bench.engine import (
    BenchSettings,
    build_workload,
    engine_config,
    replay,
    summarize,
)
from autellix_vllm.bench.subprocesses import ROUTER_READY, router_command, running
from autellix_vllm.launcher import EngineProcess
from autellix_vllm.serve_cli import stop_all
from autellix_vllm.tiny_model import SERVED_MODEL_NAME

POLICIES = ("round-robin", "locality")
_PREFIX_CACHE = re.compile(r"^vllm:prefix_cache_(queries|hits)_total(?:\{[^}]*\})? (\S+)$", re.M)


def router_bench_settings(**overrides: Any) -> BenchSettings:
    """The engine benchmark's settings, with longer prompts: the sharegpt
    transcripts grow to several hundred tokens, past the lowered threshold."""
    defaults: dict[str, Any] = {"programs": 32, "token_scale": 0.5, "max_decode": 32}
    return BenchSettings(**{**defaults, **overrides})


def run_router_bench(
    settings: BenchSettings,
    threshold: int = 256,
    engines: int = 2,
    upstreams: list[str] | None = None,
    vllm_args: list[str] | None = None,
) -> dict[str, Any]:
    programs = build_workload(settings)
    started: list[EngineProcess] = []
    try:
        if upstreams is None:
            started = _start_engines(settings, engines, vllm_args or [])
            upstreams = [engine.base_url for engine in started]
        results = {
            policy: _run_policy(policy, programs, upstreams, settings, threshold)
            for policy in POLICIES
        }
    finally:
        stop_all(started)
    rr, loc = results["round-robin"], results["locality"]
    return {
        "settings": {
            "programs": settings.programs,
            "workload": settings.workload,
            "seed": settings.seed,
            "rate": settings.rate,
            "token_scale": settings.token_scale,
            "max_num_seqs": settings.max_num_seqs,
            "max_model_len": settings.max_model_len,
            "engines": len(upstreams),
            "locality_threshold": threshold,
            "vllm_args": vllm_args or [],
        },
        **results,
        "avg_ratio": rr["avg_latency_per_token_s"] / loc["avg_latency_per_token_s"],
        "p95_ratio": rr["p95_latency_per_token_s"] / loc["p95_latency_per_token_s"],
    }


def _start_engines(
    settings: BenchSettings, count: int, vllm_args: list[str]
) -> list[EngineProcess]:
    config = replace(engine_config("autellix", settings), extra_args=list(vllm_args))
    engines = [EngineProcess(config) for _ in range(count)]
    try:
        for engine in engines:
            engine.start()
        for engine in engines:
            engine.wait_healthy()
    except BaseException:
        stop_all(engines)
        raise
    return engines


def _run_policy(
    policy: str,
    programs: list[Any],
    upstreams: list[str],
    settings: BenchSettings,
    threshold: int,
) -> dict[str, Any]:
    # Fresh ids, hence fresh transcripts: nothing cached by the other policy's run helps.
    renamed = [replace(p, program_id=f"{policy}/{p.program_id}") for p in programs]
    options = ["--lb", policy, "--locality-threshold", str(threshold), "--chars-per-token", "1"]
    with running(router_command(upstreams, *options), ROUTER_READY) as router:
        router_url = router.ready
        cache_before = _prefix_cache(upstreams)
        began = time.monotonic()
        results = asyncio.run(replay(router_url, SERVED_MODEL_NAME, renamed, settings))
        summary = summarize(results, time.monotonic() - began)
        cache_after = _prefix_cache(upstreams)
        table = _get_json(router_url + "/autellix/v1/programs")
        metrics = _get_text(router_url + "/metrics")
    queries = cache_after["queries"] - cache_before["queries"]
    hits = cache_after["hits"] - cache_before["hits"]
    summary["prefix_cache_hit_rate"] = round(hits / queries, 4) if queries else None
    summary["calls_by_reason"] = _calls_by_reason(metrics)
    summary["programs_on_one_engine"] = sum(1 for p in table["programs"] if len(p["engines"]) == 1)
    return summary


def _prefix_cache(upstreams: list[str]) -> dict[str, float]:
    totals = {"queries": 0.0, "hits": 0.0}
    for url in upstreams:
        for kind, value in _PREFIX_CACHE.findall(_get_text(url + "/metrics")):
            totals[kind] += float(value)
    return totals


def _calls_by_reason(metrics: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reason, value in re.findall(
        r'^autellix_router_calls_total\{[^}]*reason="([^"]+)"[^}]*\} (\S+)$', metrics, re.M
    ):
        counts[reason] = counts.get(reason, 0) + int(float(value))
    return counts


def _get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.read().decode()


def _get_json(url: str) -> Any:
    return json.loads(_get_text(url))
