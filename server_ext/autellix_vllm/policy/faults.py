"""Failures confined to one call: counted by kind, each kind logged once.

The scheduler must outlive a bug that shows up for one call (a policy that
cannot place or rank it, an engine hook that raises): that call gets a safe
answer instead, and the failure is counted here, where the engine's table and
its ``/metrics`` read it. Only the first failure of each kind is logged, with
its traceback, so a fault that repeats for every call cannot flood the log.
"""

from __future__ import annotations

import logging
from collections import Counter
from enum import StrEnum

logger = logging.getLogger(__name__)


class Hook(StrEnum):
    """What failed: a hook of the policy core or of the engine's scheduler. The
    value is the failure's name in ``hook_failures`` and on ``/metrics``."""

    # The policy core (policy/core.py).
    BASE = "base"
    PROGRAM_BASE = "program_base"
    RANK = "rank"
    OUTRANKS = "outranks"
    COMPLETE = "complete"
    # The engine's scheduler (engine/scheduler.py).
    ADD_REQUEST = "add_request"
    FINISH = "finish"
    PREEMPTION = "preemption"
    CHARGE = "charge"
    ADVANCE = "advance"
    # The engine's KV residency, called by its scheduler.
    RESIDENCY_ARRIVED = "residency arrived"
    RESIDENCY_FINISHING = "residency finishing"
    RESIDENCY_BEFORE_STEP = "residency before_step"
    RESIDENCY_END_PROGRAM = "residency end_program"


class Faults:
    """Contained failures by :class:`Hook` (counted under its value)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def record(self, hook: Hook, error: Exception, fallback: str) -> None:
        """Count a failure of ``hook``; ``fallback`` says what was done instead."""
        kind = hook.value
        self.counts[kind] += 1
        if self.counts[kind] == 1:
            logger.error(
                "Autellix %s failed (%s: %s); %s. Further %s failures are only counted"
                " (hook_failures in the table, autellix_hook_failures_total on /metrics).",
                kind,
                type(error).__name__,
                error,
                fallback,
                kind,
                exc_info=error,
            )
