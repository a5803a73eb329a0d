"""The one place that touches vLLM internals (private API, pinned to vLLM 0.32.0).

Everything else in autellix goes through the names below, and
``tests/engine/test_vllm_api_drift.py`` fails loudly when one of them changes
shape. What is relied on, and why:

* ``Scheduler`` / ``AsyncScheduler`` are subclassed (``--scheduler-cls``); the
  ``waiting`` queue is replaced by a ``RequestQueue`` over the policy's queue.
* ``Scheduler._preempt_request`` is the only way to preempt (recompute, no swap);
  vLLM never preempts on behalf of a *waiting* request, so we call it ourselves.
* ``Scheduler._free_request`` is the one chokepoint every finish passes through
  (EOS, stop, length, abort).
* ``SchedulerOutput.num_scheduled_tokens`` tells what each call got this step.
* ``Request.sampling_params.extra_args`` carries the body's ``vllm_xargs``;
  ``Request.session_id`` carries ``X-Session-ID`` / the body's ``session_id``.
* ``EngineCore`` runs a utility method by name for ``call_utility_async``; the
  general plugin adds ours to the class.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import RequestQueue, SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from autellix_vllm.identity import CallIdentity, identity_from_xargs

PINNED_VLLM_VERSION = "0.32.0"
VLLM_VERSION: str = vllm.__version__

__all__ = [
    "AsyncScheduler",
    "Request",
    "RequestQueue",
    "RequestStatus",
    "Scheduler",
    "SchedulerOutput",
    "SchedulingPolicy",
]


# ---- requests -------------------------------------------------------------------


def call_identity(request: Request) -> CallIdentity:
    """Identity from ``vllm_xargs`` (flat ``autellix_*`` keys), else the session id."""
    params = request.sampling_params
    extra_args = params.extra_args if params is not None else None
    return identity_from_xargs(extra_args, request.session_id)


def prompt_tokens(request: Request) -> int:
    return request.num_prompt_tokens


def was_aborted(request: Request) -> bool:
    return request.status == RequestStatus.FINISHED_ABORTED


def split_scheduled_tokens(request: Request, num_tokens: int) -> tuple[int, int]:
    """(decode, prefill) tokens of a step that schedules ``num_tokens`` for ``request``.

    Must be called before vLLM advances ``num_computed_tokens`` for the step. A
    step that reaches the end of the sequence samples one new token (decode);
    everything else it computes is prefill, including a resumed call's recompute.
    """
    reaches_end = request.num_computed_tokens + num_tokens >= request.num_tokens
    decode = 1 if reaches_end else 0
    return decode, num_tokens - decode


# ---- scheduler state ----------------------------------------------------------------


def scheduled_tokens(output: SchedulerOutput) -> dict[str, int]:
    """Tokens scheduled per request id in one step."""
    return output.num_scheduled_tokens


def batch_seats(scheduler: Scheduler) -> int:
    """How many requests the scheduler admits into the running batch at most."""
    return scheduler.max_num_active_reqs


def token_budget(scheduler: Scheduler) -> int:
    """Tokens one step may schedule in total."""
    return scheduler.max_num_scheduled_tokens


def tokens_to_compute(request: Request) -> int:
    """Tokens a running request still has to compute before it samples again."""
    return (
        request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
    )


def free_kv_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def total_kv_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.num_gpu_blocks


def kv_blocks_needed(scheduler: Scheduler, request: Request) -> int:
    """Blocks a waiting request needs to (re)compute its whole sequence, ignoring
    prefix-cache hits (an upper bound)."""
    return -(-(request.num_tokens + 1) // scheduler.block_size)


def preempt_running(scheduler: Scheduler, request: Request, now: float) -> bool:
    """Preempt a running request (vLLM recomputes it on resume). False when its
    blocks cannot be freed yet (an in-flight step still writes them)."""
    if not scheduler._request_blocks_can_be_freed(request):
        return False
    scheduler.running.remove(request)
    scheduler._preempt_request(request, now)
    return True


# ---- the engine-core utility methods (general plugin) ------------------------------


def install_engine_core_method(name: str, method: Callable[..., Any]) -> bool:
    """Add ``method`` to ``EngineCore`` (once), so ``call_utility_async(name)`` reaches it
    in the engine process. Returns whether it was newly installed."""
    from vllm.v1.engine.core import EngineCore

    if getattr(EngineCore, name, None) is method:
        return False
    setattr(EngineCore, name, method)
    return True


def engine_core_scheduler(engine_core: Any) -> Scheduler:
    return engine_core.scheduler


async def call_engine_utility(engine_client: Any, method: str, *args: Any) -> Any:
    """Run an ``EngineCore`` utility method from the API-server process.

    With data parallelism this reaches the first engine only.
    """
    return await engine_client.engine_core.call_utility_async(method, *args)


# ---- model-free schedulers (tests and the overhead benchmark) --------------------
# vLLM's own CPU test pattern: a real VllmConfig over a config-only Llama folder
# and a fake KV cache; steps are driven with ModelRunnerOutputs, no model runs.

TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}


def write_config_only_model(folder: Path) -> str:
    """A model folder holding only ``config.json``: enough for a VllmConfig."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    return str(folder)


def model_free_scheduler(
    cls: type[Scheduler],
    model_dir: str,
    max_num_seqs: int,
    num_blocks: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    block_size: int,
    policy: str = "priority",
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
