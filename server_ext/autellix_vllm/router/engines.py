"""The engines behind the router: their health, models and load.

Each engine is probed every ``health_interval_s``: ``GET /health`` decides
whether it is in rotation, ``GET /v1/models`` which models it serves, and
``GET /autellix/v1/engine/table?summary=1`` how many calls wait in its queue
and how many seats its batch has (an engine without the Autellix extension
has no table: its queue counts as empty, its seats as unknown). The summary
has no program rows, so a probe costs the same however many programs an
engine holds. How long each program waited on the engines is
asked only when a listing needs it, for the programs it shows
(:meth:`EnginePool.program_waits`).

Load signal (what LEAST_USED minimises): the calls the router has in flight on
the engine plus the engine's waiting queue from its last table. Waiting calls
sent by this router are thereby counted twice, which weighs an engine that
queues more heavily than one that keeps up.

Out of rotation: after ``health_failures`` failed probes in a row, at once when
the connection is refused, or when a call could not reach it (then it is
re-probed right away). Back in rotation after one good probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from autellix_vllm.protocol.paths import ENGINE_TABLE_MAX_IDS, ENGINE_TABLE_PATH
from autellix_vllm.router.metrics import RouterMetrics

log = logging.getLogger("autellix.router")

HEALTH_PATH = "/health"
MODELS_PATH = "/v1/models"
TABLE_SUMMARY_PATH = ENGINE_TABLE_PATH + "?summary=1"
# Failures of the connection to an engine, not of the client's: before the answer's
# head the engine did no work for the call, so it may go to another engine.
ENGINE_CONNECTION_FAILURES = (
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
    TimeoutError,
)
# The headers of an engine's answer that the client gets too.
_PASSED_BACK_HEADERS = ("Content-Type", "X-Request-Id")


def passed_back_headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    """The headers of an engine's answer that its client gets: type and request id."""
    headers = upstream.headers
    return {name: headers[name] for name in _PASSED_BACK_HEADERS if name in headers}


@dataclass(eq=False)
class Engine:
    name: str
    url: str
    healthy: bool = False
    # Calls this router has sent and not yet seen answered.
    in_flight: int = 0
    # From the engine's last table: its waiting queue and running batch.
    waiting: int = 0
    running: int = 0
    # Its batch size (max_num_seqs), from its table; None: it has none.
    seats: int | None = None
    failed_probes: int = 0
    last_error: str | None = None
    # Model id -> the engine's /v1/models entry for it.
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Unit the engine measures service in ("tokens", "time"), None if it has no table.
    service_unit: str | None = None

    @property
    def load(self) -> int:
        return self.in_flight + self.waiting

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "healthy": self.healthy,
            "load": self.load,
            "in_flight": self.in_flight,
            "waiting": self.waiting,
            "running": self.running,
            "seats": self.seats,
            "models": sorted(self.models),
            "last_error": self.last_error,
        }


class EnginePool:
    """All engines, with a background task that keeps their state fresh."""

    def __init__(
        self,
        urls: tuple[str, ...],
        session: aiohttp.ClientSession,
        metrics: RouterMetrics,
        *,
        interval_s: float,
        timeout_s: float,
        failures_to_drop: int,
    ) -> None:
        self.engines = [Engine(f"engine-{i}", url) for i, url in enumerate(urls)]
        self.by_name = {engine.name: engine for engine in self.engines}
        self.session = session
        self.metrics = metrics
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.failures_to_drop = failures_to_drop
        # Called when an engine leaves rotation (the dispatcher rebinds its programs).
        self.on_down: Callable[[Engine], None] = lambda engine: None
        self._healthy: list[Engine] = []
        self._models: dict[str, dict[str, Any]] = {}
        self._task: asyncio.Task[None] | None = None
        self._probing: dict[str, asyncio.Task[None]] = {}
        for engine in self.engines:
            self._publish(engine)

    def healthy(self) -> list[Engine]:
        """Engines in rotation, in a stable order (a cached list: do not mutate)."""
        return self._healthy

    def models(self) -> dict[str, dict[str, Any]]:
        """Every model a healthy engine serves -> its /v1/models entry (cached)."""
        return self._models

    def seats(self) -> int | None:
        """The healthy engines' seats summed; None if one of them does not say
        (the flow-control gate's pool, ``router.flow_control``)."""
        seats = [engine.seats for engine in self._healthy]
        if not seats or None in seats:
            return None
        return sum(s for s in seats if s is not None)

    async def start(self) -> None:
        """Probe every engine once, then keep probing in the background."""
        await asyncio.gather(*(self.probe(engine) for engine in self.engines))
        self._task = asyncio.create_task(self._probe_forever(), name="autellix-health")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._probing.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def call_failed(self, engine: Engine, error: BaseException) -> None:
        """A call could not reach ``engine``: out of rotation if refused, else re-probe now."""
        if isinstance(error, aiohttp.ClientConnectorError):
            self.mark_down(engine, f"connection refused: {error}")
        elif engine.name not in self._probing:
            task = asyncio.create_task(self.probe(engine), name=f"probe-{engine.name}")
            self._probing[engine.name] = task
            task.add_done_callback(lambda _: self._probing.pop(engine.name, None))

    async def probe(self, engine: Engine) -> None:
        try:
            async with self.session.get(engine.url + HEALTH_PATH, timeout=self.timeout) as answer:
                if answer.status != 200:
                    self._probe_failed(engine, f"/health answered {answer.status}")
                    return
            models = await self._get_json(engine, MODELS_PATH)
            table = await self._get_json(engine, TABLE_SUMMARY_PATH, missing_ok=True)
        except aiohttp.ClientConnectorError as error:
            self.mark_down(engine, f"connection refused: {error}")
            return
        except (TimeoutError, aiohttp.ClientError, ValueError) as error:
            self._probe_failed(engine, f"{type(error).__name__}: {error}")
            return
        if not isinstance(models, dict) or not isinstance(models.get("data"), list):
            self._probe_failed(engine, f"{MODELS_PATH} is not a model list")
            return
        engine.models = {
            entry["id"]: entry
            for entry in models["data"]
            if isinstance(entry, dict) and isinstance(entry.get("id"), str)
        }
        self._read_table(engine, table)
        self.mark_up(engine)
        self.metrics.engine_load.labels(engine.name).set(engine.load)

    def mark_up(self, engine: Engine) -> None:
        """A good probe: back in rotation."""
        engine.failed_probes = 0
        engine.last_error = None
        if not engine.healthy:
            log.info("%s (%s) is healthy", engine.name, engine.url)
            engine.healthy = True
        self._publish(engine)  # also when its models changed

    def mark_down(self, engine: Engine, reason: str) -> None:
        """Out of rotation; its programs are rebound (``on_down``)."""
        engine.last_error = reason
        if not engine.healthy:
            return
        log.warning("%s (%s) is out of rotation: %s", engine.name, engine.url, reason)
        engine.healthy = False
        engine.waiting = engine.running = 0
        self._publish(engine)
        self.on_down(engine)

    async def program_waits(self, program_ids: list[str]) -> dict[str, float]:
        """Program id -> the waiting time the healthy engines with a table report
        for it, summed (programs no engine knows are left out). Asked of the
        engines now, for these programs only; an engine that does not answer
        within the probe timeout counts nothing."""
        if not program_ids:
            return {}
        engines = [e for e in self._healthy if e.service_unit is not None]
        answers = await asyncio.gather(
            *(
                self._program_waits(engine, program_ids[start : start + ENGINE_TABLE_MAX_IDS])
                for engine in engines
                for start in range(0, len(program_ids), ENGINE_TABLE_MAX_IDS)
            )
        )
        waits: dict[str, float] = {}
        for answer in answers:
            for program_id, wait in answer.items():
                waits[program_id] = waits.get(program_id, 0.0) + wait
        return waits

    async def _program_waits(self, engine: Engine, program_ids: list[str]) -> dict[str, float]:
        try:
            async with self.session.post(
                engine.url + ENGINE_TABLE_PATH,
                json={"program_ids": program_ids},
                timeout=self.timeout,
            ) as answer:
                if answer.status != 200:
                    raise ValueError(f"{ENGINE_TABLE_PATH} answered {answer.status}")
                table = await answer.json(content_type=None)
            return {
                p["program_id"]: float(p.get("waiting_time") or 0.0)
                for p in table.get("programs", [])
                if isinstance(p, dict) and isinstance(p.get("program_id"), str)
            }
        except (TimeoutError, aiohttp.ClientError, ValueError, TypeError, AttributeError) as error:
            log.info("%s: no waiting times: %s: %s", engine.name, type(error).__name__, error)
            return {}

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await asyncio.gather(*(self.probe(engine) for engine in self.engines))

    async def _get_json(self, engine: Engine, path: str, missing_ok: bool = False) -> Any:
        async with self.session.get(engine.url + path, timeout=self.timeout) as answer:
            if missing_ok and answer.status == 404:
                return None
            if answer.status != 200:
                raise ValueError(f"{path} answered {answer.status}")
            return await answer.json(content_type=None)

    @staticmethod
    def _read_table(engine: Engine, table: Any) -> None:
        if not isinstance(table, dict) or not table.get("enabled", False):
            engine.waiting, engine.running, engine.service_unit = 0, 0, None
            engine.seats = None
            return
        engine.waiting = int(table.get("waiting", 0))
        engine.running = int(table.get("running", 0))
        engine.service_unit = table.get("service_unit")
        seats = table.get("seats")
        engine.seats = int(seats) if seats is not None else None

    def _probe_failed(self, engine: Engine, reason: str) -> None:
        engine.failed_probes += 1
        engine.last_error = reason
        if engine.failed_probes >= self.failures_to_drop:
            self.mark_down(engine, reason)

    def _publish(self, engine: Engine) -> None:
        self._healthy = [e for e in self.engines if e.healthy]
        models: dict[str, dict[str, Any]] = {}
        for healthy in self._healthy:
            for model_id, entry in healthy.models.items():
                models.setdefault(model_id, entry)
        self._models = models
        self.metrics.engine_healthy.labels(engine.name).set(1 if engine.healthy else 0)
