"""The paths a call takes to an engine, for the contract tests (``test_contract_paths.py``).

Every path is real processes: a keyed CPU engine (the tiny model) reached

* ``router_path``: through the router (``autellix serve --upstream``) in front of it;
* ``serve_path``: through ``autellix serve --engines 2``, which starts two of its own;
* ``engine_path``: directly, with the engine key (what a router holds);
* ``ray_path``: through ``autellix ray-serve``, one engine replica of its own
  (``ray_path.py``; skipped without the ``ray`` extra).

The router paths run with two client keys (alice, bob) and the same small
program limits, which ``autellix serve`` hands the engines it starts and the
keyed engine is started with. A test takes ``path`` and runs once per name in
:data:`PATHS`; a new path joins by adding its fixture here and its name to
:data:`PATHS`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from autellix_vllm.policy.config import TableBounds
from call_paths import ALICE_KEY, BOB_KEY, ENGINE_KEY, LIMITS, CallPath, bearer
from ray_path import ray_path  # noqa: F401  (a fixture: autellix ray-serve)
from serve_process import Served, read_until_ready, start_serve, stop_serve

PATHS = ("router_path", "serve_path", "engine_path", "ray_path")
LIMIT_FLAGS = ("--max-threads", str(LIMITS.max_threads))  # the routers' limits, as flags


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("contract") / "keys"
    path.write_text(f"alice: {ALICE_KEY}\nbob: {BOB_KEY} weight=2\n")
    return path


@pytest.fixture(scope="module")
def keyed_engine(running_engine: Callable[..., AbstractContextManager[Any]]) -> Iterator[Any]:
    """One engine with the engine key and the routers' limits, as serve starts its own."""
    table = TableBounds(limits=LIMITS)
    with running_engine("contract-engine", model="tiny", api_key=ENGINE_KEY, table=table) as engine:
        yield engine


@pytest.fixture(scope="module")
def engine_path(keyed_engine: Any) -> CallPath:
    url = keyed_engine.base_url
    return CallPath("engine", url, keyed_engine.served_model_name, bearer(ENGINE_KEY),
                    bearer("not-the-key"), [url], router=False)  # fmt: skip


@pytest.fixture(scope="module")
def router_path(keyed_engine: Any, keys_file: Path) -> Iterator[CallPath]:
    served = _serve("--upstream", keyed_engine.base_url, "--engine-key", ENGINE_KEY,
                    "--api-keys-file", str(keys_file), *LIMIT_FLAGS)  # fmt: skip
    try:
        yield CallPath("router", served.url, keyed_engine.served_model_name, bearer(ALICE_KEY),
                       bearer(BOB_KEY), [keyed_engine.base_url], router=True)  # fmt: skip
    finally:
        stop_serve(served)


@pytest.fixture(scope="module")
def serve_path(keys_file: Path) -> Iterator[CallPath]:
    served = _serve("--engines", "2", "--model", "tiny", "--max-num-seqs", "4",
                    "--max-model-len", "512", "--kv-cache-gib", "1",
                    "--api-keys-file", str(keys_file), *LIMIT_FLAGS)  # fmt: skip
    try:
        engines = [served.engine_urls[i] for i in sorted(served.engine_urls)]
        yield CallPath("serve", served.url, "autellix-tiny", bearer(ALICE_KEY), bearer(BOB_KEY),
                       engines, router=True)  # fmt: skip
    finally:
        stop_serve(served)


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest) -> CallPath:
    return request.getfixturevalue(request.param)


def _serve(*options: str) -> Served:
    """``autellix serve`` with ``options``, its engines given :data:`ENGINE_KEY`, ready."""
    served = start_serve(*options, env={**os.environ, "AUTELLIX_ENGINE_KEY": ENGINE_KEY})
    try:
        read_until_ready(served)
    except BaseException:
        stop_serve(served)
        raise
    return served
