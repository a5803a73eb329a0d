"""The flow-control gate of the Ray Serve path (``ray_serve.flow_control``, kept by
``ray_serve.directory``), without Ray: calls named by tickets wait at the
directory while the pool is saturated for their band, and however a call ends
(answered, failed, its client gone while held, a leave that overtakes its
enter) it never keeps a seat."""

from __future__ import annotations

import asyncio

import pytest
from autellix_vllm.policy.flow_control import FlowControlConfig
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.ray_serve.directory import ProgramDirectory
from autellix_vllm.ray_serve.messages import Arrival
from autellix_vllm.router.flow_control import Pass
from autellix_vllm.router.keys import ANONYMOUS

pytestmark = pytest.mark.timeout(30)  # a call the gate never lets go fails, not hangs

BATCH = 1
# Every seat counts, no reserve, no linger: a call waits exactly while the seats are full.
PLAIN = FlowControlConfig(seat_share=1.0, reserve_share=0.0, linger_s=0.0)


def gated(seats: int = 1, config: FlowControlConfig = PLAIN) -> ProgramDirectory:
    return ProgramDirectory(flow_control=config, seats=seats)


async def held(directory: ProgramDirectory, ticket: str, band: int = BATCH) -> asyncio.Task:
    """The enter of ``ticket`` as a task, once the gate holds it."""
    before = sum(directory.gate.held().values()) if directory.gate else 0
    task = asyncio.create_task(directory.enter(ticket, band, "owner-" + ticket))
    for _ in range(100):
        await asyncio.sleep(0)
        if directory.gate and sum(directory.gate.held().values()) > before:
            return task
    raise AssertionError(f"{ticket} was not held: {await directory.flow()}")


async def test_an_admitted_call_is_told_to_wait_at_the_gate_only_when_it_is_on():
    arrival = Arrival(CallIdentity(None, call_id="c1", priority=BATCH))
    assert gated().admit(arrival, ANONYMOUS).gated  # type: ignore[union-attr]
    plain = ProgramDirectory()
    assert not plain.admit(arrival, ANONYMOUS).gated  # type: ignore[union-attr]
    assert await plain.flow() is None
    assert await plain.enter("t", BATCH, "o") == Pass(BATCH)  # no gate: it goes


async def test_a_batch_call_waits_for_a_free_seat_and_an_interactive_one_never_does():
    directory = gated(seats=1)
    assert await directory.enter("b1", BATCH, "nightly") == Pass(BATCH)
    waiting = await held(directory, "b2")
    assert await directory.flow() == {"held": {"batch": 1}, "in_flight": 1}
    assert await directory.enter("i1", 0, "chat") == Pass(0)  # band 0: at once
    await directory.leave(["i1"])
    await asyncio.sleep(0)
    assert not waiting.done()  # b1 still holds the one seat
    await directory.leave(["b1"])
    gone = await waiting
    assert (gone.band, gone.aged) == (BATCH, False)
    assert gone.waited_s > 0  # how long it was held, for the engine's starvation bound
    await directory.leave(["b2"])
    assert await directory.flow() == {"held": {}, "in_flight": 0}


async def test_a_held_call_whose_client_left_never_goes():
    directory = gated(seats=1)
    await directory.enter("b1", BATCH, "nightly")
    gone = await held(directory, "gone")
    later = await held(directory, "later")
    await directory.leave(["gone"])  # its ingress gave up waiting
    assert await gone is None
    assert await directory.flow() == {"held": {"batch": 1}, "in_flight": 1}
    await directory.leave(["b1"])
    assert (await later).band == BATCH  # the next one takes the seat
    await directory.leave(["later"])
    assert await directory.flow() == {"held": {}, "in_flight": 0}


async def test_a_wait_that_serve_cancels_leaves_the_queue():
    directory = gated(seats=1)
    await directory.enter("b1", BATCH, "nightly")
    cancelled = await held(directory, "gone")
    cancelled.cancel()  # the caller's request was cancelled, its leave still on the way
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert await directory.flow() == {"held": {}, "in_flight": 1}
    await directory.leave(["gone", "b1"])
    assert await directory.flow() == {"held": {}, "in_flight": 0}


async def test_a_leave_that_overtakes_its_enter_keeps_nothing():
    directory = gated(seats=1)
    await directory.leave(["early"])
    assert await directory.enter("early", BATCH, "nightly") is None
    assert await directory.flow() == {"held": {}, "in_flight": 0}
    # The ticket is used up: a later enter of it is a call like any other.
    assert await directory.enter("early", BATCH, "nightly") == Pass(BATCH)


async def test_a_call_let_go_as_its_client_left_gives_its_seat_back():
    directory = gated(seats=1)
    await directory.enter("b1", BATCH, "nightly")
    racing = await held(directory, "racing")
    # b1's end lets "racing" go; its leave comes before its enter has returned.
    await directory.leave(["b1", "racing"])
    assert await racing is None
    assert await directory.flow() == {"held": {}, "in_flight": 0}
    assert await directory.enter("next", BATCH, "nightly") == Pass(BATCH)


async def test_a_call_held_to_the_starvation_bound_goes_as_band_0():
    directory = gated(seats=1)
    assert directory.gate is not None
    directory.gate.gate.control.aging_s = 0.05  # TenantConfig.band_aging_s, shortened
    await directory.enter("b1", BATCH, "nightly")
    aged = await held(directory, "aged")
    gone = await asyncio.wait_for(aged, 5)
    assert (gone.band, gone.aged) == (0, True)
    identity = CallIdentity("p", priority=BATCH)
    assert gone.applied(identity) == CallIdentity("p")  # the engine is told band 0
    assert Pass(BATCH).applied(identity) == identity
    # Held for less than the bound: its band, with its wait stated.
    assert Pass(BATCH, waited_s=2.5).applied(identity) == CallIdentity(
        "p", priority=BATCH, router_wait_s=2.5
    )
