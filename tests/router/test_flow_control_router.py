"""The router's gate (router.flow_control) on a real router over a fake engine.

The fake engine has one seat (its table says so) and answers a call only when
the test lets it, so the test decides when calls end: the batch keys' calls
past the seat wait at the router, in the rule's order (owners in turn), an
interactive call never waits, a client that leaves while held is dropped, and
a call held to the starvation bound goes as band 0, one held for less goes
with its wait stated. The gate alone: a held call let go after its client
left frees its seat and does not linger.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from autellix_vllm.policy.flow_control import FlowControlConfig
from autellix_vllm.router.flow_control import Gate
from polling import eventually
from router_http import completion, fake_engine_app, held_gauge, keys_file_with, request

MODEL = "fake-model"
CHAT = "sk-chat"  # reads /metrics (no admin key is set)
KEYS = "chat: sk-chat\nnightly: sk-nightly class=batch\nrollouts: sk-rollouts class=batch\n"
USAGE = {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}
GATE = FlowControlConfig(seat_share=1.0, reserve_share=0.0, linger_s=0.0)


@dataclass
class HeldEngine:
    """One seat; each call (named by its prompt) waits until the test ends it."""

    url: str = ""
    arrived: list[tuple[str, str | None]] = field(default_factory=list)  # (prompt, band)
    waits: dict[str, str | None] = field(default_factory=dict)  # prompt -> its router wait
    ends: dict[str, asyncio.Event] = field(default_factory=dict)

    def end(self, prompt: str) -> None:
        self.ends.setdefault(prompt, asyncio.Event()).set()

    def prompts(self) -> list[str]:
        return [prompt for prompt, _ in self.arrived]


@contextlib.asynccontextmanager
async def held_engine() -> AsyncIterator[HeldEngine]:
    engine = HeldEngine()
    table = {"enabled": True, "service_unit": "tokens", "waiting": 0, "running": 0, "seats": 1}

    async def get_table(request: web.Request) -> web.Response:
        return web.json_response({**table, "programs": [], "programs_count": 0})

    async def generate(request: web.Request) -> web.Response:
        prompt = (await request.json())["prompt"]
        engine.arrived.append((prompt, request.headers.get("X-Autellix-Priority")))
        engine.waits[prompt] = request.headers.get("X-Autellix-Router-Wait")
        await engine.ends.setdefault(prompt, asyncio.Event()).wait()
        body = {"id": prompt, "object": "text_completion", "choices": [], "usage": USAGE}
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/autellix/v1/engine/table", get_table)
    app.router.add_post("/v1/completions", generate)
    async with fake_engine_app(app, MODEL) as engine.url:
        yield engine


@pytest.fixture
def keys_file(tmp_path: Path) -> str:
    return keys_file_with(tmp_path, KEYS)


async def send(url: str, key: str, prompt: str) -> int:
    status, answer = await request(
        "POST", url + "/v1/completions", json=completion(MODEL, prompt=prompt),
        headers={"Authorization": f"Bearer {key}"},
    )  # fmt: skip
    assert status == 200, answer
    return status


async def test_batch_calls_wait_at_the_router_and_go_owners_in_turn(start_router, keys_file):
    async with (
        held_engine() as engine,
        start_router([engine.url], api_keys_file=keys_file, flow_control=GATE) as router,
    ):
        url = router.url
        calls = [asyncio.create_task(send(url, "sk-nightly", "n0"))]
        await eventually(engine.prompts, lambda seen: seen == ["n0"])
        # The seat is taken: these wait at the router, in this order of arrival.
        for key, prompt in [("sk-nightly", "n1"), ("sk-nightly", "n2"), ("sk-rollouts", "r1")]:
            calls.append(asyncio.create_task(send(url, key, prompt)))
            await eventually(
                lambda: held_gauge(url, CHAT), lambda held: held.get("batch") == len(calls) - 1
            )
        # An interactive call never waits at the router, seat or not.
        calls.append(asyncio.create_task(send(url, "sk-chat", "c1")))
        await eventually(engine.prompts, lambda seen: seen == ["n0", "c1"])
        engine.end("c1")
        await asyncio.sleep(0.1)
        assert engine.prompts() == ["n0", "c1"]  # n0 still holds the one seat
        # As each call ends, one held call goes: the batch keys take turns.
        for ended, going in [("n0", "n1"), ("n1", "r1"), ("r1", "n2")]:
            engine.end(ended)
            await eventually(engine.prompts, lambda seen, going=going: seen[-1] == going)
        engine.end("n2")
        assert await asyncio.gather(*calls) == [200] * 5
        assert await held_gauge(url, CHAT) == {"batch": 0.0}
    # The engine is told each call's band as admission gave it, and of each held
    # call how long it was held (X-Autellix-Router-Wait: its starvation bound
    # counts from the router); each was held at least through the 0.1 s above.
    assert dict(engine.arrived) == {"n0": "1", "c1": None, "n1": "1", "r1": "1", "n2": "1"}
    assert (engine.waits["n0"], engine.waits["c1"]) == (None, None)  # never held
    for prompt in ("n1", "r1", "n2"):
        assert 0.1 <= float(engine.waits[prompt] or 0) < 60.0


async def test_a_client_that_leaves_while_held_is_dropped(start_router, keys_file):
    async with (
        held_engine() as engine,
        start_router([engine.url], api_keys_file=keys_file, flow_control=GATE) as router,
    ):
        url = router.url
        first = asyncio.create_task(send(url, "sk-nightly", "n0"))
        await eventually(engine.prompts, lambda seen: seen == ["n0"])
        with pytest.raises(asyncio.TimeoutError):
            async with aiohttp.ClientSession() as http:
                await http.post(
                    url + "/v1/completions",
                    json=completion(MODEL, prompt="gone"),
                    headers={"Authorization": "Bearer sk-nightly"},
                    timeout=aiohttp.ClientTimeout(total=0.5),
                )
        await eventually(lambda: held_gauge(url, CHAT), lambda held: held == {"batch": 0.0})
        later = asyncio.create_task(send(url, "sk-rollouts", "r1"))
        await eventually(lambda: held_gauge(url, CHAT), lambda held: held == {"batch": 1.0})
        engine.end("n0")
        await eventually(engine.prompts, lambda seen: seen == ["n0", "r1"])
        engine.end("r1")
        assert await asyncio.gather(first, later) == [200, 200]
    assert "gone" not in engine.prompts()


async def test_a_call_held_to_the_starvation_bound_goes_as_band_0(start_router, keys_file):
    async with (
        held_engine() as engine,
        start_router([engine.url], api_keys_file=keys_file, flow_control=GATE) as router,
    ):
        gate = router.state.dispatcher.gate
        assert gate is not None
        gate.control.aging_s = 0.5  # TenantConfig.band_aging_s, shortened for the test
        first = asyncio.create_task(send(router.url, "sk-nightly", "n0"))
        await eventually(engine.prompts, lambda seen: seen == ["n0"])
        aged = asyncio.create_task(send(router.url, "sk-nightly", "n1"))
        # The seat is still taken, but n1 goes once it has waited the bound.
        await eventually(engine.prompts, lambda seen: seen == ["n0", "n1"])
        engine.end("n0")
        engine.end("n1")
        assert await asyncio.gather(first, aged) == [200, 200]
    assert dict(engine.arrived) == {"n0": "1", "n1": None}
    assert engine.waits == {"n0": None, "n1": None}  # band 0 now: no aging to count


async def test_a_call_let_go_after_its_client_left_does_not_linger():
    """A seat that frees in the turn of the event loop in which a held call's
    handler was cancelled lets that call go with its future already cancelled:
    it never reaches an engine, so it must not linger as an ended call would,
    which would keep worse bands out of its seat for linger_s."""
    config = FlowControlConfig(seat_share=1.0, reserve_share=0.0, linger_s=60.0)
    gate = Gate(config, seats=lambda: 1, show=lambda held: None)
    first = await gate.enter(2, "rollouts")  # the one seat
    leaving = asyncio.create_task(gate.enter(1, "nightly"))
    await asyncio.sleep(0)
    assert gate.control.held() == {1: 1}
    leaving.cancel()  # cancels the future it waits on now; its handler resumes later
    gate.leave(first)  # the seat goes to the call whose client left
    with pytest.raises(asyncio.CancelledError):
        await leaving
    # Nothing in flight, and only band 2 lingers, which does not hold band 2: the
    # seat is free for it (a lingering band-1 call would hold it).
    assert not gate.control.saturated(2, gate.clock())
