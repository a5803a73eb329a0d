"""Fails loudly when the vLLM internals autellix relies on change shape.

Everything checked here is private vLLM API used by ``autellix_vllm.engine._vllm_adapter``
(and through it by the scheduler and the plugins). When one of these fails after
a vLLM upgrade, re-read the named vLLM source before touching the assertion.
"""

import inspect

import pytest

vllm = pytest.importorskip("vllm")

from autellix_vllm.engine import _vllm_adapter as adapter  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.request_queue import RequestQueue  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402


def params(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_vllm_version_is_the_pinned_one():
    assert vllm.__version__ == adapter.PINNED_VLLM_VERSION == "0.32.0"


@pytest.mark.parametrize(
    ("hook", "expected"),
    [
        ("schedule", ["self", "throttle_prefills"]),
        ("add_request", ["self", "request"]),
        ("_preempt_request", ["self", "request", "timestamp", "drop_stale_output"]),
        ("_free_request", ["self", "request", "delay_free_blocks"]),
        ("_update_after_schedule", ["self", "scheduler_output"]),
        ("update_from_output", ["self", "scheduler_output", "model_runner_output"]),
        ("finish_requests", ["self", "request_ids", "finished_status"]),
        ("_request_blocks_can_be_freed", ["self", "request"]),
        ("_free_request_blocks", ["self", "request"]),
        ("has_requests", ["self"]),
    ],
)
def test_scheduler_hooks_keep_their_signatures(hook, expected):
    assert params(getattr(Scheduler, hook)) == expected


def test_scheduler_constructor_keywords_used_by_the_engine():
    assert params(Scheduler.__init__)[:5] == [
        "self",
        "vllm_config",
        "kv_cache_config",
        "structured_output_manager",
        "block_size",
    ]


def test_async_scheduler_is_a_scheduler_overriding_the_output_hooks():
    assert issubclass(AsyncScheduler, Scheduler)
    assert "_update_after_schedule" in vars(AsyncScheduler)
    # Our mixin must not be bypassed: AsyncScheduler must not override these.
    for hook in ("schedule", "add_request", "_free_request", "update_from_output"):
        assert hook not in vars(AsyncScheduler), hook


def test_request_queue_abstract_methods_are_the_ones_we_implement():
    assert RequestQueue.__abstractmethods__ == {
        "add_request",
        "pop_request",
        "peek_request",
        "prepend_request",
        "prepend_requests",
        "remove_request",
        "remove_requests",
        "__bool__",
        "__len__",
        "__iter__",
    }


def test_preemption_and_enqueue_go_through_the_waiting_queue():
    # ProgramRequestQueue learns of preemptions only through these calls.
    assert "self.waiting.prepend_request(request)" in inspect.getsource(Scheduler._preempt_request)
    assert "self.waiting.add_request(request)" in inspect.getsource(
        Scheduler._enqueue_waiting_request
    )
    # And vLLM builds `waiting` in __init__, before our mixin replaces it.
    assert "self.waiting = create_request_queue" in inspect.getsource(Scheduler.__init__)


def test_kv_pressure_victim_is_the_greatest_priority_then_arrival():
    # adapter.set_kv_victim_order chooses vLLM's victim through this rule, which
    # applies under the priority policy only.
    source = inspect.getsource(Scheduler.schedule)
    assert "if self.policy == SchedulingPolicy.PRIORITY:" in source
    assert "key=lambda r: (r.priority, r.arrival_time)," in source
    assert "self.priority = priority" in inspect.getsource(Request.__init__)


def test_request_constructor_and_fields():
    names = params(Request.__init__)
    for name in (
        "request_id",
        "prompt_token_ids",
        "sampling_params",
        "pooling_params",
        "arrival_time",
        "priority",
        "block_hasher",
        "session_id",
    ):
        assert name in names, name
    source = inspect.getsource(Request)
    for attribute in (
        "self.session_id",
        "self.num_computed_tokens",
        "self.num_output_placeholders",
        "self.num_prompt_tokens",
        "def num_tokens(",
        "def num_tokens_with_spec(",
    ):
        assert attribute in source, attribute
    # The finishes that are not completions (adapter.was_aborted).
    for status in ("FINISHED_ABORTED", "FINISHED_IGNORED", "FINISHED_ERROR"):
        assert RequestStatus[status].name == status
        assert RequestStatus.is_finished(RequestStatus[status])


def test_scheduler_output_has_per_request_token_counts():
    assert "num_scheduled_tokens" in SchedulerOutput.__dataclass_fields__


def test_scheduler_state_our_mixin_reads(harness):
    scheduler = harness.scheduler(cls=Scheduler)
    for attribute in ("running", "requests", "kv_holding_waiting", "max_num_scheduled_tokens"):
        assert hasattr(scheduler, attribute), attribute
    assert adapter.batch_seats(scheduler) == 4
    assert adapter.total_kv_blocks(scheduler) == 1000
    assert adapter.free_kv_blocks(scheduler) == 999  # one null block
    assert adapter.token_budget(scheduler) == 2048


def test_block_pool_calls_residency_relies_on(harness):
    """A finished request's cached blocks can be referenced and released again."""
    from autellix_vllm.engine import model_free

    scheduler = harness.scheduler(cls=Scheduler, num_blocks=20)
    request = model_free.new_request("r", [5] * 40, 1, None, arrival_time=0.0, block_size=16)
    scheduler.add_request(request)
    output = scheduler.schedule()
    assert adapter.kv_blocks_to_grow(scheduler, request) == 0  # its 3 blocks are allocated
    blocks = adapter.cached_blocks(scheduler, request)
    assert len(blocks) == 2 and all(b.ref_cnt == 1 for b in blocks)  # 2 full of 40 tokens
    adapter.reference_blocks(scheduler, blocks)
    model_free.finish_step(scheduler, output)  # max_tokens 1: finished and freed
    assert "r" not in scheduler.requests
    assert [b.ref_cnt for b in blocks] == [1, 1]
    assert adapter.free_kv_blocks(scheduler) == 19 - 2
    # The held blocks are what vLLM's prefix cache hits for a call extending the prompt.
    extending = model_free.new_request("e", [5] * 48, 1, None, arrival_time=0.0, block_size=16)
    other = model_free.new_request("o", [6] * 48, 1, None, arrival_time=0.0, block_size=16)
    hit = scheduler.kv_cache_manager.get_computed_blocks(extending)[0].blocks[0]
    assert adapter.prefix_hit_blocks(scheduler, extending, blocks) == len(hit) == 2
    assert adapter.prefix_hit_blocks(scheduler, other, blocks) == 0
    adapter.release_blocks(scheduler, blocks)
    assert adapter.free_kv_blocks(scheduler) == 19
    assert all(b.block_hash is not None for b in blocks)  # still cached, evictable


def test_engine_core_runs_utility_methods_by_name():
    from vllm.v1.engine.core import EngineCore, EngineCoreProc
    from vllm.v1.engine.core_client import AsyncMPClient

    # The engine process runs EngineCoreProc; methods added to EngineCore reach it.
    assert issubclass(EngineCoreProc, EngineCore)
    source = inspect.getsource(EngineCoreProc._handle_client_request)
    assert "getattr(self, method_name)" in source
    assert params(AsyncMPClient.call_utility_async)[:2] == ["self", "method"]


def test_endpoint_plugin_matches_vllms_protocol():
    from autellix_vllm.engine.endpoint_plugin import AutellixEndpointPlugin
    from vllm.plugins.endpoint_plugins.interface import EndpointPlugin

    assert isinstance(AutellixEndpointPlugin(), EndpointPlugin)
    assert params(EndpointPlugin.init_state) == ["self", "engine_client", "state", "args"]


def test_general_plugin_installs_engine_core_methods_idempotently():
    from autellix_vllm.engine import general_plugin
    from vllm.v1.engine.core import EngineCore

    general_plugin.register()
    general_plugin.register()
    assert EngineCore.autellix_table is general_plugin.engine_table
    assert EngineCore.autellix_end_program is general_plugin.engine_end_program


def test_middleware_classes_are_added_without_arguments():
    from vllm.entrypoints.serve.middleware import register

    source = inspect.getsource(register.init_entrypoints_middleware)
    assert "app.add_middleware(imported)" in source


def test_vllms_own_server_parser_takes_the_gpu_engines_command():
    """The GPU path cannot run here; vLLM's parser (the same in both builds) checks
    its flags: what the launcher leaves out stays vLLM's default (None: derived
    from the model and the device), and the host KV tier arrives as set."""
    from autellix_vllm.engine.launcher import EngineConfig, server_command
    from autellix_vllm.engine.models import ModelSpec
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def engine_args(config: EngineConfig) -> AsyncEngineArgs:
        command = server_command(config, ModelSpec("/models/llama", "llama"), 8000)
        assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(command[3:])
        return AsyncEngineArgs.from_cli_args(parsed)

    plain = engine_args(EngineConfig(model="/models/llama", device="gpu"))
    assert plain.max_model_len is None and plain.max_num_seqs is None
    assert plain.kv_cache_memory_bytes is None and plain.kv_offloading_size is None
    assert not plain.enforce_eager
    assert plain.scheduler_cls == "autellix_vllm.engine.scheduler.AutellixAsyncScheduler"
    tiered = engine_args(
        EngineConfig(model="/models/llama", device="gpu", kv_cache_gib=60, kv_offload_gib=200)
    )
    assert tiered.kv_offloading_size == 200 and tiered.kv_offloading_backend == "native"
    # vLLM merges its offloading connector into this config: decoded blocks too.
    assert tiered.kv_transfer_config.kv_connector_extra_config == {"offload_prompt_only": False}
    assert tiered.kv_cache_memory_bytes == 60 * 2**30


def test_the_host_kv_tier_is_the_connector_vllm_configures_for_offloading(harness):
    import inspect

    from vllm.config import KVTransferConfig, VllmConfig

    # --kv-offloading-size makes vLLM set one of these connectors (native backend).
    source = inspect.getsource(VllmConfig._post_init_kv_transfer_config)
    assert all(f'"{name}"' in source for name in adapter.HOST_TIER_CONNECTORS)
    scheduler = harness.scheduler(cls=Scheduler)
    assert not adapter.has_host_kv_tier(scheduler)
    scheduler.vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="OffloadingConnector", kv_role="kv_both"
    )
    assert adapter.has_host_kv_tier(scheduler)


def test_the_host_tier_keeps_its_bytes_over_a_blocks_bytes(harness):
    import inspect

    from vllm.config import KVTransferConfig, VllmConfig

    # vLLM passes --kv-offloading-size (GiB) to its connector as bytes.
    assert '"cpu_bytes_to_use"' in inspect.getsource(VllmConfig._post_init_kv_transfer_config)
    scheduler = harness.scheduler(cls=Scheduler)
    assert adapter.host_tier_blocks(scheduler) == 0
    scheduler.vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="OffloadingConnector", kv_role="kv_both",
        kv_connector_extra_config={"cpu_bytes_to_use": 2**20},
    )  # fmt: skip
    (group,) = scheduler.kv_cache_config.kv_cache_groups
    page = group.kv_cache_spec.page_size_bytes  # one layer's block: keys and values
    assert page == 2 * 16 * 4  # the harness's one layer: 16 tokens, one head of 1 float32
    assert adapter.host_tier_blocks(scheduler) == 2**20 // page
