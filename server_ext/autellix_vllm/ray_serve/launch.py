"""Running the application on a Ray cluster until stopped (``autellix ray-serve``).

Like ``serve run``: the application is deployed, served while the command
runs, and deleted when it stops. Without an address, a local Ray cluster is
started for it and stopped with it; with one, the command joins that cluster
(``auto``: the cluster of this node) and leaves it, and its Serve, running.
A deployment meant to outlive any command goes through ``serve deploy`` and a
config file instead (docs/operations.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from autellix_vllm.ray_serve._ray_adapter import ray, serve
from autellix_vllm.ray_serve.app import RayServeConfig, build_app

APP_NAME = "autellix"


def serve_until_stopped(
    config: RayServeConfig,
    address: str | None,
    host: str,
    port: int,
    on_ready: Callable[[str], None],
) -> None:
    """Deploy, call ``on_ready`` with the root URL, serve until KeyboardInterrupt."""
    # "local": a new cluster even where RAY_ADDRESS names one (it is stopped on exit).
    ray.init(address=address or "local", include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_app(config), name=APP_NAME, route_prefix="/")
        on_ready(f"http://{host}:{port}")
        while True:
            time.sleep(3600)
    finally:
        if address is None:
            serve.shutdown()  # and the local cluster goes with ray.shutdown
        else:
            serve.delete(APP_NAME)
        ray.shutdown()
