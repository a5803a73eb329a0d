"""The engine's process tree dies with its server and with its launcher, and a
dead engine is restarted on its port (stand-in servers: no vLLM, seconds)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from autellix_vllm.engine import reaper
from autellix_vllm.engine.launcher import (
    EngineConfig,
    EngineProcess,
    EngineSupervisor,
    RestartBackoff,
)
from polling import wait_until, wait_until_gone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A stand-in for vLLM's API server: it spawns a "worker" that outlives it (as
# vLLM's engine core does) and answers GET /health on the port it is given.
SERVER = """
import http.server, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(
        EngineProcess, "command", lambda self: [sys.executable, "-c", SERVER, str(self.port)]
    )


def server_of(engine: EngineProcess) -> int:
    """The server's pid: the reaper's child that is not its guard (a fork of it)."""
    reaper_pid = engine.process.pid
    children = Path(f"/proc/{reaper_pid}/task/{reaper_pid}/children")
    command = Path(f"/proc/{reaper_pid}/cmdline").read_bytes()

    def server() -> list[int]:
        pids = [int(pid) for pid in children.read_text().split()]
        return [pid for pid in pids if Path(f"/proc/{pid}/cmdline").read_bytes() != command]

    return wait_until(server)[0]


def test_a_killed_server_takes_its_whole_group_with_it(stand_in):
    engine = EngineProcess(EngineConfig(port=0)).start()
    try:
        engine.wait_healthy(timeout_s=30)
        group = engine.process.pid
        wait_until(  # reaper, its guard, server, worker
            lambda: reaper.group_members(group), lambda members: len(members) == 4
        )
        os.kill(server_of(engine), signal.SIGKILL)
        assert engine.process.wait(timeout=10) == 128 + signal.SIGKILL
        wait_until_gone(group)
    finally:
        engine.stop()


LAUNCHER = """
import sys, time
from autellix_vllm.engine.launcher import EngineConfig, EngineProcess
EngineProcess.command = lambda self: [sys.executable, "-c", sys.argv[1], str(self.port)]
engine = EngineProcess(EngineConfig(port=0)).start()
engine.wait_healthy(30)
print(engine.process.pid, flush=True)
time.sleep(600)
"""


def test_a_sigkilled_launcher_leaves_no_engine_process():
    started = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, SERVER], stdout=subprocess.PIPE, text=True
    )
    try:
        group = int(started.stdout.readline())
        assert len(reaper.group_members(group)) == 4  # reaper, its guard, server, worker
        started.kill()  # SIGKILL: the launcher runs no cleanup at all
        started.wait(timeout=10)
        wait_until_gone(group)
    finally:
        started.kill()
        started.wait()


def test_a_sigkilled_reaper_leaves_no_engine_process(stand_in):
    """As when Ray kills a dead replica's child processes: the reaper first."""
    engine = EngineProcess(EngineConfig(port=0)).start()
    try:
        engine.wait_healthy(timeout_s=30)
        group = engine.process.pid
        wait_until(lambda: reaper.group_members(group), lambda members: len(members) == 4)
        engine.process.kill()
        wait_until_gone(group)
    finally:
        engine.stop()


def test_the_reaper_passes_a_signal_for_it_alone_on_to_the_server(stand_in):
    engine = EngineProcess(EngineConfig(port=0)).start()
    try:
        engine.wait_healthy(timeout_s=30)
        engine.process.send_signal(signal.SIGTERM)  # the reaper only, not its group
        assert engine.process.wait(timeout=10) == 128 + signal.SIGTERM
        wait_until_gone(engine.process.pid)
    finally:
        engine.stop()


def test_backoff_doubles_to_its_cap_and_resets_after_a_healthy_run():
    backoff = RestartBackoff(first_s=1, cap_s=8, healthy_reset_s=60)
    assert [backoff.delay(healthy_for_s=5) for _ in range(6)] == [1, 2, 4, 8, 8, 8]
    assert backoff.delay(healthy_for_s=60) == 1
    assert backoff.delay(healthy_for_s=0) == 2


def test_the_supervisor_restarts_a_dead_engine_on_its_port(stand_in):
    engine = EngineProcess(EngineConfig(port=0)).start()
    events: list[str] = []
    supervisor = EngineSupervisor(
        engine, events.append, backoff=RestartBackoff(first_s=0.1), poll_s=0.05
    )
    try:
        engine.wait_healthy(timeout_s=30)
        supervisor.start()
        port, first = engine.port, engine.process.pid

        def pid() -> int | None:
            # None while the supervisor is between the old process and the new one.
            return engine.process.pid if engine.process is not None else None

        os.killpg(first, signal.SIGKILL)
        wait_until(
            lambda: events[-1:],
            lambda last: last == [f"healthy again after restart 1 (pid {pid()})"],
            timeout_s=30,
        )
        assert events[0] == f"exited with code {-signal.SIGKILL}; restarting it in 0 s"
        assert engine.port == port and engine.process.pid != first and engine.is_healthy()
        assert not reaper.group_members(first)
    finally:
        supervisor.close()
        engine.stop()
    assert supervisor.restarts == 1


def test_closing_the_supervisor_interrupts_a_restart_wait(stand_in, monkeypatch):
    # A server that never gets healthy: the supervisor waits on it until closed.
    monkeypatch.setattr(EngineProcess, "is_healthy", lambda self: False)
    engine = EngineProcess(EngineConfig(port=0)).start()
    supervisor = EngineSupervisor(engine, lambda line: None, backoff=RestartBackoff(first_s=0))
    supervisor.poll_s = 0.05
    supervisor.start()
    try:
        os.killpg(engine.process.pid, signal.SIGKILL)
        wait_until(lambda: supervisor.restarts, lambda restarts: restarts == 1)
        closing = threading.Thread(target=supervisor.close)
        started = time.monotonic()
        closing.start()
        closing.join(timeout=10)
        assert not closing.is_alive() and time.monotonic() - started < 5
    finally:
        engine.stop()
    assert not reaper.group_members(engine.process.pid)
