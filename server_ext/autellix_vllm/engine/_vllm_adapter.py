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
* ``KVCacheManager.get_blocks`` and ``BlockPool.touch`` / ``free_blocks`` hold a
  finished request's cached blocks for its program's next call (KV residency):
  a block with a reference is never evicted, and ``free_blocks`` returns it to
  the prefix cache's LRU as vLLM's own free does.
* When a running request cannot get KV blocks, ``Scheduler.schedule`` (priority
  policy) preempts ``max(running, key=(priority, arrival_time))``; setting
  ``Request.priority`` before the step chooses that victim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import vllm
from vllm.v1.core.kv_cache_utils import get_block_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import RequestQueue, SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from autellix_vllm.protocol.identity import CallIdentity, read_identity

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig

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
    """Identity from ``vllm_xargs`` (flat ``autellix_*`` keys, as the middleware
    wrote them), else the session id; with the client's retention hint
    (``autellix_retention_ttl_s``) if it sent one.

    Read as the router and the middleware read it: a malformed value raises
    :class:`~autellix_vllm.protocol.identity.IdentityError` (only a request that
    bypassed the middleware can hold one).
    """
    params = request.sampling_params
    extra_args = params.extra_args if params is not None else None
    return read_identity(xargs=extra_args, session_id=request.session_id)


def prompt_tokens(request: Request) -> int:
    return request.num_prompt_tokens


# Finishes that are not completions: the client went away (or aborted), vLLM
# refused the prompt, or the request failed.
_NOT_COMPLETED = (
    RequestStatus.FINISHED_ABORTED,
    RequestStatus.FINISHED_IGNORED,
    RequestStatus.FINISHED_ERROR,
)


def was_aborted(request: Request) -> bool:
    """The request finished without completing (see ``_NOT_COMPLETED``)."""
    return request.status in _NOT_COMPLETED


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


# The connectors vLLM configures for --kv-offloading-size with the native backend.
HOST_TIER_CONNECTORS = ("OffloadingConnector", "SimpleCPUOffloadConnector")


def _host_tier_transfer(scheduler: Scheduler) -> KVTransferConfig | None:
    """The engine's KV transfer config if it is a host tier, else None."""
    transfer = scheduler.vllm_config.kv_transfer_config
    if transfer is not None and transfer.kv_connector in HOST_TIER_CONNECTORS:
        return transfer
    return None


def has_host_kv_tier(scheduler: Scheduler) -> bool:
    """Whether vLLM offloads this engine's KV blocks to host memory, so that a context
    evicted from the device comes back by a transfer instead of a prefill."""
    return _host_tier_transfer(scheduler) is not None


def host_tier_blocks(scheduler: Scheduler) -> int:
    """Blocks of this engine's KV its host tier can keep (0 without one). vLLM sizes
    the tier in bytes over all workers (``cpu_bytes_to_use``, from
    --kv-offloading-size); a block takes its layers' pages on every worker."""
    transfer = _host_tier_transfer(scheduler)
    if transfer is None:
        return 0
    tier_bytes = transfer.kv_connector_extra_config.get("cpu_bytes_to_use", 0)
    block_bytes = scheduler.vllm_config.parallel_config.world_size * sum(
        group.kv_cache_spec.page_size_bytes * len(group.layer_names)
        for group in scheduler.kv_cache_config.kv_cache_groups
    )
    return int(tier_bytes) // block_bytes if block_bytes else 0


def free_kv_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def total_kv_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.num_gpu_blocks


def block_size(scheduler: Scheduler) -> int:
    return scheduler.block_size


def kv_blocks_needed(scheduler: Scheduler, request: Request) -> int:
    """Blocks a waiting request needs to (re)compute its whole sequence, ignoring
    prefix-cache hits (an upper bound)."""
    return -(-(request.num_tokens + 1) // scheduler.block_size)


def prefix_hit_blocks(scheduler: Scheduler, request: Request, blocks: Sequence[Any]) -> int:
    """How many of ``blocks``, from the first, vLLM's prefix cache would hit for the
    waiting ``request`` (their hashes are its first block hashes; the last token
    is always recomputed)."""
    limit = min(len(blocks), (request.num_tokens - 1) // scheduler.block_size)
    hashes = request.block_hashes
    hits = 0
    while hits < min(limit, len(hashes)):
        key = blocks[hits].block_hash
        if key is None or get_block_hash(key) != hashes[hits]:
            break
        hits += 1
    return hits


def kv_blocks_to_grow(scheduler: Scheduler, request: Request) -> int:
    """New blocks a running request needs for the tokens it computes next."""
    groups = scheduler.kv_cache_manager.get_blocks(request.request_id).blocks
    held = len(groups[0]) if groups else 0
    total = request.num_computed_tokens + tokens_to_compute(request)
    return max(0, -(-total // scheduler.block_size) - held)


def cached_blocks(scheduler: Scheduler, request: Request) -> list[Any]:
    """The request's full, prefix-cached blocks, first to last ([] for a model with
    more than one KV cache group, whose blocks live in several pools)."""
    groups = scheduler.kv_cache_manager.get_blocks(request.request_id).blocks
    if len(groups) != 1:
        return []
    return [b for b in groups[0] if b.block_hash is not None and not b.is_null]


def reference_blocks(scheduler: Scheduler, blocks: list[Any]) -> None:
    """Take a reference on ``blocks``: they stay cached until :func:`release_blocks`."""
    scheduler.kv_cache_manager.block_pool.touch(blocks)


def release_blocks(scheduler: Scheduler, blocks: list[Any]) -> None:
    """Drop the reference :func:`reference_blocks` took; unused blocks return to the
    prefix cache's eviction order, the last block first, as vLLM frees a request."""
    scheduler.kv_cache_manager.block_pool.free_blocks(reversed(blocks))


def computed_tokens(request: Request) -> int:
    """Tokens of the request whose KV is computed: what a preemption discards."""
    return request.num_computed_tokens


def set_kv_victim_order(requests: Sequence[Request]) -> None:
    """Make vLLM's own victim, when a running request cannot get KV blocks, the
    first of ``requests``, then the second, and so on (pass them all).

    vLLM preempts the greatest ``(priority, arrival_time)``, so each request's
    priority becomes its place counted from the end. An int, as on the wire: vLLM
    also compares priorities in its ``kv_holding_waiting`` heap.
    """
    last = len(requests) - 1
    for place, request in enumerate(requests):
        request.priority = last - place


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
