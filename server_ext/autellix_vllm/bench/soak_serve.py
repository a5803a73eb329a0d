"""The soak's ``autellix serve``: a subprocess in its own session, its keys, what it
prints (engines ready, dead, restarted), and the settings of the run.

Part of ``autellix bench soak`` (:mod:`autellix_vllm.bench.soak`).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from autellix_vllm.bench.subprocesses import (
    ENGINE_EXITED,
    ENGINE_READY,
    ENGINE_RESTARTED,
    ROUTER_READY,
)
from autellix_vllm.engine.reaper import dies_with_parent
from autellix_vllm.protocol.bearer import ENGINE_KEY_VARIABLE

ENGINES = 2
MODEL = "tiny"


@dataclass(frozen=True)
class SoakSettings:
    """What a run is asked for: its length, load and seed, and serve's limits."""

    minutes: float = 10.0
    rate: float = 1.0  # honest programs started per second
    seed: int = 0
    max_tokens: int = 8  # per call
    kill_at: float = 1 / 3  # of the run
    max_programs_per_key: int = 200  # serve's cap; what mallory's flood reaches
    health_interval_s: float = 0.1
    startup_timeout_s: float = 600.0
    # How long programs still running when arrivals stop may take to finish.
    drain_timeout_s: float = 180.0


def say(message: str) -> None:
    """One progress line on stderr (stdout carries only the result)."""
    print(f"autellix bench soak: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Keys:
    """A run's fresh keys: the two clients' (serve's keys file), the admin's, the engines'."""

    alice: str
    mallory: str
    admin: str
    engine: str

    @classmethod
    def fresh(cls) -> Keys:
        return cls(*(f"sk-soak-{secrets.token_urlsafe(16)}" for _ in range(4)))

    def write_file(self, path: Path) -> Path:
        path.write_text(f"alice: {self.alice}\nmallory: {self.mallory}\n")
        path.chmod(0o600)
        return path


_ENGINE_READY = re.compile(ENGINE_READY)
_ENGINE_EXITED = re.compile(ENGINE_EXITED)
_ENGINE_BACK = re.compile(ENGINE_RESTARTED)


@dataclass
class Served:
    """A running ``autellix serve``, from what it prints."""

    process: subprocess.Popen[str]
    url: str = ""
    engine_urls: dict[int, str] = field(default_factory=dict)
    # Engine -> its reaper's pid, which is also its process group (the newest start).
    engine_groups: dict[int, int] = field(default_factory=dict)
    groups_seen: set[int] = field(default_factory=set)
    deaths: int = 0
    restarts: int = 0
    ready: threading.Event = field(default_factory=threading.Event)

    def read_output(self) -> None:
        """Echo serve's lines to stderr and note engines, deaths and restarts."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            print(f"  serve| {line}", end="", file=sys.stderr, flush=True)
            if found := _ENGINE_READY.search(line):
                self.engine_urls[int(found[1])] = found[2]
                self._engine_started(int(found[1]), int(found[3]))
            elif found := _ENGINE_BACK.search(line):
                self.restarts += 1
                self._engine_started(int(found[1]), int(found[3]))
            elif _ENGINE_EXITED.search(line):
                self.deaths += 1
            elif found := re.search(ROUTER_READY, line):
                self.url = found[1]
                self.ready.set()

    def _engine_started(self, engine: int, group: int) -> None:
        self.engine_groups[engine] = group
        self.groups_seen.add(group)


@contextlib.contextmanager
def serving(settings: SoakSettings, keys: Keys, folder: Path) -> Iterator[Served]:
    """``autellix serve`` for the duration of the block; stopped (SIGTERM, then
    SIGKILL of its group and of every engine group it had) however the block ends."""
    command = [
        sys.executable, "-m", "autellix_vllm", "serve", "--port", "0",
        "--engines", str(ENGINES), "--model", MODEL, "--chars-per-token", "1",
        "--max-model-len", "1024", "--max-num-seqs", "8", "--health-interval", "0.5",
        "--api-keys-file", str(keys.write_file(folder / "keys")), "--admin-key", keys.admin,
        "--max-programs-per-key", str(settings.max_programs_per_key),
        "--log-dir", str(folder), "--startup-timeout", str(settings.startup_timeout_s),
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a terminal's Ctrl-C reaches the bench, which stops serve
        preexec_fn=dies_with_parent(),  # and a bench killed outright takes serve along
        env={**os.environ, ENGINE_KEY_VARIABLE: keys.engine},
    )
    served = Served(process)
    threading.Thread(target=served.read_output, daemon=True).start()
    try:
        deadline = time.monotonic() + settings.startup_timeout_s + 60
        while not served.ready.wait(0.5):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"autellix serve did not get ready (exit code {process.poll()})")
        yield served
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            process.wait()
        for group in served.groups_seen:  # nothing may outlive the run
            _kill_group(group)


def _kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
