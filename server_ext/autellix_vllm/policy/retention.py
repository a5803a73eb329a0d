"""Retention rules: how a KV-aware policy's engine keeps idle contexts and admits calls.

:class:`~autellix_vllm.policy.residency.Residency` does the bookkeeping of holds
(blocks an idle context keeps referenced on the engine); a retention rule answers
the questions on which KV-aware systems differ:

* ``ttl_s``: how long an idle context is held (None: not at all; ``inf``: until
  displaced or its program ends);
* ``breakable``: which holds a call may take blocks from, in the order it takes them;
* ``working_set``: whether a call whose context is not resident waits until its
  whole context fits (autellix), or is admitted as vLLM admits (the peers);
* ``admits``: whether a program's calls may run at all now (ThunderAgent pauses
  programs);
* ``tick``: periodic decisions (ThunderAgent's pause and resume).

Each rule is one small class; a KV-aware policy names its rule
(``Policy.make_retention``). The default's rule is :class:`WorkingSet`; the
others follow the published designs of the systems a user would pick instead
of autellix (docs/scheduling.md, "The peers"), simplified where the
simulator and the engine cannot see what they see.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from .config import ResidencyConfig

if TYPE_CHECKING:
    from .residency import Hold, Residency
    from .table import Program


class Retention:
    """The default behaviour every rule starts from: hold for the engine's estimate
    (or the client's hint), any call may take blocks from any hold, oldest first,
    and admission is vLLM's (a call runs when its blocks can be had)."""

    name: ClassVar[str] = ""
    # A call whose context is not resident is admitted only if its whole context fits.
    working_set: ClassVar[bool] = False
    # With a host tier that keeps every live context, the rule steps aside.
    steps_aside_for_tier: ClassVar[bool] = False
    # Share of the engine's KV that holds may take (None: ResidencyConfig.hold_share).
    hold_share: ClassVar[float | None] = 1.0
    # Under KV pressure, preempt the running call cheapest to undo within the worst
    # level (Residency.victim) instead of vLLM's worst-ranked one.
    cheap_victims: ClassVar[bool] = False

    def ttl_s(
        self, residency: Residency, program: Program, blocks: int, hint_s: float | None
    ) -> float | None:
        """How long to hold ``program``'s idle context of ``blocks`` (None: do not)."""
        return residency.config.ttl_s(program, hint_s)

    def breakable(self, holds: Iterable[Hold], level: int) -> list[Hold]:
        """The holds a call of ``level`` may take blocks from, first to go first
        (a level below 0: a running call short of blocks, or an idle engine)."""
        return sorted(holds, key=lambda h: h.seq)

    def admits(self, program: Program) -> bool:
        """Whether ``program``'s calls may be admitted now."""
        return True

    def tick(self, residency: Residency, now: float) -> list[str]:
        """Periodic decisions at ``now``; returns the contexts whose holds it ended."""
        return []

    def next_tick(self) -> float | None:
        """When :meth:`tick` next has something to decide (None: nothing pending)."""
        return None


class WorkingSet(Retention):
    """autellix's rule (policy.residency's module docstring): holds for some expected
    tool gaps within a budget, granted and broken by program level; admission by
    working set; the rules step aside while a host tier keeps every live context."""

    name = "working-set"
    working_set = True
    steps_aside_for_tier = True
    hold_share = None
    cheap_victims = True

    def breakable(self, holds: Iterable[Hold], level: int) -> list[Hold]:
        worse = (h for h in holds if h.level > level)
        return sorted(worse, key=lambda h: (-h.level, h.seq))


class SoftRetention(Retention):
    """Soft retention as SGLang's priority eviction, TensorRT-LLM's retention
    priorities and vLLM's agent-hint RFC keep an agent's KV: an idle context is
    kept for the client's hint or the engine's estimate, but only as an eviction
    order: any call that needs blocks takes them from unheld cache first, then
    from holds, the oldest first. A hold never keeps a call waiting."""

    name = "soft"


class ContinuumTTL(Retention):
    """Continuum's time-to-live pins (arXiv 2511.02230): a context whose call ended
    in a tool call is pinned for the TTL that maximises ``P(gap <= ttl) * benefit -
    cost(ttl)``, where the benefit is what an eviction would cost (the context's
    prefill, in engine seconds) and the cost is the pinned share of KV times the
    TTL (engine seconds the pin takes from others). Tool gaps are learned per
    program (the engine sees no tool names) as exponential, the paper's cold
    start, which gives ``ttl = mean_gap * ln(benefit / (mean_gap * share))``:
    with the benefit the share times the time to prefill the whole KV, a pin
    lasts ``mean_gap * ln(kv_fill_s / mean_gap)``, none when a tool is expected
    to outlast a full refill. Simplified: the paper's benefit also counts the
    queueing delay an eviction adds, which the engine does not estimate here,
    so these TTLs are shorter than the paper's. Pins are not budgeted
    and new calls cannot break them; a running call short of blocks, or an idle
    engine, may (the paper's unpinning under memory pressure)."""

    name = "continuum"
    # Seconds to prefill the whole KV when the engine does not say (``kv_fill_s``):
    # an A100 with Llama-3.1-8B fills about 500k tokens at 15k tokens/s.
    DEFAULT_KV_FILL_S: ClassVar[float] = 33.0

    def ttl_s(
        self, residency: Residency, program: Program, blocks: int, hint_s: float | None
    ) -> float | None:
        config: ResidencyConfig = residency.config
        mean_gap = config.expected_gap_s(program)
        share = blocks / max(1, residency.capacity_blocks)
        fill_s = residency.kv_fill_s or self.DEFAULT_KV_FILL_S
        benefit = share * fill_s
        ratio = benefit / (mean_gap * share) if share > 0 else 0.0
        if ratio <= 1.0:
            return None
        return min(mean_gap * math.log(ratio), config.max_ttl_s)

    def breakable(self, holds: Iterable[Hold], level: int) -> list[Hold]:
        return super().breakable(holds, level) if level < 0 else []


class IdleRank(Retention):
    """MORI's tiering (arXiv 2606.00866): live programs ranked by how long they have
    been idle; the least idle keep their contexts in device memory, the most idle
    are the first to go (to the host tier, where there is one: it keeps what the
    engine writes through). No TTL: a context stays until a call needs its blocks
    or its program ends. The boundary between the tiers moves with their
    capacities because the device keeps as many of the busiest as fit."""

    name = "idle-rank"

    def ttl_s(
        self, residency: Residency, program: Program, blocks: int, hint_s: float | None
    ) -> float:
        return math.inf


class ThunderAgentPause(Retention):
    """ThunderAgent's program pausing (arXiv 2602.13692): a tick every
    ``TICK_S``; when the live programs' contexts (the working set) pass
    ``PAUSE_AT`` of the KV budget (device plus host tier), programs in a tool
    (holding an idle context) are paused, the largest first, until it is back
    under ``PAUSE_UNTIL``; a paused program's context may be evicted and its
    next call waits. Once the working set is ``HYSTERESIS`` below ``PAUSE_AT``,
    paused programs resume smallest first while they fit under that line; a
    program paused for ``FORCE_RESUME_S`` resumes regardless. An active
    program's idle context is kept until a call needs the blocks (the working
    set fits, so LRU would not take it). Simplified: no soft demotion between
    0.80 and 0.95 and no priority boost for a resumed call."""

    name = "thunderagent"
    TICK_S: ClassVar[float] = 5.0
    PAUSE_AT: ClassVar[float] = 0.95
    PAUSE_UNTIL: ClassVar[float] = 0.80
    HYSTERESIS: ClassVar[float] = 0.10
    FORCE_RESUME_S: ClassVar[float] = 1800.0

    def __init__(self) -> None:
        self.paused: dict[str, tuple[int, float]] = {}  # program id -> (blocks, since)
        self._next_tick = 0.0
        self.pauses = 0
        self.resumes = 0

    def ttl_s(
        self, residency: Residency, program: Program, blocks: int, hint_s: float | None
    ) -> float:
        return math.inf

    def admits(self, program: Program) -> bool:
        return program.program_id not in self.paused

    def next_tick(self) -> float | None:
        return self._next_tick if self.paused else None

    def tick(self, residency: Residency, now: float) -> list[str]:
        if now < self._next_tick:
            return []
        self._next_tick = now + self.TICK_S
        live = residency.live
        for program_id, (_, since) in list(self.paused.items()):
            if not live.has(program_id):
                del self.paused[program_id]  # ended or left the table while paused
            elif now - since >= self.FORCE_RESUME_S:
                del self.paused[program_id]
                self.resumes += 1
        budget = residency.capacity_blocks + residency.tier_blocks
        working = live.total - sum(blocks for blocks, _ in self.paused.values())
        if working > self.PAUSE_AT * budget:
            return self._pause(residency, now, working - self.PAUSE_UNTIL * budget)
        self._resume(now, (self.PAUSE_AT - self.HYSTERESIS) * budget - working)
        return []

    def _pause(self, residency: Residency, now: float, excess: float) -> list[str]:
        ended = []
        idle = sorted(residency.holds.values(), key=lambda h: (-h.blocks, h.seq))
        for hold in idle:
            if excess <= 0:
                break
            program_id = hold.program.program_id
            blocks = residency.live.blocks_of(program_id)
            self.paused[program_id] = (blocks, now)
            self.pauses += 1
            excess -= blocks
            for context in residency.release_program_holds(program_id):
                ended.append(context)
        return ended

    def _resume(self, now: float, room: float) -> None:
        for program_id, (blocks, _) in sorted(self.paused.items(), key=lambda p: p[1][0]):
            if blocks <= room:
                del self.paused[program_id]
                self.resumes += 1
                room -= blocks
