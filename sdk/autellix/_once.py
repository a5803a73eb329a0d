"""Warnings the SDK logs once per process, however many programs or OS threads hit them."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("autellix")

_warned: set[str] = set()
_lock = threading.Lock()  # two OS threads may hit the same warning at once


def warn_once(key: str, message: str, *args: object) -> None:
    """Log `message % args` on the `autellix` logger, unless `key` was warned about before."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(message, *args)
