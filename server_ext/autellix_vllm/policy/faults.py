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

logger = logging.getLogger(__name__)


class Faults:
    """Contained failures by kind (``"base"``, ``"rank"``, ``"add_request"``, ...)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def record(self, kind: str, error: Exception, fallback: str) -> None:
        """Count a failure of ``kind``; ``fallback`` says what was done instead."""
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
