"""Flow control: calls of worse bands wait at the router while the pool is saturated.

The engines order their queues by band (``policy.core``), but a call an engine
has admitted keeps its seat: a flood of batch calls that fills the seats makes
every step of the interactive calls beside it slower, and with many seats
(vLLM's 256) nothing queues, so the band order has nothing to decide. As in
llm-d's flow control, the router therefore holds a worse band's call while the
pool is saturated for its band, and releases held calls as calls end.

The rule, plain Python so that the router (``router.flow_control``) and the
simulator (``sim.run``) run the same code:

* **Saturation.** The pool has ``seats`` (the sum of its engines' batch sizes,
  ``max_num_seqs``). Calls of band 0 are never held. A call of band b > 0 may
  go while the calls in flight, plus ``reserve_share`` of the seats for each
  call of a better band in flight, stay under ``seat_share`` of the seats. The count is
  the calls this gate let through and that have not ended, known exactly and
  at once, where an engine's polled queue is a probe interval old; the
  reserve keeps worse bands out of the seats (and the step's token budget)
  that a better band's calls are using, so a batch flood cannot slow the
  interactive calls' steps, while with few better calls in flight the worse
  bands still fill the pool.
* **Order.** Held calls go best band first; inside a band the owners (keys)
  take turns, round robin, each owner's calls in arrival order; a new call
  of a band that has held calls waits behind them.
* **Starvation bound.** A call held ``TenantConfig.band_aging_s`` goes at once,
  saturated or not, as band 0: the bound the engines' order applies to a
  worse band's call (``policy.core``) applies to its wait at the router too.
  A call let go sooner goes with how long it was held (:attr:`Held.waited_s`,
  stated to the engine as ``CallIdentity.router_wait_s``), and the engine
  ages it that much sooner: one bound, counted from the router.

The gate never holds anything when every call is in band 0, so single-band
workloads are served as without it.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .config import TenantConfig

T = TypeVar("T")


@dataclass(frozen=True)
class FlowControlConfig:
    """When the pool is saturated for a worse band (see the module docstring)."""

    # Share of the pool's seats that calls of worse bands may fill.
    seat_share: float = 1.0
    # Share of the pool's seats kept from worse bands for each call of a better
    # band in flight: a share, so that a small pool is not all reserve.
    reserve_share: float = 1 / 16
    # A better band's call still counts as in flight this long after it ended:
    # an agent's next call comes back after a tool gap, and the seats it will
    # want should not fill with worse calls in between.
    linger_s: float = 4.0
    # reserve_share 1/16 and linger_s 4 were chosen on seeds 0-4 of
    # bench/experiments/tenants.py (docs/scheduling.md, "Flow control").

    def __post_init__(self) -> None:
        if not 0 < self.seat_share <= 1:
            raise ValueError(f"seat_share must be in (0, 1], got {self.seat_share}")
        if not self.reserve_share >= 0:
            raise ValueError(f"reserve_share must be >= 0, got {self.reserve_share}")
        if not self.linger_s >= 0:
            raise ValueError(f"linger_s must be >= 0, got {self.linger_s}")


@dataclass(eq=False)
class Held(Generic[T]):
    """A call held at the gate: ``item`` is the caller's (a request, a simulated call)."""

    item: T
    band: int
    owner: str
    since: float
    # Held long enough to go as band 0 (``TenantConfig.band_aging_s``).
    aged: bool = False
    # Still waiting at the gate (not released, not dropped).
    waiting: bool = True
    # Seconds it was held, set when it is released.
    waited_s: float = 0.0


@dataclass
class _Band:
    """One band's held calls: per owner, in arrival order; owners take turns."""

    owners: OrderedDict[str, deque[Held]] = field(default_factory=OrderedDict)
    size: int = 0


class FlowControl(Generic[T]):
    """The gate: which calls go to the engines now and which wait, and for how long.

    The caller tells it of every call (:meth:`arrive`), of every call that went
    and ended (:meth:`ended`), and of held calls whose client left
    (:meth:`drop`); it asks :meth:`release` for the held calls that may go,
    after a call ended, when the seats changed and at :meth:`next_aging`.
    """

    def __init__(
        self, config: FlowControlConfig, tenants: TenantConfig, seats: int | None = None
    ) -> None:
        self.config = config
        self.aging_s = tenants.band_aging_s
        # The pool's seats; None: unknown, and nothing is held.
        self.seats = seats
        self._in_flight: Counter[int] = Counter()  # band -> calls that went and not ended
        self._lingering: deque[tuple[float, int]] = deque()  # (ended + linger_s, band)
        self._lingers: Counter[int] = Counter()  # band -> its calls in _lingering
        self._bands: dict[int, _Band] = {}
        self._aging: list[tuple[float, int, Held[T]]] = []  # (since + aging_s, seq, held)
        self._seq = itertools.count()

    # ---- the rule ----------------------------------------------------------------------

    def saturated(self, band: int, now: float) -> bool:
        """Whether a call of ``band`` must wait at ``now`` (the module docstring's rule)."""
        if band == 0 or self.seats is None:
            return False
        self._expire(now)
        lingering = sum(n for b, n in self._lingers.items() if b < band)
        better = sum(n for b, n in self._in_flight.items() if b < band) + lingering
        reserved = self.config.reserve_share * self.seats * better
        used = sum(self._in_flight.values()) + lingering + reserved
        return used >= self.config.seat_share * self.seats

    # ---- what the caller tells it ------------------------------------------------------

    def arrive(self, item: T, band: int, owner: str, now: float) -> Held[T] | None:
        """A call of ``owner`` in ``band`` arrived: None if it may go now (it then
        counts as in flight), else its place at the gate."""
        if not self._has_held(band) and not self.saturated(band, now):
            self._in_flight[band] += 1
            return None
        held = Held(item, band, owner, now)
        queue = self._bands.setdefault(band, _Band())
        queue.owners.setdefault(owner, deque()).append(held)
        queue.size += 1
        heapq.heappush(self._aging, (now + self.aging_s, next(self._seq), held))
        return held

    def ended(self, band: int, now: float, went: bool = True) -> None:
        """A call that went in ``band`` (its :attr:`Held.band` if it was held) ended.

        ``went`` False: :meth:`release` let it go after its client had left, so it
        never reached an engine; its seat frees and, as no program of it will come
        back, it does not linger."""
        self._in_flight[band] -= 1
        if self._in_flight[band] <= 0:
            del self._in_flight[band]
        if went and self.config.linger_s > 0:
            self._lingering.append((now + self.config.linger_s, band))
            self._lingers[band] += 1

    def drop(self, held: Held[T]) -> None:
        """A held call's client left: it never goes."""
        if not held.waiting:
            return
        held.waiting = False
        queue = self._bands[held.band]
        calls = queue.owners[held.owner]
        calls.remove(held)
        queue.size -= 1
        if not calls:
            del queue.owners[held.owner]

    def release(self, now: float) -> list[Held[T]]:
        """The held calls that go now, in order (each counts as in flight): those
        held ``band_aging_s`` (as band 0), then best band first while the pool is
        not saturated for it, owners in turn inside a band."""
        out = self._aged(now)
        for band in sorted(b for b, queue in self._bands.items() if queue.size):
            queue = self._bands[band]
            while queue.size and not self.saturated(band, now):
                out.append(self._take(queue, band))
            if queue.size:
                break  # strict bands: a worse band waits while a better one does
        for held in out:
            held.waited_s = now - held.since
        return out

    def next_aging(self) -> float | None:
        """When the next held call reaches the starvation bound (None: none held)."""
        heap = self._aging
        while heap and not heap[0][2].waiting:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def next_look(self, now: float) -> float | None:
        """When after ``now`` :meth:`release` may let a held call go though no
        call ended: it reaches the starvation bound, or a better call stops
        lingering (None: nothing is held)."""
        aging = self.next_aging()
        if aging is None:
            return None
        self._expire(now)
        return min(aging, self._lingering[0][0]) if self._lingering else aging

    # ---- what it shows -----------------------------------------------------------------

    def in_flight(self) -> int:
        """Calls that went and have not ended, in all bands."""
        return sum(self._in_flight.values())

    def holding(self) -> int:
        """Calls held now, in all bands."""
        return sum(queue.size for queue in self._bands.values())

    def held(self) -> dict[int, int]:
        """Band -> calls held in it (bands with none left out)."""
        return {band: queue.size for band, queue in sorted(self._bands.items()) if queue.size}

    # ---- inside --------------------------------------------------------------------------

    def _has_held(self, band: int) -> bool:
        """Whether a call of ``band`` or a better one is held (a newcomer waits behind)."""
        return any(queue.size for b, queue in self._bands.items() if b <= band)

    def _take(self, queue: _Band, band: int) -> Held[T]:
        """The next owner's oldest call; that owner goes to the back of the turn."""
        owner, calls = next(iter(queue.owners.items()))
        held = calls.popleft()
        if calls:
            queue.owners.move_to_end(owner)
        else:
            del queue.owners[owner]
        queue.size -= 1
        held.waiting = False
        self._in_flight[band] += 1
        return held

    def _expire(self, now: float) -> None:
        """Forget the calls that stopped lingering by ``now``."""
        lingering = self._lingering
        while lingering and lingering[0][0] <= now:
            band = lingering.popleft()[1]
            self._lingers[band] -= 1
            if not self._lingers[band]:
                del self._lingers[band]

    def _aged(self, now: float) -> list[Held[T]]:
        out: list[Held[T]] = []
        while (deadline := self.next_aging()) is not None and deadline <= now:
            held = heapq.heappop(self._aging)[2]
            self.drop(held)
            held.aged, held.band = True, 0
            self._in_flight[0] += 1
            out.append(held)
        return out
