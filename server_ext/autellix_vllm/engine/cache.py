"""The cache folder where autellix builds its models, and how a folder is built there.

Models are built on first use (the tiny model's files, the real model's
conversion) and reused after; several processes may need the same model at
once (``autellix serve`` starts engines in parallel), and a build may be killed
half way. :func:`build_once` makes both safe.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def default_cache_dir() -> Path:
    """``$AUTELLIX_CACHE`` if set, else ``~/.cache/autellix``."""
    root = os.environ.get("AUTELLIX_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "autellix"


def build_once(target: Path, write: Callable[[Path], None]) -> Path:
    """Return ``target``, first filling it with ``write(staging)`` if it is missing.

    ``write`` fills a staging folder beside ``target``, renamed into place only
    once complete, so neither an interrupted build nor a concurrent first use
    ever sees half a folder. Staging folders left by a killed build (the process
    id in their name no longer runs) are removed first.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_staging(target)
    prefix = f"{_staging_prefix(target)}{os.getpid()}-"
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    try:
        write(staging)
        try:
            staging.rename(target)
        except OSError:
            # Another process finished first; its folder is as good as ours.
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _staging_prefix(target: Path) -> str:
    return f".{target.name}.staging-"


def _remove_abandoned_staging(target: Path) -> None:
    prefix = _staging_prefix(target)
    for staging in target.parent.glob(prefix + "*"):
        pid = staging.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True
