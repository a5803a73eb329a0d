"""The scheduling policies: each says where a call starts and how completions count.

A policy is small on purpose. The shared mechanics (levels, demotion by quantum,
anti-starvation, preemption across levels) live in :mod:`.core`; a policy only
answers four questions:

* ``base(call)``: the service a call inherits on arrival (its starting level);
* ``complete(call, charged)``: how a finished call changes its program's priority;
* ``rank(call)``: the sort key, smaller served first;
* ``outranks(waiter, victim)``: may a waiting call preempt a running one?

Every subclass with a ``name`` registers itself in :data:`POLICIES`, which is
where the engine, the router and the simulator look policies up
(:func:`make_policy`): a new policy is one class here (plus its test).
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from ..registry import lookup
from .config import AtlasVariant
from .retention import (
    ContinuumTTL,
    IdleRank,
    Retention,
    SoftRetention,
    ThunderAgentPause,
    WorkingSet,
)
from .table import Call, Program, Rank

# A program's remaining work, known only to a simulator that knows its future.
Remaining = Callable[[Program], float]

# Policy name -> class, in the order the classes below are defined.
POLICIES: dict[str, type[Policy]] = {}


class Policy(ABC):
    name: ClassVar[str] = ""
    # Level policies use the levels (demotion, anti-starvation, preemption).
    uses_levels: ClassVar[bool] = True
    # Program-aware policies count the program's wait and service in anti-starvation.
    program_aware: ClassVar[bool] = True
    # Clairvoyant policies need each program's remaining work: simulator only.
    clairvoyant: ClassVar[bool] = False
    # KV-aware policies have the engine hold idle contexts and admit by working
    # set (policy.residency).
    kv_aware: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in vars(cls):  # a subclass that only refines (no name of its own) is not one
            POLICIES[cls.name] = cls

    @classmethod
    def build(cls, atlas_variant: AtlasVariant, remaining: Remaining | None) -> Policy:
        """An instance, given every option a policy may take (most take none)."""
        return cls()

    @abstractmethod
    def base(self, call: Call) -> float:
        """The priority base of a newly arrived call (in service units)."""

    def program_base(self, program: Program) -> float:
        """The base the program's next call would get (ranks idle programs)."""
        return program.attained_service

    def complete(self, call: Call, charged: float) -> None:  # noqa: B027 - optional hook
        """A call finished after being charged ``charged`` new service."""

    def rank(self, call: Call) -> Rank:
        return (call.level, call.seq)

    def outranks(self, waiter: Call, victim: Call) -> bool:
        # Only across level boundaries: equal levels never preempt (no thrash).
        return waiter.level < victim.level

    def rerank_on_progress(self, program: Program) -> bool:
        """Whether the program's waiting calls change rank when its other calls progress."""
        return False

    def make_retention(self) -> Retention:
        """A KV-aware policy's rule for holds and admission, one per engine
        (policy.retention)."""
        return WorkingSet()


class FCFS(Policy):
    """First come, first served: vLLM's default. Never preempts for a waiter."""

    name = "fcfs"
    uses_levels = False

    def base(self, call: Call) -> float:
        return 0.0

    def rank(self, call: Call) -> Rank:
        return (0, call.seq)

    def outranks(self, waiter: Call, victim: Call) -> bool:
        return False


class MLFQ(Policy):
    """Program-unaware multi-level feedback queue: every call starts in the top level."""

    name = "mlfq"
    program_aware = False

    def base(self, call: Call) -> float:
        return 0.0


class PLAS(Policy):
    """Program-level attained service (paper Eq. 1).

    A call starts at the level of the total service its program's completed calls
    have attained, so a program that has already run long waits behind short ones.
    """

    name = "plas"

    def base(self, call: Call) -> float:
        return call.program.attained_service


class ATLAS(Policy):
    """Adaptive thread-level attained service (paper Eq. 2): rank by critical path.

    ``program`` variant (the paper's implementation): one scalar per program, the
    longest critical path seen; every new call inherits it. ``thread`` variant:
    each thread tracks its own critical path; a forked thread starts at its
    parent's, a join takes the maximum over the joined children. On a
    single-threaded program both equal PLAS.
    """

    name = "atlas"

    def __init__(self, variant: AtlasVariant = "thread") -> None:
        self.variant = variant

    @classmethod
    def build(cls, atlas_variant: AtlasVariant, remaining: Remaining | None) -> Policy:
        return cls(atlas_variant)

    def base(self, call: Call) -> float:
        if self.variant == "program":
            return call.program.critical_path
        thread = call.thread
        thread.critical_path = thread.joined_critical_path()
        return thread.critical_path

    def program_base(self, program: Program) -> float:
        return program.critical_path

    def complete(self, call: Call, charged: float) -> None:
        path = call.base + call.service
        program = call.program
        program.critical_path = max(program.critical_path, path)
        call.thread.critical_path = max(call.thread.critical_path, path)


class PlasAtlas(ATLAS):
    """The paper's KV-blind order: PLAS for single-threaded programs, ATLAS for
    multi-threaded ones.

    On a program with one thread the critical path is the running sum of its
    calls' service, so both give the same rank from this engine's own counts; PLAS
    additionally honours service attained on other engines (a router's prior
    service), which a critical path cannot split across threads.
    """

    name = "plas-atlas"

    def base(self, call: Call) -> float:
        if call.program.multi_threaded:
            return super().base(call)
        return max(super().base(call), call.program.attained_service)

    def program_base(self, program: Program) -> float:
        if program.multi_threaded:
            return program.critical_path
        return max(program.critical_path, program.attained_service)


class Autellix(PLAS):
    """The default: PLAS for every program, with the engine's KV managed by
    program (policy.residency): idle contexts held by rank, admission by working
    set, cheap victims first.

    Fork/join programs rank by their total service too, not by their critical
    path (ATLAS): holds and the working set are per program, and a wide program's
    threads take seats and KV together, so what a program has taken from the
    engine is the sum over its threads. Ranked by critical path, a tree search
    with dozens of calls in flight keeps the rank of a short program and fills
    the batch ahead of short programs (docs/scheduling.md, "KV residency").

    ``critical_path`` is not tracked (it stays 0 in the process table).
    """

    name = "autellix"
    kv_aware = True

    def rank(self, call: Call) -> Rank:
        # Within a level, programs in the order they entered it: a program's next call
        # (after a tool) keeps its program's place instead of queueing behind
        # programs that came later, so programs finish in turn instead of sharing
        # the engine round-robin, and the working set turns over less.
        return (call.level, call.program_seq, call.seq)


# ---- the peers: what a user would pick instead of autellix ----------------------------
# Each is FCFS-ordered, as the systems run on vLLM's scheduler, with the KV rule of
# its paper (policy.retention); docs/scheduling.md, "The peers".


class Continuum(Policy):
    """Continuum (arXiv 2511.02230): program-level FCFS (a program's calls rank by
    its first call's arrival) and time-to-live pins of a context between calls."""

    name = "continuum"
    uses_levels = False
    kv_aware = True

    def base(self, call: Call) -> float:
        return 0.0

    def rank(self, call: Call) -> Rank:
        return (0, call.program_seq, call.seq)

    def outranks(self, waiter: Call, victim: Call) -> bool:
        return False

    def make_retention(self) -> Retention:
        return ContinuumTTL()


class ThunderAgent(FCFS):
    """ThunderAgent (arXiv 2602.13692; NVIDIA Dynamo's program scheduler): FCFS, and
    programs in a tool paused while the working set exceeds the KV budget."""

    name = "thunderagent"
    kv_aware = True

    def make_retention(self) -> Retention:
        return ThunderAgentPause()


class Mori(FCFS):
    """MORI (arXiv 2606.00866): FCFS, idle contexts kept in device memory by how
    recently their program was busy, the most idle demoted first."""

    name = "mori"
    kv_aware = True

    def make_retention(self) -> Retention:
        return IdleRank()


class LruPriority(FCFS):
    """Soft retention (SGLang's priority eviction, vLLM's agent-hint RFC): FCFS, an
    agent's idle context evicted last for its hint or the engine's estimate, never
    reserved."""

    name = "lru-priority"
    kv_aware = True

    def make_retention(self) -> Retention:
        return SoftRetention()


class SRPT(Policy):
    """Clairvoyant oracle: shortest remaining program work first (simulator only).

    ``remaining`` returns the work a program still has to do; only a simulator
    that knows every program's future can supply it.
    """

    name = "srpt"
    uses_levels = False
    clairvoyant = True

    def __init__(self, remaining: Remaining) -> None:
        self.remaining = remaining

    @classmethod
    def build(cls, atlas_variant: AtlasVariant, remaining: Remaining | None) -> Policy:
        if remaining is None:
            raise ValueError("srpt is a clairvoyant oracle: it needs each program's remaining work")
        return cls(remaining)

    def base(self, call: Call) -> float:
        return 0.0

    def rank(self, call: Call) -> Rank:
        return (self.remaining(call.program), call.seq)

    def outranks(self, waiter: Call, victim: Call) -> bool:
        return self.remaining(waiter.program) < self.remaining(victim.program)

    def rerank_on_progress(self, program: Program) -> bool:
        return True


POLICY_NAMES = tuple(POLICIES)

# The systems a user would pick instead of autellix, as the matrix's and sweeps' columns.
PEER_POLICIES = (Continuum.name, ThunderAgent.name, Mori.name, LruPriority.name)

# What every engine, router, simulation and benchmark runs unless told otherwise.
DEFAULT_POLICY = Autellix.name

# Old name -> current name. An old name still works, with a warning, for a while.
DEPRECATED_POLICY_NAMES = {"autellix-kv": Autellix.name}


def policy_name(name: str) -> str:
    """``name``, or the current name of a deprecated one (with a FutureWarning).

    Unknown names pass through unchanged, for the caller's lookup to reject.
    """
    current = DEPRECATED_POLICY_NAMES.get(name)
    if current is None:
        return name
    warnings.warn(
        f"policy {name!r} is now called {current!r} (the default); {name!r} will go",
        FutureWarning,
        stacklevel=2,
    )
    return current


def make_policy(
    name: str, atlas_variant: AtlasVariant = "thread", remaining: Remaining | None = None
) -> Policy:
    """Build a policy by name (``srpt`` needs the oracle ``remaining``)."""
    return lookup(POLICIES, policy_name(name), "policy").build(atlas_variant, remaining)
