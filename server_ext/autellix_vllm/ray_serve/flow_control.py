"""Flow control on the Ray Serve path: the router's gate, for calls of other processes.

The calls in flight must be counted over the whole pool, so the gate lives in
the one place every call passes: the directory (``directory``), a single
replica. It is the router's :class:`~autellix_vllm.router.flow_control.Gate`
(the rule of :mod:`autellix_vllm.policy.flow_control`), with the seats of the
application's config; this module adds what a caller in another process
needs, a name for each call: the ingress picks a ticket, waits on
:meth:`TicketGate.enter` until the call may go, and once the call ended
(answered, failed, or its client left) names the ticket to :meth:`TicketGate.leave`.

A leave may overtake its enter on the way, or find the call still held (the
ingress gave up waiting: its client left), or already let go (the answer to
enter was on its way back): held, the call leaves the queue and never goes;
let go, it counts as ended; not arrived yet, the ticket is remembered, and
its enter, if it comes, returns at once with nothing counted. So a call
whose client leaves, or that fails, never keeps a seat.

Everything here runs on the directory replica's event loop (its methods that
reach the gate are ``async``), so no lock is needed.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from autellix_vllm.router.flow_control import Gate, Pass

# Tickets whose leave came before their enter, kept for that enter (the oldest are
# forgotten: an enter that was cancelled on the way never comes).
LEFT_EARLY_KEPT = 10_000


class TicketGate:
    """The gate for calls named by tickets (see the module)."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self._waiting: dict[str, asyncio.Task[object]] = {}  # held: the task of its enter
        self._going: dict[str, Pass] = {}  # let go, not ended
        self._left_early: OrderedDict[str, None] = OrderedDict()

    async def enter(self, ticket: str, band: int, owner: str) -> Pass | None:
        """Wait until the call ``ticket`` of ``owner`` in ``band`` may go; how it
        goes. None: the call left before it went (its caller no longer waits)."""
        if ticket in self._left_early:
            del self._left_early[ticket]
            return None
        task = asyncio.current_task()
        assert task is not None  # a coroutine on an event loop
        self._waiting[ticket] = task
        try:
            gone = await self.gate.enter(band, owner)
        except asyncio.CancelledError:
            if self._waiting.pop(ticket, None) is None:  # leave() cancelled it
                task.uncancel()
                return None
            raise
        del self._waiting[ticket]
        self._going[ticket] = gone
        return gone

    def leave(self, tickets: list[str]) -> None:
        """The calls ``tickets`` ended, or their clients left (see the module)."""
        for ticket in tickets:
            gone = self._going.pop(ticket, None)
            if gone is not None:
                self.gate.leave(gone)
                continue
            waiting = self._waiting.pop(ticket, None)
            if waiting is not None:
                # The gate's own handling of a cancelled wait: out of the queue, or
                # out of the calls in flight if it was let go meanwhile.
                waiting.cancel()
                continue
            self._left_early[ticket] = None
            while len(self._left_early) > LEFT_EARLY_KEPT:
                self._left_early.popitem(last=False)

    def in_flight(self) -> int:
        """Calls let go that have not ended."""
        return self.gate.control.in_flight()

    def held(self) -> dict[int, int]:
        """Band -> calls held now."""
        return self.gate.control.held()
