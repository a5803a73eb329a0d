"""``autellix serve`` as a subprocess for the tests that run one: started on a
free port, its output read up to the ready line (then in the background), and
stopped with everything it started, whatever happened."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest
from autellix_vllm.bench.subprocesses import ENGINE_READY
from autellix_vllm.engine.reaper import group_alive

SERVE = [sys.executable, "-m", "autellix_vllm"]


@dataclass
class Served:
    """A serve process and what its output said: the router's URL, and each
    engine's URL and process group (its reaper's pid)."""

    process: subprocess.Popen[str]
    url: str = ""
    engine_urls: dict[int, str] = field(default_factory=dict)
    engine_pids: dict[int, int] = field(default_factory=dict)
    output: list[str] = field(default_factory=list)


def start_serve(*options: str, env: dict[str, str] | None = None) -> Served:
    process = subprocess.Popen(
        [*SERVE, "serve", "--port", "0", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    return Served(process)


def read_until_ready(served: Served, timeout_s: float = 600) -> None:
    """Read serve's output up to its ready line, then keep reading it in the background."""
    deadline = time.monotonic() + timeout_s
    assert served.process.stdout is not None
    for line in served.process.stdout:
        served.output.append(line)
        if found := re.search(ENGINE_READY, line):
            served.engine_urls[int(found[1])] = found[2]
            served.engine_pids[int(found[1])] = int(found[3])
        if found := re.search(r"router ready at (\S+);", line):
            served.url = found[1]
            threading.Thread(target=keep_reading, args=(served,), daemon=True).start()
            return
        assert time.monotonic() < deadline, "autellix serve did not get ready"
    pytest.fail("autellix serve exited early:\n" + "".join(served.output))


def keep_reading(served: Served) -> None:
    assert served.process.stdout is not None
    for line in served.process.stdout:
        served.output.append(line)


def stop_serve(served: Served) -> None:
    """SIGTERM serve and wait for it; whatever is left of it or its engines is killed."""
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGTERM)
        try:
            served.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(served.process.pid, signal.SIGKILL)
    for pid in served.engine_pids.values():  # nothing may survive, whatever happened
        if group_alive(pid):
            os.killpg(pid, signal.SIGKILL)
