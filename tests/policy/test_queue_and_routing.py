"""The wait queue's ordering, and the balancers of the router and simulator."""

import pytest
from autellix_vllm.policy import (
    BALANCER_NAMES,
    BALANCERS,
    PLAS,
    Balancer,
    ConsistentHash,
    EngineLoad,
    LeastUsed,
    Locality,
    PolicyConfig,
    ProgramScheduler,
    RoundRobin,
    WaitQueue,
    make_balancer,
    routing,
)
from autellix_vllm.protocol.identity import CallIdentity


def calls(n):
    core = ProgramScheduler(PLAS(), PolicyConfig())
    return [core.add_call(CallIdentity(f"p{i}", call_id=f"c{i}"), now_s=0.0) for i in range(n)]


def test_wait_queue_orders_reranks_and_removes():
    queue = WaitQueue()
    a, b, c = calls(3)
    queue.push(a, (1, 0))
    queue.push(b, (0, 1))
    queue.push(c, (2, 2))
    assert [x.call_id for x in queue] == ["c1", "c0", "c2"]
    queue.rerank(c, (0, 0))
    assert queue.peek() is c
    assert queue.remove(b) and not queue.remove(b)
    assert [x.call_id for x in queue.best(5)] == ["c2", "c0"]
    assert len(queue) == 2 and queue.pop() is c and queue.pop() is a
    assert not queue and queue.peek() is None


def test_wait_queue_compacts_stale_entries():
    queue = WaitQueue()
    (a,) = calls(1)
    queue.push(a, (5, 0))
    for i in range(500):
        queue.rerank(a, (5, i))
    stored = sum(len(heap.entries) for heap in queue._heaps.values())
    assert stored < 200 and queue.pop() is a


ENGINES = [EngineLoad("e0", 3), EngineLoad("e1", 1), EngineLoad("e2", 2)]


def test_locality_short_calls_go_to_the_least_loaded():
    lb = Locality(threshold=2048)
    assert lb.choose("p", 100, ENGINES).index == 1
    assert lb.choose("p", 2048, ENGINES).reason == "least-loaded"
    assert "p" not in lb.bindings


def test_locality_long_calls_stick_to_their_engine():
    lb = Locality(threshold=2048)
    first = lb.choose("p", 5000, ENGINES)
    assert (first.index, first.reason) == (1, "bind")
    busier = [EngineLoad("e0", 0), EngineLoad("e1", 50), EngineLoad("e2", 0)]
    again = lb.choose("p", 5000, busier)
    assert (again.index, again.reason) == (1, "sticky")  # locality beats load


def test_locality_rebinds_when_its_engine_is_gone():
    lb = Locality(threshold=10)
    lb.choose("p", 100, ENGINES)
    survivors = [EngineLoad("e0", 3), EngineLoad("e2", 2)]
    moved = lb.choose("p", 100, survivors)
    assert (moved.index, moved.reason) == (1, "bind") and lb.bindings["p"] == "e2"
    lb.forget("p")
    assert "p" not in lb.bindings


def test_round_robin_and_least_used():
    rr = RoundRobin()
    assert [rr.choose("p", 1, ENGINES).index for _ in range(4)] == [0, 1, 2, 0]
    assert LeastUsed().choose("p", 10**6, ENGINES).index == 1


def test_consistent_hash_is_stable_and_moves_little():
    ring = ConsistentHash()
    names = [EngineLoad(f"e{i}", 0) for i in range(4)]
    before = {f"p{i}": names[ring.choose(f"p{i}", 0, names).index].name for i in range(400)}
    assert len(set(before.values())) == 4
    fewer = names[:3]
    after = {p: fewer[ring.choose(p, 0, fewer).index].name for p in before}
    moved = sum(before[p] != after[p] for p in before if before[p] != "e3")
    assert moved == 0  # only the removed engine's programs move


def test_make_balancer():
    assert make_balancer("locality", threshold=7).threshold == 7
    with pytest.raises(ValueError, match="unknown load balancer 'random' \\(choose from round"):
        make_balancer("random")
    assert make_balancer("locality", threshold=0).threshold == 0  # every call binds
    with pytest.raises(ValueError, match="locality_threshold must be >= 0, got -1"):
        make_balancer("round-robin", threshold=-1)  # refused whichever balancer is named


def test_every_balancer_class_is_registered_under_its_name():
    ours = [cls for cls in Balancer.__subclasses__() if cls.__module__ == routing.__name__]
    assert {cls.name: cls for cls in ours} == BALANCERS
    assert BALANCER_NAMES == ("round-robin", "least-used", "locality", "consistent-hash")
    for name, cls in BALANCERS.items():
        assert type(make_balancer(name)) is cls
