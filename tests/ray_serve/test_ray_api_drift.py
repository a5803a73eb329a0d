"""Fails loudly when the Ray API autellix relies on changes shape.

Everything checked here is what ``autellix_vllm.ray_serve._ray_adapter`` relies
on (its docstring says why). When one of these fails after a Ray upgrade,
re-read the named Ray source before touching the assertion.
"""

import inspect

import pytest

ray = pytest.importorskip("ray")

from autellix_vllm.ray_serve import _ray_adapter as adapter  # noqa: E402
from ray.exceptions import ActorDiedError, ActorUnavailableError  # noqa: E402
from ray.serve._private.common import ReplicaID, RequestMetadata  # noqa: E402
from ray.serve._private.request_router.common import PendingRequest  # noqa: E402
from ray.serve.config import RequestRouterConfig  # noqa: E402
from ray.serve.request_router import RequestRouter  # noqa: E402


def params(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_ray_version_is_the_pinned_one():
    assert ray.__version__ == adapter.PINNED_RAY_VERSION == "2.60.0"


@pytest.mark.parametrize(
    ("hook", "expected"),
    [
        ("choose_replicas", ["self", "candidate_replicas", "pending_request"]),
        ("on_request_routed", ["self", "pending_request", "replica_id", "result"]),
        ("on_request_completed", ["self", "replica_id", "internal_request_id"]),
        ("initialize_state", ["self", "kwargs"]),
    ],
)
def test_request_router_hooks_keep_their_signatures(hook, expected):
    assert params(getattr(RequestRouter, hook)) == expected


def test_choose_replicas_is_the_one_abstract_hook_and_async():
    assert RequestRouter.__abstractmethods__ == frozenset({"choose_replicas"})
    assert inspect.iscoroutinefunction(RequestRouter.choose_replicas)


def test_the_queue_length_cache_is_a_property_with_get():
    assert isinstance(inspect.getattr_static(RequestRouter, "replica_queue_len_cache"), property)
    from ray.serve._private.request_router.common import ReplicaQueueLengthCache

    assert params(ReplicaQueueLengthCache.get) == ["self", "replica_id"]


def test_pending_requests_carry_the_call_arguments_and_the_request_ids():
    fields = PendingRequest.__dataclass_fields__
    assert {"args", "kwargs", "metadata"} <= set(fields)
    metadata = RequestMetadata(request_id="r", internal_request_id="i")
    assert (metadata.internal_request_id, metadata.session_id) == ("i", "")


def test_replicas_are_named_by_their_unique_id():
    assert "unique_id" in ReplicaID.__dataclass_fields__
    assert "replica_id" in params(adapter.serve.context.ReplicaContext)


def test_a_deployment_takes_a_request_router_class_and_its_kwargs():
    config = RequestRouterConfig(
        request_router_class="autellix_vllm.ray_serve.request_router.ProgramAwareRouter",
        request_router_kwargs={"balancer": "locality"},
    )
    assert config.request_router_kwargs == {"balancer": "locality"}
    assert "request_router_config" in params(adapter.serve.deployment)


def test_replica_failures_cover_a_dead_and_an_unreachable_replica():
    assert issubclass(ActorDiedError, adapter.REPLICA_FAILURES)
    assert issubclass(ActorUnavailableError, adapter.REPLICA_FAILURES)


def test_handle_options_take_stream_and_session_id():
    from ray.serve.handle import DeploymentHandle

    assert {"stream", "session_id"} <= set(params(DeploymentHandle.options))
