"""The paths a call takes to an engine, for the contract tests (``test_contract_paths.py``).

Every path is real processes: a keyed CPU engine (the tiny model) reached

* ``router_path``: through the router (``autellix serve --upstream``) in front of it;
* ``serve_path``: through ``autellix serve --engines 2``, which starts two of its own;
* ``engine_path``: directly, with the engine key (what a router holds).

The router paths run with two client keys (alice, bob) and the same small
program limits, which ``autellix serve`` hands the engines it starts and the
keyed engine is started with. A test takes ``path`` and runs once per name in
:data:`PATHS`; a new path (Ray Serve) joins by adding its fixture here and its
name to :data:`PATHS`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from autellix_vllm.bench.subprocesses import ENGINE_READY
from autellix_vllm.engine.reaper import group_alive
from autellix_vllm.policy.config import TableBounds
from call_paths import ALICE_KEY, BOB_KEY, ENGINE_KEY, LIMITS, CallPath, bearer

PATHS = ("router_path", "serve_path", "engine_path")
LIMIT_FLAGS = ("--max-threads", str(LIMITS.max_threads))  # the routers' limits, as flags


@dataclass
class Served:
    """An ``autellix serve`` process and what its output said."""

    process: subprocess.Popen[str]
    url: str = ""
    engine_urls: dict[int, str] = field(default_factory=dict)
    engine_groups: list[int] = field(default_factory=list)
    output: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("contract") / "keys"
    path.write_text(f"alice: {ALICE_KEY}\nbob: {BOB_KEY}\n")
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
        _stop(served)


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
        _stop(served)


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest) -> CallPath:
    return request.getfixturevalue(request.param)


def _serve(*options: str, timeout_s: float = 600) -> Served:
    """Start ``autellix serve`` on a free port and read its output up to its ready line."""
    command = [sys.executable, "-m", "autellix_vllm", "serve", "--port", "0", *options]
    env = {**os.environ, "AUTELLIX_ENGINE_KEY": ENGINE_KEY}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True, env=env)  # fmt: skip
    served = Served(process)
    deadline = time.monotonic() + timeout_s
    assert process.stdout is not None
    for line in process.stdout:
        served.output.append(line)
        if found := re.search(ENGINE_READY, line):
            served.engine_urls[int(found[1])] = found[2]
            served.engine_groups.append(int(found[3]))
        if found := re.search(r"router ready at (\S+);", line):
            served.url = found[1]
            threading.Thread(target=_drain, args=(served,), daemon=True).start()
            return served
        if time.monotonic() > deadline:
            break
    _stop(served)
    pytest.fail("autellix serve did not get ready:\n" + "".join(served.output))


def _drain(served: Served) -> None:
    assert served.process.stdout is not None
    for line in served.process.stdout:
        served.output.append(line)


def _stop(served: Served) -> None:
    """SIGTERM serve and wait; whatever is left of it or its engines is killed."""
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGTERM)
        try:
            served.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(served.process.pid, signal.SIGKILL)
            served.process.wait()
    for group in served.engine_groups:
        if group_alive(group):
            os.killpg(group, signal.SIGKILL)
