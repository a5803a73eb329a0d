"""Helper processes of the router and SDK benchmarks (a fake upstream, a router)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Started:
    ready: str  # the first group of the ready line
    pid: int


@contextlib.contextmanager
def running(command: list[str], ready: str, timeout_s: float = 120.0) -> Iterator[Started]:
    """Run ``command`` for the duration of the block.

    Waits for an output line matching the regex ``ready`` and yields its first
    group with the process id; the process is terminated (then killed) when the
    block ends.
    """
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + timeout_s
        for line in process.stdout:
            found = re.search(ready, line)
            if found:
                # Keep reading its output, so a chatty process never blocks on a full pipe.
                threading.Thread(target=process.stdout.read, daemon=True).start()
                yield Started(found.group(1), process.pid)
                return
            if time.monotonic() > deadline:
                break
        raise RuntimeError(f"{' '.join(command)} did not start (exit code {process.poll()})")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def router_command(upstreams: list[str], *options: str) -> list[str]:
    """``autellix serve --upstream ...`` on a free port, as deployed."""
    command = [sys.executable, "-m", "autellix_vllm", "serve", "--port", "0"]
    for url in upstreams:
        command += ["--upstream", url]
    return command + list(options)


# The lines of `autellix serve` that readers of its output wait for
# (cli/serve.py and the engine supervisor in engine/launcher.py write them).
ROUTER_READY = r"router ready at (http://\S+);"
ENGINE_READY = r"engine (\d+) ready at (\S+) \(pid (\d+)\)"  # index, URL, process group
ENGINE_EXITED = r"engine (\d+) \(\S+\) exited with code"
ENGINE_RESTARTED = r"engine (\d+) \(\S+\) healthy again after restart (\d+) \(pid (\d+)\)"

FAKE_UPSTREAM_COMMAND = [sys.executable, "-m", "autellix_vllm.bench.fake_upstream", "--port", "0"]
"""The minimal upstream of :mod:`autellix_vllm.bench.fake_upstream` on a free port."""
FAKE_UPSTREAM_READY = r"PORT (\d+)"


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` so far (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
