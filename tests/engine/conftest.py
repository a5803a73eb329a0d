"""Model-free vLLM scheduler harness (vLLM's own CPU test pattern).

A real ``VllmConfig`` over a config-only Llama folder, a fake KV cache of
``num_blocks`` blocks, real ``Request`` objects, and ``ModelRunnerOutput``s
that sample one token per request that finished its prefill. Nothing runs a
model, so a step costs microseconds; ``import vllm`` (~8 s) is paid once.
"""

from __future__ import annotations

import itertools
import os
from contextlib import contextmanager
from typing import Any

import pytest

BLOCK_SIZE = 16


class SchedulerHarness:
    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir
        self.clock = itertools.count(1)

    def scheduler(
        self,
        max_num_seqs: int = 4,
        num_blocks: int = 1000,
        max_num_batched_tokens: int = 2048,
        max_model_len: int = 1024,
        cls: Any = None,
        **env: str,
    ) -> Any:
        """A scheduler; ``env`` sets ``AUTELLIX_*`` variables (e.g. AUTELLIX_BETA="4")."""
        from autellix_vllm.engine import model_free
        from autellix_vllm.engine.scheduler import AutellixScheduler

        with patched_env(env):
            return model_free.model_free_scheduler(
                cls or AutellixScheduler,
                self.model_dir,
                max_num_seqs=max_num_seqs,
                num_blocks=num_blocks,
                max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len,
                block_size=BLOCK_SIZE,
            )

    def request(
        self,
        request_id: str,
        prompt_len: int = 8,
        max_tokens: int = 16,
        program: str | None = None,
        thread: str | None = None,
        parent: str | None = None,
        call_id: str | None = None,
        prior_service: float | None = None,
        session_id: str | None = None,
    ) -> Any:
        from autellix_vllm.engine import model_free

        xargs: dict[str, Any] = {}
        for key, value in (
            ("autellix_program_id", program),
            ("autellix_thread_id", thread),
            ("autellix_parent_thread_id", parent),
            ("autellix_call_id", call_id),
            ("autellix_prior_service", prior_service),
        ):
            if value is not None:
                xargs[key] = value
        # Distinct prompts per request: no accidental prefix-cache sharing.
        token = 7 + sum(map(ord, request_id)) % 50
        return model_free.new_request(
            request_id,
            [token] * prompt_len,
            max_tokens,
            xargs or None,
            arrival_time=float(next(self.clock)),
            block_size=BLOCK_SIZE,
            session_id=session_id,
        )

    def step(self, scheduler: Any) -> Any:
        """One engine step: schedule, then sample a token for every request that
        finished its prefill. Returns the SchedulerOutput."""
        from autellix_vllm.engine import model_free

        output = scheduler.schedule()
        model_free.finish_step(scheduler, output)
        return output

    def run_until_idle(self, scheduler: Any, max_steps: int = 10_000) -> int:
        steps = 0
        while scheduler.has_requests() and steps < max_steps:
            self.step(scheduler)
            steps += 1
        return steps


@contextmanager
def patched_env(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@pytest.fixture(scope="session")
def harness(tmp_path_factory) -> SchedulerHarness:
    """Session-scoped: importing vLLM dominates the cost of these tests."""
    pytest.importorskip("vllm")
    from autellix_vllm.engine import model_free

    folder = tmp_path_factory.mktemp("config-only-llama")
    return SchedulerHarness(model_free.write_config_only_model(folder))
