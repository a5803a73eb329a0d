"""Fixtures shared by every test folder.

``engine``: ONE real vLLM CPU engine (the embedded tiny model, random weights,
the Autellix scheduler, identity middleware and plugins), started on first use
and stopped at the end of the session, also when tests fail. Startup takes
about 40-65 s on a 2-core machine, so every test that needs an engine shares
this one; tests must therefore use their own program ids and not assume an
empty table.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    pytest.importorskip("vllm")
    from autellix_vllm.engine.launcher import EngineConfig, EngineProcess, EngineStartError

    log_file = tmp_path_factory.mktemp("engine") / "server.log"
    process = EngineProcess(
        EngineConfig(port=0, max_num_seqs=4, max_model_len=512, kv_cache_gib=1, log_file=log_file)
    )
    try:
        process.start()
        process.wait_healthy(timeout_s=600)
    except EngineStartError as exc:
        process.stop()
        pytest.fail(f"the test engine did not start: {exc}")
    try:
        yield process
    finally:
        process.stop()
