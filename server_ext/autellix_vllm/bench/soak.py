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

This module runs the parts and adds up the result; each part is a module of its
own: ``soak_serve`` (serve and the run's settings), ``soak_agents`` (the honest
agents), ``soak_mallory`` (the misbehaving client and the engine-table scan),
``soak_kill`` (the engine kill) and ``soak_watch`` (the router's health and memory).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from autellix import AsyncOpenAI

from autellix_vllm.bench.soak_agents import HonestAgents
from autellix_vllm.bench.soak_kill import Kill, kill_and_watch
from autellix_vllm.bench.soak_mallory import EngineTables, Mallory
from autellix_vllm.bench.soak_serve import ENGINES, MODEL, Keys, Served, SoakSettings, say, serving
from autellix_vllm.bench.soak_watch import Event, RouterWatch, resident_mb

TABLE_SCAN_EVERY_S = 2.0
PROGRESS_EVERY_S = 30.0


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
