"""``autellix ray-serve`` as a subprocess for the tests that run one: started on a
free port (a local Ray cluster), waited for until its ingress answers, its
engines found among its processes, and stopped with everything it started."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from autellix_vllm.engine.launcher import REAPER_MODULE, free_port
from autellix_vllm.protocol.bearer import ENGINE_KEY_VARIABLE

START_TIMEOUT_S = 900
STOP_TIMEOUT_S = 180


@dataclass
class RayServed:
    """A ray-serve process, its root URL and where its output goes."""

    process: subprocess.Popen[bytes]
    url: str
    output: Path

    def started(self) -> list[psutil.Process]:
        """Every process it started that is still there (the cluster's, the engines)."""
        return psutil.Process(self.process.pid).children(recursive=True)

    def engines(self) -> list[tuple[str, str]]:
        """Each engine's base URL and key, read from its reaper's command line and
        environment (where its replica put them); once per engine, though the
        reaper's guard (a fork of it) shows the same command line."""
        found: list[tuple[str, str]] = []
        for process in self.started():
            with contextlib.suppress(psutil.NoSuchProcess):
                command = process.cmdline()
                if REAPER_MODULE in command:
                    port = command[command.index("--port") + 1]
                    key = process.environ()[ENGINE_KEY_VARIABLE]
                    engine = (f"http://127.0.0.1:{port}", key)
                    if engine not in found:
                        found.append(engine)
        return found


def start_ray_serve(folder: Path, *options: str, ready_key: str) -> RayServed:
    """Start ``autellix ray-serve OPTIONS`` and wait until ``GET /v1/models`` answers
    ``ready_key``'s call; stopped again if it does not get there."""
    port = free_port()
    output = folder / "ray-serve-output"
    command = [sys.executable, "-m", "autellix_vllm", "ray-serve", "--port", str(port), *options]
    with open(output, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    served = RayServed(process, f"http://127.0.0.1:{port}", output)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = output.read_text(errors="replace")[-3000:]
            pytest.fail(f"autellix ray-serve exited with {process.returncode}:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            auth = {"Authorization": f"Bearer {ready_key}"}
            if httpx.get(served.url + "/v1/models", headers=auth).status_code == 200:
                return served
        time.sleep(2)
    stop_ray_serve(served)
    pytest.fail("autellix ray-serve was not ready in time")


def stop_ray_serve(served: RayServed) -> None:
    """SIGTERM it and wait; whatever it started and left is killed (a test that
    checks the stop itself does not come here first)."""
    if served.process.poll() is not None:  # it stopped already (a test stopped it)
        return
    started = served.started()
    served.process.send_signal(signal.SIGTERM)
    try:
        served.process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        served.process.kill()
    for process in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
