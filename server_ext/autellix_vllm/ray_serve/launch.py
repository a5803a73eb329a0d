"""Running the application on a Ray cluster until stopped (``autellix ray-serve``).

Like ``serve run``: the application is deployed, served while the command
runs, and deleted when it stops. Without an address, a local Ray cluster is
started for it and stopped with it; with one, the command joins that cluster
(``auto``: the cluster of this node) and leaves it, and its Serve, running.
A deployment meant to outlive any command goes through ``serve deploy`` and a
config file instead (docs/operations.md).

Stopping (SIGTERM or Ctrl-C) stops every engine the command started, as
``autellix serve`` does: Serve stops the engine replicas, each of which stops
its engine's process tree and waits for it (``engine_replica``). The call
that deletes the application returns once every replica has stopped. On a
local cluster, whatever the command started on this machine (the cluster's
processes, the replicas, the engines under them) and is still alive once Ray
has shut down is then signalled (SIGTERM, and SIGKILL after
:data:`LEFT_OVER_GRACE_S`), so that nothing outlives the command.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator

import psutil

from autellix_vllm.engine.launcher import poll_until, stop_on_signals
from autellix_vllm.ray_serve._ray_adapter import ray, serve
from autellix_vllm.ray_serve.app import RayServeConfig, build_app

APP_NAME = "autellix"
# How long a process left over after Ray's shutdown has to exit after its SIGTERM.
LEFT_OVER_GRACE_S = 10.0


def serve_until_stopped(
    config: RayServeConfig,
    address: str | None,
    host: str,
    port: int,
    on_ready: Callable[[str], None],
) -> None:
    """Deploy, call ``on_ready`` with the root URL, serve until SIGTERM or Ctrl-C
    (raised as KeyboardInterrupt once everything is stopped)."""
    # "local": a new cluster even where RAY_ADDRESS names one (it is stopped on exit).
    ray.init(address=address or "local", include_dashboard=False, log_to_driver=False)
    # After ray.init, whose driver sets a SIGTERM handler of its own that aborts
    # the process: SIGTERM must unwind to the `finally` below, as Ctrl-C does.
    stop_on_signals()
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_app(config), name=APP_NAME, route_prefix="/")
        on_ready(f"http://{host}:{port}")
        while True:
            time.sleep(3600)
    finally:
        stop(local=address is None)


def stop(local: bool) -> None:
    """Delete the application (its replicas stop their engines), leave the cluster,
    and on a ``local`` one, stop whatever this process started that is still alive."""
    started = psutil.Process().children(recursive=True) if local else []
    with _signals_ignored():
        try:
            if local:
                serve.shutdown()  # and the local cluster goes with ray.shutdown
            else:
                serve.delete(APP_NAME)
            ray.shutdown()
        finally:
            stop_left_over(started)


def stop_left_over(processes: list[psutil.Process]) -> None:
    """SIGTERM those of ``processes`` still alive, then SIGKILL those left after
    :data:`LEFT_OVER_GRACE_S`; returns once none is alive (or 5 s after that)."""

    def none_alive() -> bool:
        return not any(_alive(process) for process in processes)

    for sig, wait_s in ((signal.SIGTERM, LEFT_OVER_GRACE_S), (signal.SIGKILL, 5.0)):
        if none_alive():
            return
        for process in processes:
            if _alive(process):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.send_signal(sig)
        poll_until(none_alive, wait_s, poll_s=0.1)


def _alive(process: psutil.Process) -> bool:
    """Running, not a zombie (an orphan's zombie is pid 1's to reap, maybe later);
    a pid reused by another process since is not the one recorded."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """A second SIGTERM or Ctrl-C while stopping must not cut the stop short."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
