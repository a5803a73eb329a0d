"""One engine as a Ray Serve replica: an ``autellix engine`` process under its supervision.

The replica starts the engine (:class:`~autellix_vllm.engine.launcher.EngineProcess`:
vLLM 0.32 with the Autellix scheduler, identity middleware and plugins) on a
free loopback port, with an engine key of its own (or the application's
``engine_key``, for reading the engines directly), so that only the replica
may state the scheduling fields. It relays each call to it over HTTP and
sends the answer back to the ingress: for a stream, first an
:class:`~autellix_vllm.ray_serve.messages.AnswerHead`, then the body's bytes as
the engine sends them (:meth:`EngineReplica.generate`), or the whole answer in
one message when it is not streamed (:meth:`EngineReplica.answer`: a plain
call costs less than a stream of one item). A cancelled call (the client left) closes the engine
connection, which makes vLLM abort the request.

What the engine is told: the identity the directory accepted (the owner
included), and the program's service over every replica only if this engine
counts service in the table's unit (``router.admission.states_prior_service``,
the router's rule; the unit is read from the engine's table once, at start).

Supervision: Serve's health check (:meth:`EngineReplica.check_health`) fails
when the engine does not answer ``/health``, and Serve replaces the replica;
the engine's reaper kills the engine when the replica's process dies, even by
SIGKILL, so an engine never outlives its replica. A replica that Serve stops
(the application deleted, Serve shut down) stops its engine's whole process
tree first and waits for it (``__del__``, within the deployment's
:data:`GRACEFUL_SHUTDOWN_TIMEOUT_S`).

Why a process, not vLLM's ``AsyncLLM`` inside the replica: the engine process
is what ``autellix serve`` runs and tests, with its scheduler, middleware and
plugins wired by vLLM's own server; in-process, the replica would have to
rebuild that wiring. The cost is one loopback HTTP hop per call.
"""

from __future__ import annotations

import json
import secrets
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp

from autellix_vllm.engine.launcher import EngineConfig, EngineProcess
from autellix_vllm.protocol.paths import ENGINE_TABLE_PATH
from autellix_vllm.ray_serve._ray_adapter import this_replica_name
from autellix_vllm.ray_serve.messages import AnswerHead, EngineCall
from autellix_vllm.router.admission import states_prior_service
from autellix_vllm.router.engines import ENGINE_CONNECTION_FAILURES, passed_back_headers

ENGINE_START_TIMEOUT_S = 600.0
HEALTH_TIMEOUT_S = 5.0
# An engine that has not exited this long after its SIGTERM is killed (SIGKILL)...
ENGINE_STOP_TIMEOUT_S = 15.0
# ...within the time Serve gives a stopping replica before it kills it (``app``).
GRACEFUL_SHUTDOWN_TIMEOUT_S = ENGINE_STOP_TIMEOUT_S + 15.0


class EngineReplica:
    """Serve deployment class (``app``): ``engine`` holds :class:`EngineConfig` fields;
    ``key``: the engine key (None: a fresh one, which only this replica knows)."""

    def __init__(self, engine: dict[str, Any], key: str | None = None) -> None:
        self.key = key or secrets.token_urlsafe(24)
        config = EngineConfig(**{**engine, "port": 0, "host": "127.0.0.1", "api_key": self.key})
        self.name = this_replica_name()
        self.process = EngineProcess(config)
        self.process.start()
        try:
            self.process.wait_healthy(ENGINE_START_TIMEOUT_S)
            self.service_unit = self._read_service_unit()
        except Exception:
            self.process.stop(ENGINE_STOP_TIMEOUT_S)
            raise
        self._session: aiohttp.ClientSession | None = None

    def _read_service_unit(self) -> str | None:
        """The unit the engine's table counts service in (None: it keeps no table)."""
        request = urllib.request.Request(
            self.process.base_url + ENGINE_TABLE_PATH + "?summary=1",
            headers={"Authorization": f"Bearer {self.key}"},
        )
        with urllib.request.urlopen(request, timeout=HEALTH_TIMEOUT_S) as answer:
            table = json.load(answer)
        return table.get("service_unit") if table.get("enabled", False) else None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # made on the replica's event loop, at first use
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0),
                auto_decompress=False,
                headers={"Authorization": f"Bearer {self.key}"},
            )
        return self._session

    async def answer(self, call: EngineCall) -> AnswerHead:
        """The engine's whole answer to a call that is not streamed (one message back)."""
        upstream = await self._post(call)
        if upstream is None:
            return AnswerHead(502, {}, self.name, call.route, engine_failed=True)
        try:
            body = await upstream.read()
        finally:
            upstream.release()
        return AnswerHead(
            upstream.status, passed_back_headers(upstream), self.name, call.route, body
        )

    async def generate(self, call: EngineCall) -> AsyncIterator[AnswerHead | bytes]:
        """The engine's answer to a streamed call: its head, then the stream's bytes
        as the engine sends them (an error answer comes whole in the head)."""
        upstream = await self._post(call)
        if upstream is None:
            yield AnswerHead(502, {}, self.name, call.route, engine_failed=True)
            return
        try:
            if upstream.status != 200:
                body = await upstream.read()
                yield AnswerHead(
                    upstream.status, passed_back_headers(upstream), self.name, call.route, body
                )
                return
            yield AnswerHead(upstream.status, passed_back_headers(upstream), self.name, call.route)
            async for chunk in upstream.content.iter_any():
                yield chunk
        finally:
            upstream.release()  # closes the connection if unread: the engine aborts

    async def _post(self, call: EngineCall) -> aiohttp.ClientResponse | None:
        """Send ``call`` to the engine; None if it could not take it (nothing was done)."""
        try:
            return await self._client().post(
                self.process.base_url + call.path, data=call.raw, headers=self._headers(call)
            )
        except ENGINE_CONNECTION_FAILURES:
            return None

    def _headers(self, call: EngineCall) -> dict[str, str]:
        """What the engine is told of ``call`` (see the module)."""
        identity = call.identity
        if call.prior_service is not None and states_prior_service(self.service_unit):
            identity = replace(identity, prior_service=call.prior_service)
        return {**identity.as_headers(), "Content-Type": "application/json"}

    async def models(self) -> list[dict[str, Any]]:
        """The engine's ``/v1/models`` entries."""
        async with self._client().get(self.process.base_url + "/v1/models") as answer:
            answer.raise_for_status()
            return (await answer.json())["data"]

    async def check_health(self) -> None:
        """Serve's health check: raises when the engine does not answer ``/health``."""
        timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
        async with self._client().get(self.process.base_url + "/health", timeout=timeout) as answer:
            if answer.status != 200:
                raise RuntimeError(f"the engine's /health answered {answer.status}")

    def __del__(self) -> None:
        # Serve calls this when it stops the replica; the reaper covers a crash.
        process = getattr(self, "process", None)
        if process is not None:
            process.stop(ENGINE_STOP_TIMEOUT_S)
