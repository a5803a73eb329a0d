"""Model-free vLLM schedulers, for tests and the scheduler-overhead benchmark.

vLLM's own CPU test pattern: a real ``VllmConfig`` over a config-only model
folder (the embedded tiny Llama's ``config.json``, no weights) and a KV cache
that exists only as block counts. Steps are driven with ``ModelRunnerOutput``
objects; no model runs, so a scheduler step can be tested and timed alone.

This module builds vLLM's config and request objects directly; like
``_vllm_adapter`` it is covered by ``tests/engine/test_vllm_api_drift.py``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from vllm.config.scheduler import SchedulerPolicy
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from autellix_vllm.engine.tiny_model import model_config


def write_config_only_model(folder: Path) -> str:
    """A model folder holding only ``config.json``: enough for a VllmConfig."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model_config()))
    return str(folder)


def model_free_scheduler(
    cls: type[Scheduler],
    model_dir: str,
    max_num_seqs: int,
    num_blocks: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    block_size: int,
    policy: SchedulerPolicy = "priority",
) -> Scheduler:
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    vllm_config = VllmConfig(
        model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            is_encoder_decoder=False,
            enable_chunked_prefill=True,
            policy=policy,
            async_scheduling=False,
        ),
        cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=True),
    )
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=True,
    )


@functools.cache
def block_hasher(block_size: int) -> Callable[[Request], list[Any]]:
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256)
    return get_request_block_hasher(block_size, sha256)


def new_request(
    request_id: str,
    prompt_token_ids: list[int],
    max_tokens: int,
    extra_args: dict[str, Any] | None,
    arrival_time: float,
    block_size: int,
    session_id: str | None = None,
) -> Request:
    from vllm.sampling_params import SamplingParams

    return Request(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args
        ),
        pooling_params=None,
        arrival_time=arrival_time,
        block_hasher=block_hasher(block_size),
        session_id=session_id,
    )


def finish_step(scheduler: Scheduler, output: SchedulerOutput, token: int = 11) -> None:
    """Complete a scheduled step: every request that finished its prefill samples
    ``token``."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(output.num_scheduled_tokens)
    sampled = [[] if scheduler.requests[r].is_prefill_chunk else [token] for r in req_ids]
    scheduler.update_from_output(
        output,
        ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
        ),
    )
