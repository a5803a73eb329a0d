"""Locality-aware routing vs round-robin on real engines: ``autellix bench router``.

One run replays the same seeded workload through the router twice, once with
``round-robin`` and once with ``locality`` (paper Algorithm 2), each through an
``autellix serve --upstream`` router in front of two real engines (the embedded
tiny model, Autellix scheduler). By default the two policies take turns on the
same pair of engines. ``--side-by-side`` gives each policy its own pair and runs
both at once, which shares background load between them but needs a core per
engine: on 2 cores, engines side by side crowd each other out unevenly
(docs/benchmarks.md, engine benchmark).

The workload is the engine benchmark's (:mod:`autellix_vllm.bench.replay`):
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
import contextlib
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from autellix_vllm.bench.replay import (
    BenchSettings,
    build_workload,
    engine_config,
    gather_all,
    probe_speed,
    replay,
    summarize,
)
from autellix_vllm.bench.subprocesses import ROUTER_READY, router_command, running
from autellix_vllm.bench.vllm_counters import counted_between, read_counters
from autellix_vllm.engine.launcher import EngineProcess, start_all, stop_all
from autellix_vllm.router.admin_client import fetch_table
from autellix_vllm.workloads.trace import ProgramSpec

POLICIES = ("round-robin", "locality")


def router_bench_settings(**overrides: Any) -> BenchSettings:
    """The engine benchmark's settings, with longer prompts: the sharegpt
    transcripts grow to several hundred tokens, past the lowered threshold. On
    the tiny model, whose one character a token --chars-per-token 1 counts exactly."""
    defaults: dict[str, Any] = {
        "programs": 32, "workload": "sharegpt", "rate": 4.0, "token_scale": 0.5,
        "max_decode": 32, "max_num_seqs": 4, "model": "tiny",
    }  # fmt: skip
    return BenchSettings(**{**defaults, **overrides})


# Settings of the engine benchmark that mean nothing here.
_ENGINE_BENCH_ONLY = ("schedulers", "side_by_side", "identity")


def run_router_bench(
    settings: BenchSettings,
    threshold: int = 256,
    engines: int = 2,
    upstreams: list[str] | None = None,
    vllm_args: list[str] | None = None,
    side_by_side: bool = False,
    chars_per_token: float = 1.0,
) -> dict[str, Any]:
    """Both policies on the same workload; ``avg_ratio`` > 1 means locality is faster.

    By default the policies take turns on the same ``engines`` engines. Side by
    side, each policy gets its own ``engines`` engines and both replays run at
    the same time. Given ``upstreams``, the policies take turns on those.
    """
    programs = build_workload(settings)
    side_by_side = side_by_side and upstreams is None
    started: list[EngineProcess] = []
    try:
        if upstreams is None:
            groups = len(POLICIES) if side_by_side else 1
            started = _start_engines(settings, engines * groups, vllm_args or [])
            upstreams = [engine.base_url for engine in started]
            # A fresh engine's first calls are slow; without a warm-up the policy
            # that runs first would pay for it (seed 1: a 5x ratio).
            asyncio.run(gather_all(*(probe_speed(engine, settings) for engine in started)))
        if side_by_side:
            pools = {p: upstreams[i * engines : (i + 1) * engines] for i, p in enumerate(POLICIES)}
            with contextlib.ExitStack() as stack:
                routers = {
                    p: stack.enter_context(_router(p, pools[p], threshold, chars_per_token))
                    for p in POLICIES
                }
                runs = [_measure(p, routers[p], pools[p], programs, settings) for p in POLICIES]
                results = dict(zip(POLICIES, asyncio.run(gather_all(*runs)), strict=True))
        else:
            results = {}
            for policy in POLICIES:
                with _router(policy, upstreams, threshold, chars_per_token) as router_url:
                    run = _measure(policy, router_url, upstreams, programs, settings)
                    results[policy] = asyncio.run(run)
    finally:
        stop_all(started)
    rr, loc = results["round-robin"], results["locality"]
    return {
        "settings": {
            **{k: v for k, v in asdict(settings).items() if k not in _ENGINE_BENCH_ONLY},
            "engines_per_policy": engines if side_by_side else len(upstreams),
            "side_by_side": side_by_side,
            "locality_threshold": threshold,
            "chars_per_token": chars_per_token,
            "vllm_args": vllm_args or [],
        },
        **results,
        "avg_ratio": rr["avg_latency_per_token_s"] / loc["avg_latency_per_token_s"],
        "p95_ratio": rr["p95_latency_per_token_s"] / loc["p95_latency_per_token_s"],
    }


def _start_engines(
    settings: BenchSettings, count: int, vllm_args: list[str]
) -> list[EngineProcess]:
    config = replace(engine_config("autellix", settings, count), extra_args=list(vllm_args))
    return start_all([config] * count)


@contextlib.contextmanager
def _router(
    policy: str, upstreams: list[str], threshold: int, chars_per_token: float
) -> Iterator[str]:
    """``autellix serve --upstream ...`` with ``policy``; yields its root URL."""
    options = ["--lb", policy, "--locality-threshold", str(threshold),
               "--chars-per-token", str(chars_per_token)]  # fmt: skip
    with running(router_command(upstreams, *options), ROUTER_READY) as router:
        yield router.ready


async def _measure(
    policy: str,
    router_url: str,
    upstreams: list[str],
    programs: list[ProgramSpec],
    settings: BenchSettings,
) -> dict[str, Any]:
    # Fresh ids, hence fresh transcripts: nothing cached by the other policy's run helps.
    renamed = [replace(p, program_id=f"{policy}/{p.program_id}") for p in programs]
    counters_before = await asyncio.to_thread(read_counters, upstreams)
    began = time.monotonic()
    # From the router: engines with a key answer /v1/models only to its holder.
    model = (await asyncio.to_thread(_get_json, router_url + "/v1/models"))["data"][0]["id"]
    results = await replay(router_url, model, renamed, settings)
    summary = summarize(results, time.monotonic() - began)
    counters_after = await asyncio.to_thread(read_counters, upstreams)
    table = await asyncio.to_thread(fetch_table, router_url, None)  # every page
    metrics = await asyncio.to_thread(_get_text, router_url + "/metrics")
    counted = counted_between(counters_before, counters_after)
    summary["prefix_cache_hit_rate"] = counted["prefix_cache_hit_rate"]
    summary["calls_by_reason"] = _calls_by_reason(metrics)
    summary["programs_on_one_engine"] = sum(1 for p in table["programs"] if len(p["engines"]) == 1)
    return summary


def _calls_by_reason(metrics: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics):
        if family.name != "autellix_router_calls":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and "reason" in sample.labels:
                reason = sample.labels["reason"]
                counts[reason] = counts.get(reason, 0) + int(sample.value)
    return counts


def _get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.read().decode()


def _get_json(url: str) -> Any:
    return json.loads(_get_text(url))
