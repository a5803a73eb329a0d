"""The program-aware request router (``ray_serve.request_router``) as Serve calls it,
without a Ray cluster: real Ray request objects, replicas that are only ids."""

import asyncio
from dataclasses import dataclass

import pytest

pytest.importorskip("ray")

from autellix_vllm.protocol.identity import CallIdentity  # noqa: E402
from autellix_vllm.ray_serve.messages import EngineCall  # noqa: E402
from autellix_vllm.ray_serve.request_router import ProgramAwareRouter  # noqa: E402
from ray.serve._private.common import (  # noqa: E402
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
    RequestMetadata,
)
from ray.serve._private.request_router.common import PendingRequest  # noqa: E402

DEPLOYMENT = DeploymentID(name="EngineReplica", app_name="autellix")


@dataclass
class Replica:
    """What the router reads of a ``RunningReplica``."""

    replica_id: ReplicaID


def replicas(*names: str) -> list[Replica]:
    return [Replica(ReplicaID(name, DEPLOYMENT)) for name in names]


def pending(call: object, request_id: str = "i1") -> PendingRequest:
    async def make() -> PendingRequest:  # its future needs a running loop
        return PendingRequest([call], {}, RequestMetadata("r", request_id))

    return asyncio.run(make())


def engine_call(program: str, tokens: int, bound: str | None = None, avoid=()) -> EngineCall:
    return EngineCall(
        "/v1/chat/completions", b"{}", CallIdentity(), False, program, tokens,
        bound_replica=bound, avoid=tuple(avoid),
    )  # fmt: skip


@pytest.fixture
def router():
    async def make() -> ProgramAwareRouter:
        made = ProgramAwareRouter(DEPLOYMENT, DeploymentHandleSource.UNKNOWN)
        made.initialize_state(balancer="locality", locality_threshold=100)
        return made

    return asyncio.run(make())


def choose(router, candidates, request):
    return asyncio.run(router.choose_replicas(candidates, request))


def names(ranks) -> list[list[str]]:
    return [[r.replica_id.unique_id for r in rank] for rank in ranks]


def test_a_bound_programs_long_call_is_sticky_even_to_the_busier_replica(router):
    a, b = replicas("a", "b")
    router.replica_queue_len_cache.update(a.replica_id, 0)
    router.replica_queue_len_cache.update(b.replica_id, 5)
    call = engine_call("p", 500, bound="b")
    assert names(choose(router, [a, b], pending(call))) == [["b"], ["a"]]
    assert call.route.reason == "sticky" and call.route.binds


def test_a_first_long_call_binds_to_the_least_loaded_by_serves_queue_lengths(router):
    a, b = replicas("a", "b")
    router.replica_queue_len_cache.update(a.replica_id, 3)
    router.replica_queue_len_cache.update(b.replica_id, 1)
    call = engine_call("p", 500)
    assert names(choose(router, [a, b], pending(call))) == [["b"], ["a"]]
    assert call.route.reason == "bind"


def test_without_queue_lengths_the_routers_own_in_flight_calls_are_the_load(router):
    a, b = replicas("a", "b")
    router.on_request_routed(pending(engine_call("q", 1), "i1"), a.replica_id, None)
    assert names(choose(router, [a, b], pending(engine_call("p", 1), "i2")))[0] == ["b"]
    router.on_request_completed(a.replica_id, "i1")
    assert router.in_flight == {"a": 0}


def test_a_dead_binding_is_replaced_and_a_replica_that_failed_the_call_goes_last(router):
    a, b, c = replicas("a", "b", "c")
    call = engine_call("p", 500, bound="gone", avoid=["a"])
    ranks = names(choose(router, [a, b, c], pending(call)))
    assert ranks[-1] == ["a"] and ranks[0] in (["b"], ["c"])
    assert call.route.reason == "bind"


def test_requests_that_are_not_calls_may_go_to_any_replica(router):
    candidates = replicas("a", "b")
    assert choose(router, candidates, pending("health")) == [candidates]
    assert choose(router, candidates, None) == [candidates]
    assert choose(router, [], None) == []
