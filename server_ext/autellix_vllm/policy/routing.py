"""Choosing an engine for a call: the paper's locality-aware rule and baselines.

Used unchanged by the router and the simulator. A balancer sees the engines as
a list of :class:`EngineLoad` (healthy ones only) and returns the index of the
one to use plus the reason, which the router reports in its metrics.

Load signal: the calls an engine is running or has waiting (the router counts
its in-flight calls and adds the engine's reported queue). The paper leaves the
metric of LEAST_USED open; counting calls is what its Least-Used baseline does.

Every subclass with a ``name`` registers itself in :data:`BALANCERS`
(:func:`make_balancer` builds one by name): a new balancer is one class here.
"""

from __future__ import annotations

import bisect
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..registry import lookup

# Every program is bound to the engine of its first call. The paper's 2048
# spreads a program's short calls over the engines, each prefilling its context
# again; bound, the default policy meets its targets in all 20 cells of the
# simulated four-engine matrix (docs/benchmarks.md, "Routing on four engines").
DEFAULT_LOCALITY_THRESHOLD = 0

# Balancer name -> class, in the order the classes below are defined.
BALANCERS: dict[str, type[Balancer]] = {}


@dataclass(frozen=True)
class EngineLoad:
    name: str
    load: float


@dataclass(frozen=True)
class Route:
    """The engine a balancer chose, and whether that ties the program to it.

    ``binds`` says the program should keep going to this engine (its KV lives
    there): the router records the binding and rebinds the program when the
    engine leaves rotation. ``reason`` is for metrics only.
    """

    index: int
    reason: str  # "sticky", "least-loaded", "bind", "round-robin", "hash"
    binds: bool = False


class Balancer(ABC):
    name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in vars(cls):
            BALANCERS[cls.name] = cls

    @classmethod
    def build(cls, threshold: int) -> Balancer:
        """An instance, given every option a balancer may take (most take none)."""
        return cls()

    @abstractmethod
    def choose(self, program_id: str, prompt_tokens: int, engines: Sequence[EngineLoad]) -> Route:
        """Pick one of ``engines`` (non-empty, healthy) for a call of ``program_id``."""

    def forget(self, program_id: str) -> None:  # noqa: B027 - stateless balancers keep nothing
        """The program ended: drop anything kept for it."""

    def adopt(self, program_id: str, engine: str) -> None:  # noqa: B027 - nothing to adopt
        """The program is bound to ``engine`` by a decision made elsewhere (another
        router replica, recorded in a shared table): follow it from now on."""


def least_loaded(engines: Sequence[EngineLoad]) -> int:
    """Index of the engine with the smallest load (the first on ties)."""
    return min(range(len(engines)), key=lambda i: engines[i].load)


class RoundRobin(Balancer):
    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, program_id: str, prompt_tokens: int, engines: Sequence[EngineLoad]) -> Route:
        index = self._next % len(engines)
        self._next += 1
        return Route(index, "round-robin")


class LeastUsed(Balancer):
    name = "least-used"

    def choose(self, program_id: str, prompt_tokens: int, engines: Sequence[EngineLoad]) -> Route:
        return Route(least_loaded(engines), "least-loaded")


class Locality(Balancer):
    """Paper Algorithm 2: short calls to the least-loaded engine, long calls sticky.

    A call of at most ``threshold`` prompt tokens goes wherever load is lowest
    (any engine caches short shared prefixes well); a longer one goes to the
    engine its program is bound to, binding it to the least-loaded engine on
    first use, so the program's long context is reused rather than recomputed.
    With the default threshold 0 every call is "long": each program stays on one
    engine. A binding to an engine that is no longer offered (dead) is replaced.
    """

    name = "locality"

    def __init__(self, threshold: int = DEFAULT_LOCALITY_THRESHOLD) -> None:
        self.threshold = threshold
        self.bindings: dict[str, str] = {}

    @classmethod
    def build(cls, threshold: int) -> Balancer:
        return cls(threshold)

    def choose(self, program_id: str, prompt_tokens: int, engines: Sequence[EngineLoad]) -> Route:
        if prompt_tokens <= self.threshold:
            return Route(least_loaded(engines), "least-loaded")
        bound = self.bindings.get(program_id)
        if bound is not None:
            for i, engine in enumerate(engines):
                if engine.name == bound:
                    return Route(i, "sticky", binds=True)
        index = least_loaded(engines)
        self.bindings[program_id] = engines[index].name
        return Route(index, "bind", binds=True)

    def forget(self, program_id: str) -> None:
        self.bindings.pop(program_id, None)

    def adopt(self, program_id: str, engine: str) -> None:
        self.bindings[program_id] = engine


class ConsistentHash(Balancer):
    """A hash ring on program id (160 virtual nodes per engine, like vLLM's router)."""

    name = "consistent-hash"
    _VNODES = 160

    def __init__(self) -> None:
        self._ring_for: tuple[str, ...] = ()
        self._points: list[int] = []
        self._owners: list[str] = []

    def choose(self, program_id: str, prompt_tokens: int, engines: Sequence[EngineLoad]) -> Route:
        names = tuple(e.name for e in engines)
        if names != self._ring_for:
            self._build(names)
        i = bisect.bisect(self._points, _hash(program_id)) % len(self._points)
        return Route(names.index(self._owners[i]), "hash", binds=True)

    def _build(self, names: tuple[str, ...]) -> None:
        ring = sorted((_hash(f"{n}#{v}"), n) for n in names for v in range(self._VNODES))
        self._ring_for = names
        self._points = [p for p, _ in ring]
        self._owners = [n for _, n in ring]


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


BALANCER_NAMES = tuple(BALANCERS)


def make_balancer(name: str, threshold: int = DEFAULT_LOCALITY_THRESHOLD) -> Balancer:
    """Build a balancer by name (``threshold``: the locality rule's prompt tokens).

    A ValueError for an unknown name or a negative threshold: every front end
    (router, Ray Serve, simulator) checks its settings by building one."""
    if threshold < 0:
        raise ValueError(f"locality_threshold must be >= 0, got {threshold}")
    return lookup(BALANCERS, name, "load balancer").build(threshold)
