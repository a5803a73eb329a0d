"""Run one command as the head of its process group, and take the group down with it.

    python -m autellix_vllm.engine.reaper --parent PID -- COMMAND ...

The launcher starts every vLLM server through this process, in a new session,
so that the group is this process's. vLLM's API server spawns an engine-core
process, which spawns a worker; neither dies with its parent: a killed API
server left them (about 2.5 GB) running under pid 1. So this process:

* kills every other process of its group when the server (its child) exits,
  then exits with the server's code (128 + N when signal N killed it);
* kills the whole group, itself included, when its parent (the launcher:
  ``autellix serve``, ``autellix engine``) is gone, even after a SIGKILL. It
  polls the parent's pid: a parent-death signal fires when the *thread* that
  started the process ends, and launchers start engines from worker threads;
* starts the server with a parent-death signal (Linux), so the server dies
  with this process even if this one is killed;
* forks a guard that kills the whole group if this process is killed before
  it could (SIGKILL): a launcher's own cleanup may kill its direct children
  first (Ray kills a replica's child processes when the replica's worker
  exits), and vLLM's engine core and worker have no parent-death signal, so
  they would outlive the server under pid 1;
* passes SIGTERM, SIGINT and SIGHUP sent to it alone on to the server (a
  signal to the whole group reaches the server anyway; a second SIGTERM to
  vLLM's server is harmless).

Only the standard library: it runs before vLLM is imported and costs a few MB.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

POLL_S = 0.2
# How the launcher runs this module (``python -m``), so its guard's command line too.
MODULE = "autellix_vllm.engine.reaper"
# prctl(2) option: the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autellix_vllm.engine.reaper")
    parser.add_argument("--parent", type=int, required=True, help="the launcher's pid")
    parser.add_argument("command", nargs="+", help="the server's command line, after --")
    args = parser.parse_args(argv)
    group = os.getpgrp()
    server = subprocess.Popen(args.command, preexec_fn=dies_with_parent())
    start_guard(group)

    def forward(signum: int, frame: FrameType | None) -> None:
        server.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    while True:
        try:
            code = server.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            if os.getppid() != args.parent:  # the launcher is gone: so is everything it ran
                os.killpg(group, signal.SIGKILL)
    kill_group_but_this_process(group)
    return code if code >= 0 else 128 - code


def server_of(reaper_pid: int) -> int:
    """The server a running reaper started (Linux): its one child that is not its
    guard, which is a fork of the reaper and shows the reaper's command line."""
    children = Path(f"/proc/{reaper_pid}/task/{reaper_pid}/children").read_text().split()
    servers = [pid for pid in children if MODULE not in _command_line(pid)]
    if len(servers) != 1:
        raise RuntimeError(f"engine reaper {reaper_pid} has children {children}, not one server")
    return int(servers[0])


def _command_line(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:  # it ended meanwhile: not the server
        return MODULE


def start_guard(group: int) -> None:
    """Fork a process that SIGKILLs ``group`` once this one is gone without having
    done so (it was killed); this process kills the guard with the rest of the
    group when it ends normally. The guard holds none of this process's output
    and ignores the signals that ask the server to stop."""
    reaper = os.getpid()
    if os.fork() != 0:
        return
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        while os.getppid() == reaper:
            time.sleep(POLL_S)
        os.killpg(group, signal.SIGKILL)
    finally:
        os._exit(0)


def dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when this process dies
    (Linux; elsewhere None). If this process died before the child set it, the
    child exits at once."""
    libc_name = ctypes.util.find_library("c")
    prctl = getattr(ctypes.CDLL(libc_name, use_errno=True), "prctl", None) if libc_name else None
    if prctl is None or not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return set_death_signal


def kill_group_but_this_process(group: int) -> None:
    """SIGKILL every live process of ``group`` except this one. Without ``/proc``
    (not Linux) the group cannot be listed: it is killed whole, this process too."""
    if not os.path.isdir("/proc"):
        os.killpg(group, signal.SIGKILL)
        return
    for _ in range(10):  # a member may fork while the others are killed
        members = group_members(group) - {os.getpid()}
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def group_alive(group: int) -> bool:
    """Whether a live (not zombie) process is left in process group ``group``; an
    orphan's zombie is pid 1's to reap and may stay a while. Without ``/proc``
    (not Linux), whether any process is."""
    if os.path.isdir("/proc"):
        return bool(group_members(group))
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def group_members(group: int) -> set[int]:
    """Pids of the live (not zombie) processes in process group ``group``, from ``/proc``."""
    members = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                # "pid (command) state ppid pgrp ...": the command may hold spaces and ")".
                state, _ppid, pgrp = stat.read().rpartition(b")")[2].split()[:3]
        except (OSError, ValueError):
            continue  # exited meanwhile
        if int(pgrp) == group and state != b"Z":
            members.add(int(entry))
    return members


if __name__ == "__main__":
    sys.exit(main())
