"""The soak's misbehaving client (key ``mallory``): every documented kind of harm,
each with its one expected answer, and the engine-table scan that tells whether a
forged prior service ever counted.

Part of ``autellix bench soak`` (:mod:`autellix_vllm.bench.soak`).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from autellix_vllm.bench.soak_agents import HonestAgents
from autellix_vllm.bench.soak_serve import Served
from autellix_vllm.bench.soak_watch import Event
from autellix_vllm.protocol.identity import (
    CALL_ID_HEADER,
    PRIOR_SERVICE,
    PRIOR_SERVICE_HEADER,
    PROGRAM_ID,
    PROGRAM_ID_HEADER,
    XARGS_FIELD,
)
from autellix_vllm.protocol.paths import (
    CHAT_COMPLETIONS_PATH,
    ENGINE_PROGRAM_PATH,
    ENGINE_TABLE_PATH,
    PROGRAMS_PATH,
)

# What a forger claims its victim has received; anything near it on an engine
# means the forgery counted. Honest programs here stay below a few hundred.
FORGED_SERVICE = 1e300
FORGED_FLOOR = 1e6
MISBEHAVE_EVERY_S = 5.0
FLOOD_EVERY_ROUNDS = 3


@dataclass
class Tally:
    """One kind of misbehaviour: the answers it may get, and what else it got."""

    expected: tuple[str, ...]
    sent: int = 0
    unexpected: Counter[str] = field(default_factory=Counter)

    def record(self, got: str) -> None:
        self.sent += 1
        if got not in self.expected:
            self.unexpected[got] += 1

    def summary(self) -> dict[str, Any]:
        return {
            "expected": " or ".join(self.expected),
            "sent": self.sent,
            "unexpected": dict(self.unexpected),
        }


async def answer_of(response: aiohttp.ClientResponse) -> str:
    """``"<status> <error code>"``, or the bare status when the body names no error."""
    text = await response.text()
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        error = None
    code = error.get("code") if isinstance(error, dict) else error
    return f"{response.status} {code}" if code is not None else str(response.status)


@dataclass
class EngineTables:
    """Reads both engines' tables with the engine key, as an operator may, and
    notes every program whose service shows a forged prior service."""

    http: aiohttp.ClientSession
    engine_urls: dict[int, str]  # serve's, as it prints them (a restart keeps the port)
    engine_key: str
    forged: set[str] = field(default_factory=set)
    largest_service: float = 0.0
    scans: int = 0
    lookups: int = 0

    async def scan(self, program_ids: list[str] | None = None) -> None:
        """Read every engine's whole table, or only ``program_ids``' rows."""
        headers = {"Authorization": f"Bearer {self.engine_key}"}
        for url in list(self.engine_urls.values()):
            if program_ids is None:
                reading = self.http.get(url + ENGINE_TABLE_PATH, headers=headers)
            else:
                body = {"program_ids": program_ids}
                reading = self.http.post(url + ENGINE_TABLE_PATH, headers=headers, json=body)
            try:
                async with reading as answer:
                    table = await answer.json() if answer.status == 200 else {}
            except (aiohttp.ClientError, ValueError):
                continue  # the killed engine, until it is back
            for row in table.get("programs", []):
                service = float(row.get("attained_service") or 0.0)
                if service >= FORGED_FLOOR:
                    self.forged.add(row["program_id"])
                else:
                    self.largest_service = max(self.largest_service, service)
        if program_ids is None:
            self.scans += 1
        else:
            self.lookups += 1


@dataclass
class Mallory:
    """Key ``mallory``: does every documented kind of harm, each with its expected answer."""

    http: aiohttp.ClientSession
    served: Served
    key: str
    model: str
    honest: HonestAgents
    tables: EngineTables
    cap: int
    rng: random.Random
    tallies: dict[str, Tally] = field(init=False)
    # Calls an engine answered without the engine key.
    engine_accepted: int = 0
    rounds: int = 0
    # When each flood ran (the run's start is set by misbehave()).
    floods: list[Event] = field(default_factory=list)
    began: float = 0.0

    def __post_init__(self) -> None:
        self.tallies = {
            "forged_victim_via_router": Tally(("404 program_not_found",)),
            "forged_own_via_router": Tally(("200",)),
            # vLLM's own --api-key check guards /v1/*; the extension's guards its paths
            # (both answer in the router's error shape).
            "forged_at_engine_without_key": Tally(("401 invalid_api_key",)),
            "engine_admin_without_key": Tally(("401 invalid_api_key",)),
            "call_id_reused": Tally(("409 call_id_reused",)),
            "call_id_concurrent": Tally(("200 + 409 call_id_reused",)),
            "deep_json_body": Tally(("400 invalid_json",)),
            # Python's parser takes 950 levels: the router passes the body on, and
            # vLLM's request validation refuses it (code invalid_request in our shape).
            "deep_messages": Tally(("400 invalid_json", "400 invalid_request")),
            # Counting the programs the key already had (the router derives one for
            # a call that names none, as deep_messages is).
            "program_flood": Tally((f"{self.cap} open, then 429 too_many_programs",)),
        }

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    async def misbehave(self, began: float, until: float) -> None:
        self.began = began
        while time.monotonic() < until:
            round_began = time.monotonic()
            await self.one_round()
            await asyncio.sleep(max(0.0, MISBEHAVE_EVERY_S - (time.monotonic() - round_began)))

    async def one_round(self) -> None:
        own = await self.open_program("mallory")
        await self.forge(own)
        await self.reuse_call_ids(own)
        await self.send_deep_json()
        await self.end_program(own)
        if self.rounds % FLOOD_EVERY_ROUNDS == 0:
            flood_began = time.monotonic() - self.began
            await self.flood()
            self.floods.append(Event("flood", flood_began, time.monotonic() - self.began))
        await self.tables.scan()  # did any forgery of this round count?
        self.rounds += 1

    def forged_call(self, program_id: str, call_id: str | None = None) -> tuple[dict, dict]:
        """Headers and body of a chat call claiming a huge prior service for ``program_id``."""
        headers = {PROGRAM_ID_HEADER: program_id, PRIOR_SERVICE_HEADER: str(FORGED_SERVICE)}
        if call_id is not None:
            headers[CALL_ID_HEADER] = call_id
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "me first"}],
            "max_tokens": 2,
            XARGS_FIELD: {PROGRAM_ID: program_id, PRIOR_SERVICE: FORGED_SERVICE},
        }
        return headers, body

    async def forge(self, own: str) -> None:
        await self.honest.wait_for_live(within_s=MISBEHAVE_EVERY_S)
        victim = self.rng.choice(sorted(self.honest.live)) if self.honest.live else None
        if victim is not None:
            headers, body = self.forged_call(victim)
            got = await self.post(CHAT_COMPLETIONS_PATH, headers, body)
            self.tallies["forged_victim_via_router"].record(got)
        headers, body = self.forged_call(own)
        self.tallies["forged_own_via_router"].record(
            await self.post(CHAT_COMPLETIONS_PATH, headers, body)
        )
        target = victim or own
        for url in list(self.served.engine_urls.values()):
            headers, body = self.forged_call(target)
            for key in (None, "wrong-key"):
                sent = {**headers, **({"Authorization": f"Bearer {key}"} if key else {})}
                answer = await self.at_engine("POST", url + CHAT_COMPLETIONS_PATH, sent, body)
                if answer is not None:
                    self.tallies["forged_at_engine_without_key"].record(answer)
                    self.engine_accepted += answer.startswith("2")
            for method, path in (
                ("GET", ENGINE_TABLE_PATH),
                ("DELETE", ENGINE_PROGRAM_PATH.format(program_id=target)),
            ):
                answer = await self.at_engine(method, url + path, {}, None)
                if answer is not None:
                    self.tallies["engine_admin_without_key"].record(answer)
                    self.engine_accepted += answer.startswith("2")

    async def reuse_call_ids(self, own: str) -> None:
        headers, body = self.forged_call(own, call_id=f"once-{self.rounds}")
        await self.post(CHAT_COMPLETIONS_PATH, headers, body)
        self.tallies["call_id_reused"].record(await self.post(CHAT_COMPLETIONS_PATH, headers, body))
        headers, body = self.forged_call(own, call_id=f"twice-{self.rounds}")
        both = await asyncio.gather(
            *(self.post(CHAT_COMPLETIONS_PATH, headers, body) for _ in range(2))
        )
        self.tallies["call_id_concurrent"].record(" + ".join(sorted(both)))

    async def send_deep_json(self) -> None:
        url = self.served.url + CHAT_COMPLETIONS_PATH
        messages = "[" * 950 + '{"role": "user", "content": "hi"}' + "]" * 950
        deep_messages = f'{{"model": "{self.model}", "messages": {messages}}}'.encode()
        for kind, data in (("deep_json_body", b"[" * 100_000), ("deep_messages", deep_messages)):
            async with self.http.post(url, data=data, headers=self.auth) as answer:
                self.tallies[kind].record(await answer_of(answer))

    async def flood(self) -> None:
        """Open programs until the router refuses one, then end them all."""
        async with self.http.get(self.served.url + PROGRAMS_PATH, headers=self.auth) as answer:
            answer.raise_for_status()
            already_open = (await answer.json())["total"]
        opened: list[str] = []
        refusals: list[str] = []

        async def open_until_refused() -> None:
            while not refusals:
                async with self.http.post(
                    self.served.url + PROGRAMS_PATH, json={"name": "flood"}, headers=self.auth
                ) as answer:
                    if answer.status == 200:
                        opened.append((await answer.json())["program_id"])
                    else:
                        refusals.append(await answer_of(answer))

        await asyncio.gather(*(open_until_refused() for _ in range(8)))
        open_at_refusal = already_open + len(opened)
        self.tallies["program_flood"].record(f"{open_at_refusal} open, then {refusals[0]}")
        for start in range(0, len(opened), 32):
            await asyncio.gather(*(self.end_program(p) for p in opened[start : start + 32]))

    async def open_program(self, name: str) -> str:
        async with self.http.post(
            self.served.url + PROGRAMS_PATH, json={"name": name}, headers=self.auth
        ) as answer:
            answer.raise_for_status()
            return (await answer.json())["program_id"]

    async def end_program(self, program_id: str) -> None:
        url = f"{self.served.url}{PROGRAMS_PATH}/{program_id}"
        async with self.http.delete(url, headers=self.auth) as answer:
            await answer.read()

    async def post(self, path: str, headers: dict[str, str], body: dict) -> str:
        async with self.http.post(
            self.served.url + path, json=body, headers={**headers, **self.auth}
        ) as answer:
            return await answer_of(answer)

    async def at_engine(
        self, method: str, url: str, headers: dict[str, str], body: dict | None
    ) -> str | None:
        """A request straight to an engine; None when it is down (the killed one)."""
        try:
            async with self.http.request(method, url, json=body, headers=headers) as answer:
                return await answer_of(answer)
        except aiohttp.ClientConnectionError:
            return None
