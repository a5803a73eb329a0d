"""Model-free vLLM scheduler harness (vLLM's own CPU test pattern).

A real ``VllmConfig`` over a config-only Llama folder, a fake KV cache of
``num_blocks`` blocks, real ``Request`` objects, and ``ModelRunnerOutput``s
that sample one token per request that finished its prefill. Nothing runs a
model, so a step costs microseconds; ``import vllm`` (~8 s) is paid once.
"""

from __future__ import annotations

import itertools
import json
import os
from contextlib import contextmanager
from typing import Any

import pytest

BLOCK_SIZE = 16


class SchedulerHarness:
    def __init__(self, model_dir: str) -> None:
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        init_none_hash(sha256)
        self.model_dir = model_dir
        self.block_hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
        self.clock = itertools.count(1)

    def scheduler(
        self,
        max_num_seqs: int = 4,
        num_blocks: int = 1000,
        max_num_batched_tokens: int = 2048,
        max_model_len: int = 1024,
        cls: Any = None,
        policy: str = "priority",
        **env: str,
    ) -> Any:
        """A scheduler; ``env`` sets ``AUTELLIX_*`` variables (e.g. AUTELLIX_BETA="4")."""
        from autellix_vllm.scheduler import AutellixScheduler
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
        )
        from vllm.v1.structured_output import StructuredOutputManager

        cls = cls or AutellixScheduler
        model_config = ModelConfig(model=self.model_dir, skip_tokenizer_init=True)
        scheduler_config = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            is_encoder_decoder=False,
            enable_chunked_prefill=True,
            policy=policy,
            async_scheduling=False,
        )
        cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
        vllm_config = VllmConfig(
            model_config=model_config,
            scheduler_config=scheduler_config,
            cache_config=cache_config,
        )
        kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    ["layer"],
                    FullAttentionSpec(
                        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype="float32"
                    ),
                )
            ],
        )
        cache_config.num_gpu_blocks = num_blocks
        with patched_env(env):
            return cls(
                vllm_config=vllm_config,
                kv_cache_config=kv_cache_config,
                structured_output_manager=StructuredOutputManager(vllm_config),
                block_size=BLOCK_SIZE,
                log_stats=True,
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
        token: int = 7,
    ) -> Any:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

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
        return Request(
            request_id=request_id,
            # Distinct prompts per request: no accidental prefix-cache sharing.
            prompt_token_ids=[token + sum(map(ord, request_id)) % 50] * prompt_len,
            sampling_params=SamplingParams(
                max_tokens=max_tokens, ignore_eos=True, extra_args=xargs or None
            ),
            pooling_params=None,
            arrival_time=float(next(self.clock)),
            block_hasher=self.block_hasher,
            session_id=session_id,
        )

    def step(self, scheduler: Any) -> Any:
        """One engine step: schedule, then sample a token for every request that
        finished its prefill. Returns the SchedulerOutput."""
        from vllm.v1.outputs import ModelRunnerOutput

        output = scheduler.schedule()
        req_ids = list(output.num_scheduled_tokens)
        sampled = [[] if scheduler.requests[r].is_prefill_chunk else [11] for r in req_ids]
        scheduler.update_from_output(
            output,
            ModelRunnerOutput(
                req_ids=req_ids,
                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=sampled,
            ),
        )
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
    model_dir = tmp_path_factory.mktemp("config-only-llama")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 2048,
        "torch_dtype": "float32",
    }
    (model_dir / "config.json").write_text(json.dumps(config))
    return SchedulerHarness(str(model_dir))
