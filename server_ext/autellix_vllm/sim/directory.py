"""The router's table of each program's service over all engines, as calls see it.

A call arrives with its program's service over every engine as prior service
(``X-Autellix-Prior-Service``); the engine ranks it by that (ATLAS/PLAS). Two
designs of that table:

* one global table, always fresh (``sync_s=None``, the default): a call sees
  the service of every call of its program that has ended, anywhere;
* the Ray Serve directory (``ray_serve.directory``) with ``sync_s`` seconds
  between report batches: each call is admitted by the directory (one
  synchronous message a call), but how calls ended travels to it in batches,
  one per ingress every ``sync_s`` (the ingress's ``report_interval_s``). A
  call then sees its program's service as of the last batch that landed: a
  call that ended after the last tick is not counted yet.

The model assumes one ingress per engine (the engine's completions are its
ingress's reports) with their flushes on the same ticks, multiples of
``sync_s``, and no admission carrying reports early (the real ingress also
sends its pending reports with its next admission): the staleness is the
design's worst case, at most ``sync_s``. It counts the directory's traffic:
admissions (one per call) and report batches (one per ingress per tick in
which any of its calls ended).
"""

from __future__ import annotations

import math
from collections import deque


class ServiceTable:
    """Each program's service over all engines, fresh or as of the last report batch."""

    def __init__(self, sync_s: float | None = None) -> None:
        if sync_s is not None and not (math.isfinite(sync_s) and sync_s > 0):
            raise ValueError("the table's sync interval must be a positive number of seconds")
        self.sync_s = sync_s
        self._landed: dict[str, float] = {}  # program id -> service the table knows
        # Reports not yet landed, in the order the calls ended: (lands at, program, service).
        self._pending: deque[tuple[float, str, float]] = deque()
        self._last_tick: dict[int, int] = {}  # ingress -> the tick of its last batch
        self.admissions = 0
        self.report_batches = 0
        self.reports = 0

    def service(self, program_id: str, now: float) -> float:
        """The program's service a call arriving at ``now`` is admitted with."""
        self.admissions += 1
        while self._pending and self._pending[0][0] <= now:
            _, pid, service = self._pending.popleft()
            self._add(pid, service)
        return self._landed.get(program_id, 0.0)

    def call_ended(self, program_id: str, service: float, ingress: int, now: float) -> None:
        """A call of ``program_id`` that ``ingress`` sent ended at ``now`` with ``service``."""
        self.reports += 1
        if self.sync_s is None:
            self._add(program_id, service)
            return
        tick = math.floor(now / self.sync_s) + 1  # its ingress's next flush
        if self._last_tick.get(ingress) != tick:
            self._last_tick[ingress] = tick
            self.report_batches += 1
        self._pending.append((tick * self.sync_s, program_id, service))

    def traffic(self, seconds: float) -> dict[str, float]:
        """Messages per second to the table over ``seconds``: admissions and report
        messages (fresh: each report is its own message)."""
        messages = self.reports if self.sync_s is None else self.report_batches
        return {
            "directory_admissions_per_s": self.admissions / seconds,
            "directory_reports_per_s": messages / seconds,
        }

    def _add(self, program_id: str, service: float) -> None:
        self._landed[program_id] = self._landed.get(program_id, 0.0) + service
