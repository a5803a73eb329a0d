"""Tunable parameters of the scheduling policy and the unit of attained service.

The paper leaves K, the level boundaries, the quanta and beta unspecified; the
defaults here were chosen by simulator sweeps (docs/scheduling.md shows them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

ServiceUnit = Literal["tokens", "time"]
AtlasVariant = Literal["program", "thread"]

# Default level boundaries in service units (token equivalents): Q1 holds programs
# that have attained less than 128 tokens of service, Q2 less than 512, ...; the
# growth factor 4 and K = 6 were chosen by `autellix simulate sweep` (see docs).
DEFAULT_BOUNDARIES: tuple[float, ...] = (0.0, 128.0, 512.0, 2048.0, 8192.0, 32768.0)


@dataclass(frozen=True)
class Levels:
    """K priority levels: level i holds service in ``[boundaries[i], boundaries[i+1])``.

    ``quanta[i]`` is how much service a call may attain in level i before it is
    demoted to level i + 1. By default a level's quantum is its width, so a call's
    level tracks its program's service plus its own; the last level never demotes.
    """

    boundaries: tuple[float, ...] = DEFAULT_BOUNDARIES
    quanta: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        b = self.boundaries
        if not all(math.isfinite(x) for x in b):
            raise ValueError(f"level boundaries must be finite numbers: {list(b)}")
        if not b or b[0] != 0:
            raise ValueError("level boundaries must start at 0")
        if any(hi <= lo for lo, hi in zip(b, b[1:], strict=False)):
            raise ValueError(f"level boundaries must increase strictly: {list(b)}")
        if not self.quanta:
            widths = tuple(hi - lo for lo, hi in zip(b, b[1:], strict=False)) + (math.inf,)
            object.__setattr__(self, "quanta", widths)
        if len(self.quanta) != len(b):
            raise ValueError("one quantum per level is needed")
        if any(q <= 0 for q in self.quanta):
            raise ValueError("quanta must be positive")

    @classmethod
    def parse(cls, text: str) -> Levels:
        """Levels from comma-separated boundaries, e.g. ``"0,128,512"`` (see ``__str__``)."""
        try:
            boundaries = tuple(float(x) for x in text.split(","))
        except ValueError:
            message = f"level boundaries must be comma-separated numbers: {text!r}"
            raise ValueError(message) from None
        return cls(boundaries=boundaries)

    def __str__(self) -> str:
        return ",".join(repr(b).removesuffix(".0") for b in self.boundaries)

    @classmethod
    def geometric(cls, k: int, first: float, growth: float) -> Levels:
        """``k`` levels whose upper edges are ``first * growth**i``."""
        if k < 1 or first <= 0 or growth <= 1:
            raise ValueError("need k >= 1, first > 0 and growth > 1")
        return cls(boundaries=(0.0,) + tuple(first * growth**i for i in range(k - 1)))

    @classmethod
    def unit(cls, k: int) -> Levels:
        """Levels one service unit wide: the level is the service itself (up to k - 1).

        With these, PLAS ranks a call by its program's completed service plus its
        own, re-evaluated after every unit, as in the paper's Figure 2 example.
        """
        return cls(boundaries=tuple(float(i) for i in range(k)))

    def __len__(self) -> int:
        return len(self.boundaries)

    def level_of(self, service: float) -> int:
        """The level a call enters when its program has attained ``service``."""
        b = self.boundaries
        lo, hi = 0, len(b) - 1
        while lo < hi:  # last boundary <= service
            mid = (lo + hi + 1) // 2
            if b[mid] <= service:
                lo = mid
            else:
                hi = mid - 1
        return lo


@dataclass(frozen=True)
class ServiceMeter:
    """Turns the work an engine did for a call into attained service.

    ``tokens`` (default): token equivalents, one per decoded token plus
    ``prefill_weight`` per prefilled token. It is what the engine, the router and
    the simulator can all count the same way, independent of hardware and load.
    ``time``: seconds of engine step time, the paper's definition; each step's
    duration is split among the calls in it by their share of the step's tokens.
    """

    unit: ServiceUnit = "tokens"
    prefill_weight: float = 0.0625

    def __post_init__(self) -> None:
        if self.unit not in ("tokens", "time"):
            raise ValueError(f"unknown service unit {self.unit!r}")
        if self.prefill_weight < 0:
            raise ValueError("prefill_weight must be >= 0")

    def amount(self, decode_tokens: int, prefill_tokens: int, seconds: float = 0.0) -> float:
        if self.unit == "time":
            return seconds
        return decode_tokens + self.prefill_weight * prefill_tokens


@dataclass(frozen=True)
class ProgramLimits:
    """How large one program may grow: the shape of its thread tree and its calls.

    A program's shape comes from its client, so it is bounded: the router refuses
    a call that would cross a limit (HTTP 400), and an engine runs such a call
    alone, as a program of its own, instead of growing the program. The defaults leave
    room for real agents (a LATS search forks a few hundred threads one level
    deep; nested fan-out rarely goes ten levels deep) and keep every walk over a
    program's threads small.
    """

    # Threads one program may open (its main thread included).
    max_threads: int = 4096
    # Forks between the main thread and the deepest thread (main is depth 0).
    max_fork_depth: int = 64
    # Calls of one program in flight at once (waiting or running).
    max_live_calls: int = 1024
    # Largest prior service a router may report for a program (service units):
    # far beyond any real program, small enough to keep sums exact.
    max_prior_service: float = 1e12

    def __post_init__(self) -> None:
        if min(self.max_threads, self.max_fork_depth, self.max_live_calls) < 1:
            raise ValueError("program limits must be positive")
        if not (math.isfinite(self.max_prior_service) and self.max_prior_service > 0):
            raise ValueError("max_prior_service must be a positive finite number")

    def bounded_prior_service(self, service: float) -> float:
        """``service`` (a program's prior service) at most ``max_prior_service``:
        the one clamp, what a router states and what an engine honours."""
        return min(service, self.max_prior_service)


DEFAULT_LIMITS = ProgramLimits()


@dataclass(frozen=True)
class TableBounds:
    """How large a process table may grow and how long it keeps what, one name
    per bound: the router's table (``router.programs``), the engines'
    (:class:`~autellix_vllm.policy.table.ProcessTable`) and the flags of
    ``autellix serve``, which hands the engines it starts the router's own
    (``engine.settings``).

    The counts of programs and ended ids bound the router's table, which knows
    the keys; an engine's table holds what its routers let in, for ``idle_ttl_s``.
    """

    # Programs with nothing in flight are dropped this long after their last activity.
    idle_ttl_s: float = 600.0
    # How large one program may grow.
    limits: ProgramLimits = DEFAULT_LIMITS
    # Programs in the table, in all and per key; when full (after dropping idle
    # programs) a new program is refused with 429 too_many_programs.
    max_programs: int = 100_000
    max_programs_per_key: int = 10_000
    # Ended program ids remembered (so that late calls get 404), oldest forgotten first.
    ended_ids_kept: int = 100_000

    def __post_init__(self) -> None:
        for name in ("idle_ttl_s", "max_programs", "max_programs_per_key", "ended_ids_kept"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")


DEFAULT_BOUNDS = TableBounds()


class ToolGaps(Protocol):
    """What the residency rules read of a program (a table's ``Program``): its tool
    gaps, the idle stretches from a completion to its next call."""

    gaps: int
    gap_total_s: float


@dataclass(frozen=True)
class ResidencyConfig:
    """How a KV-aware engine holds idle contexts and admits calls (policy.residency)."""

    # Share of the engine's KV blocks that holds of idle contexts may take.
    hold_share: float = 0.9
    # What a non-resident call must leave free for the resident contexts to grow:
    # this share of KV, or this share of the largest resident context if more (a
    # long context that cannot grow is preempted and recomputed, or its hold broken).
    headroom: float = 0.0
    growth_reserve: float = 0.5
    # Expected tool gap of a program with no history, and how many observed gaps
    # it weighs against the program's own.
    prior_gap_s: float = 2.0
    prior_weight: float = 2.0
    # A hold lasts this many expected gaps, within [min_ttl_s, max_ttl_s]. Tool gaps
    # are heavy-tailed and a lost context costs its whole prefill plus a wait to
    # re-enter the working set, so a hold outlasts most long gaps. A context a host
    # tier keeps is held as long: the tier may have dropped it by the time the
    # program is back, and the wait to re-enter the working set is the same.
    ttl_gaps: float = 24.0
    min_ttl_s: float = 1.0
    max_ttl_s: float = 60.0
    # While another owner's calls wait, an owner's holds together stay within its
    # fair share of the hold budget (policy.residency). False: holds are shared by
    # rank alone, whoever runs the programs (for comparison).
    fair_share: bool = True
    # A new program's first call outside the working set that has waited this long
    # may break holds of programs in worse levels, as a starving call may: a hold
    # never keeps a new program out longer (inf: only the working set decides).
    # 0 was chosen on agent sessions, seeds 0-4 (docs/scheduling.md, "KV residency").
    first_call_bound_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.hold_share <= 1 or not 0 <= self.headroom < 1:
            raise ValueError("hold_share must be in [0, 1] and headroom in [0, 1)")
        if self.growth_reserve < 0:
            raise ValueError("growth_reserve must be >= 0")
        if min(self.prior_gap_s, self.prior_weight, self.ttl_gaps) <= 0:
            message = "prior_gap_s, prior_weight and ttl_gaps must be positive"
            raise ValueError(message)
        if not 0 <= self.min_ttl_s <= self.max_ttl_s:
            raise ValueError("need 0 <= min_ttl_s <= max_ttl_s")
        if not self.first_call_bound_s >= 0:
            raise ValueError("first_call_bound_s must be >= 0")

    def expected_gap_s(self, program: ToolGaps) -> float:
        """The program's mean tool gap, pulled towards the prior while it has few."""
        total = self.prior_gap_s * self.prior_weight + program.gap_total_s
        return total / (self.prior_weight + program.gaps)

    def ttl_s(self, program: ToolGaps, hint_s: float | None = None) -> float:
        """How long to hold the program's idle context: a client's hint if it gave
        one, else ``ttl_gaps`` expected gaps; within the bounds."""
        if hint_s is not None:
            return self.bounded_ttl_s(hint_s)
        return self.bounded_ttl_s(self.ttl_gaps * self.expected_gap_s(program))

    def bounded_ttl_s(self, ttl_s: float) -> float:
        """``ttl_s`` within ``[min_ttl_s, max_ttl_s]``."""
        return min(max(ttl_s, self.min_ttl_s), self.max_ttl_s)


@dataclass(frozen=True)
class TenantConfig:
    """Priority bands and the fair share of service between owners (keys).

    A call ranks by its band first (0, interactive, is the best), then by its
    owner's attained service over the owner's weight, then by the policy. A call
    that has waited ``band_aging_s`` seconds since it arrived ranks as band 0,
    so a worse band is never starved past that bound by a better one; its wait
    counts from when it reached the router (:meth:`band_aged_at`).
    """

    band_aging_s: float = 120.0
    # Owner -> weight (its share of service is proportional); unlisted owners weigh 1.
    weights: Mapping[str, float] = field(default_factory=dict)
    # Owner -> the band of its calls that state none (the keys file's class for a
    # key); unlisted owners' calls are in band 0.
    bands: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.band_aging_s > 0:
            raise ValueError(f"band_aging_s must be positive, got {self.band_aging_s}")
        for owner, weight in self.weights.items():
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f"owner {owner!r}'s weight must be positive, got {weight}")
        for owner, band in self.bands.items():
            if isinstance(band, bool) or not isinstance(band, int) or band < 0:
                raise ValueError(f"owner {owner!r}'s band must be an integer >= 0, got {band!r}")

    def weight(self, owner: str) -> float:
        return self.weights.get(owner, 1.0)

    def band_aged_at(self, arrival_s: float, router_wait_s: float | None = None) -> float:
        """When a worse band's call that arrived at ``arrival_s`` ranks as band 0.

        ``router_wait_s``: how long the router's flow-control gate held it before
        sending it (``CallIdentity.router_wait_s``; None: not held). The bound
        counts from when the call reached the router, so the router's hold and
        the engine's queue together never exceed ``band_aging_s``; never before
        the call arrived (a wait longer than the bound ages it on arrival).
        """
        return arrival_s + max(0.0, self.band_aging_s - (router_wait_s or 0.0))

    def band(self, owner: str | None, stated: int | None) -> int:
        """The band of a call of ``owner`` that stated ``stated`` (None: none)."""
        if stated is not None:
            return stated
        return self.bands.get(owner, 0) if owner is not None else 0


@dataclass(frozen=True)
class PolicyConfig:
    """Everything that parameterises a policy; shared by engine, router and simulator."""

    levels: Levels = field(default_factory=Levels)
    meter: ServiceMeter = field(default_factory=ServiceMeter)
    # Anti-starvation: promote a waiting call to the top level once
    # (program wait + call wait) / (program service + call service) >= beta.
    # Waiting is counted in the same unit as service (engine steps for the token
    # unit, since one step decodes one token per call; seconds for the time unit).
    beta: float = 8.0
    # Guard for the ratio's denominator: a program with no service yet.
    min_service: float = 1.0
    atlas_variant: AtlasVariant = "thread"
    # How long the process table keeps an idle program, and how large one may grow.
    table: TableBounds = DEFAULT_BOUNDS
    # How a KV-aware policy's engine holds idle contexts and admits calls.
    residency: ResidencyConfig = field(default_factory=ResidencyConfig)
    # Priority bands with aging, and each owner's share of service inside a band.
    tenants: TenantConfig = field(default_factory=TenantConfig)

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError("beta must be positive")
        if self.atlas_variant not in ("program", "thread"):
            raise ValueError(f"unknown ATLAS variant {self.atlas_variant!r}")
