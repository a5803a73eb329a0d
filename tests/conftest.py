"""Fixtures shared by every test folder.

``engine``: ONE real vLLM CPU engine (the embedded tiny model, random weights,
the Autellix scheduler, identity middleware and plugins), started on first use
and stopped at the end of the session, also when tests fail. Startup takes
about 40-65 s on a 2-core machine, so every test that needs an engine shares
this one; tests must therefore use their own program ids and not assume an
empty table. ``running_engine`` starts another, differently configured one
(for instance with an engine key), for a module that needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest


@pytest.fixture(autouse=True)
def fresh_sdk_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process would: no SDK warning given yet, and no
    server remembered as plain (a later test's server may get the same port)."""
    from autellix import _once, _programs_api

    monkeypatch.setattr(_once, "_warned", set())
    monkeypatch.setattr(_programs_api, "_plain_servers", {})


@pytest.fixture(scope="session")
def running_engine(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., AbstractContextManager[object]]:
    """``running_engine(name, **config)``: a context manager that starts a small CPU
    engine (``EngineConfig`` fields override the test defaults), waits until it is
    healthy (failing the test if it does not start) and always stops it."""
    pytest.importorskip("vllm")
    from autellix_vllm.engine.launcher import EngineConfig, EngineProcess, EngineStartError

    @contextmanager
    def run(name: str, **config: object) -> Iterator[object]:
        fields = {"port": 0, "max_num_seqs": 4, "max_model_len": 512, "kv_cache_gib": 1}
        log_file = tmp_path_factory.mktemp(name) / "server.log"
        process = EngineProcess(EngineConfig(**{**fields, **config}, log_file=log_file))
        try:
            process.start()
            process.wait_healthy(timeout_s=600)
        except EngineStartError as exc:
            process.stop()
            pytest.fail(f"the test engine {name} did not start: {exc}")
        try:
            yield process
        finally:
            process.stop()

    return run


@pytest.fixture(scope="session")
def engine(running_engine: Callable[..., AbstractContextManager[object]]) -> Iterator[object]:
    # It keeps the responses it answers, so that previous_response_id works (vLLM's
    # store is off by default: it never forgets one).
    store = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    with running_engine("engine", extra_env=store) as process:
        yield process
