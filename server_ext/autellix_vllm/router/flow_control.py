"""The router's gate: calls of worse bands wait here while the pool is saturated.

The rule (which calls wait, which go next, the starvation bound) is
:mod:`autellix_vllm.policy.flow_control`'s, the one the simulator runs; this
module gives it what the router knows and waits for it:

* the pool's seats are the sum of the healthy engines' batch sizes, as each
  engine's table reports them (``EnginePool.seats``); while an engine in
  rotation reports none (stock vLLM, no table), nothing is held;
* a held call waits on a future that :meth:`Gate.enter` awaits; the gate looks
  again whenever a call that went ends, and at the next moment the rule names
  (a held call's starvation bound, a better call's linger);
* a client that goes away while its call is held cancels the handler
  (``handler_cancellation``): the call leaves the queue and never reaches an
  engine;
* the call's band is the one admission gave it (bounded by its key), so
  nothing a client sends puts it ahead of another key's; a call held to the
  starvation bound is sent as band 0, as the engine would rank it by then,
  and one let go sooner is sent with how long it was held (the router-stated
  ``X-Autellix-Router-Wait``), so the engine's bound counts from the router.

``autellix_router_calls_held{class}`` (``RouterMetrics.held``) gives the
calls held now, by class.

:class:`Gate` itself knows neither engines nor metrics: it is given where the
seats come from and what to tell of the held calls, so that the Ray Serve
path's directory (``ray_serve.flow_control``) waits on the same gate with the
seats of its config.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace

from autellix_vllm.policy.config import TenantConfig
from autellix_vllm.policy.flow_control import FlowControl, FlowControlConfig, Held
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.router.admission import Admitted


@dataclass(frozen=True)
class Pass:
    """A call the gate let through: the band it goes (and later ends) in."""

    band: int
    aged: bool = False  # held to the starvation bound: it goes as band 0
    waited_s: float = 0.0  # how long the gate held it

    def applied(self, identity: CallIdentity) -> CallIdentity:
        """The identity the call goes with: an aged call's as band 0 (stated as
        none), as the engine would rank it by then; a call held for less, with
        its wait stated (``router_wait_s``), which the engine's bound counts."""
        if self.aged:
            return replace(identity, priority=None)
        if self.waited_s > 0:
            return replace(identity, router_wait_s=self.waited_s)
        return identity


class Gate:
    """Holds calls of worse bands (asyncio) and lets them go in the rule's order."""

    def __init__(
        self,
        config: FlowControlConfig,
        seats: Callable[[], int | None],
        show: Callable[[Mapping[int, int]], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``seats``: the pool's seats now (None: unknown, nothing is held), asked
        whenever the gate decides; ``show``: told the calls held, by band, when
        that changes."""
        # The engines' starvation bound, the same constant (TenantConfig.band_aging_s).
        self.control: FlowControl[asyncio.Future[None]] = FlowControl(config, TenantConfig())
        self.seats = seats
        self.show = show
        self.clock = clock
        self._timer: asyncio.TimerHandle | None = None

    @contextlib.asynccontextmanager
    async def through(self, admitted: Admitted) -> AsyncIterator[Admitted]:
        """Hold ``admitted`` while the rule says; inside, the call as it goes (an
        aged one as band 0); on leaving, the gate learns that it ended."""
        identity = admitted.identity
        gone = await self.enter(identity.priority or 0, identity.owner or "")
        try:
            yield replace(admitted, identity=gone.applied(identity))
        finally:
            self.leave(gone)

    async def enter(self, band: int, owner: str) -> Pass:
        """Wait until a call of ``owner`` in ``band`` may go to an engine."""
        now = self.clock()
        self.control.seats = self.seats()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        held = self.control.arrive(future, band, owner, now)
        if held is None:
            return Pass(band)
        self._show()
        self._look_later()
        try:
            await future
        except asyncio.CancelledError:
            self._left(held)
            raise
        return Pass(held.band, held.aged, held.waited_s)

    def leave(self, gone: Pass) -> None:
        """A call that went has ended: held calls may go in its place."""
        self.control.ended(gone.band, self.clock())
        self._release()

    def _left(self, held: Held[asyncio.Future[None]]) -> None:
        """The client of a held call went away: out of the queue, or, if it was
        let go meanwhile, out of the calls in flight."""
        if held.waiting:
            self.control.drop(held)
            self._show()
        elif held.item.done() and not held.item.cancelled():
            self.leave(Pass(held.band))

    def _release(self) -> None:
        """Wake the held calls the rule lets go now; look again when it says."""
        self.control.seats = self.seats()
        now = self.clock()
        while released := self.control.release(now):
            for held in released:
                if held.item.done():  # cancelled with its handler: it never goes
                    self.control.ended(held.band, now, went=False)
                else:
                    held.item.set_result(None)
        self._show()
        self._look_later()

    def _look_later(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self.clock()
        at = self.control.next_look(now)
        if at is not None:
            delay = max(0.0, at - now)
            self._timer = asyncio.get_running_loop().call_later(delay, self._release)

    def _show(self) -> None:
        self.show(self.control.held())
