"""The Ray Serve path for the contract tests: ``autellix ray-serve`` on a local Ray
cluster with one tiny-model engine replica, the contract's client keys and limits,
and the engine key, so that its engine's table is read as on the other paths.
Skipped where the ``ray`` extra is not installed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from call_paths import ALICE_KEY, BOB_KEY, ENGINE_KEY, LIMITS, CallPath, bearer


@pytest.fixture(scope="module")
def ray_path(keys_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CallPath]:
    pytest.importorskip("ray")
    from ray_serve_process import start_ray_serve, stop_ray_serve

    served = start_ray_serve(
        tmp_path_factory.mktemp("ray-path"),
        "--replicas", "1", "--model", "tiny", "--max-num-seqs", "4", "--max-model-len", "512",
        "--kv-cache-gib", "1", "--api-keys-file", str(keys_file), "--engine-key", ENGINE_KEY,
        "--max-threads", str(LIMITS.max_threads),
        ready_key=ALICE_KEY,
    )  # fmt: skip
    try:
        engines = [url for url, _ in served.engines()]
        yield CallPath("ray", served.url, "autellix-tiny", bearer(ALICE_KEY), bearer(BOB_KEY),
                       engines, router=True)  # fmt: skip
    finally:
        stop_ray_serve(served)
