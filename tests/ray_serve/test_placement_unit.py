"""Placing calls on engine replicas (``ray_serve.placement``), without Ray."""

import pytest
from autellix_vllm.policy.routing import EngineLoad, make_balancer
from autellix_vllm.ray_serve.placement import ReplicaPlacer

THRESHOLD = 100
LONG, SHORT = THRESHOLD + 1, THRESHOLD


def loads(**by_name: float) -> list[EngineLoad]:
    return [EngineLoad(name, load) for name, load in by_name.items()]


def placer(name: str = "locality") -> ReplicaPlacer:
    return ReplicaPlacer(make_balancer(name, THRESHOLD))


def test_a_long_call_without_binding_binds_to_the_least_loaded_then_ranks_the_rest_by_load():
    placement = placer().place("p", LONG, loads(a=3, b=1, c=2))
    assert placement.ranked == [1, 2, 0]
    assert placement.route.binds and placement.route.reason == "bind"


def test_a_long_call_goes_to_the_replica_the_table_binds_its_program_to_even_if_busier():
    placement = placer().place("p", LONG, loads(a=0, b=9), bound="b")
    assert placement.ranked == [1, 0]
    assert placement.route.reason == "sticky" and placement.route.binds


def test_a_short_call_goes_to_the_least_loaded_whatever_the_binding():
    placement = placer().place("p", SHORT, loads(a=0, b=9), bound="b")
    assert placement.ranked[0] == 0
    assert not placement.route.binds


def test_a_binding_to_a_replica_no_longer_offered_is_replaced_by_the_least_loaded():
    placement = placer().place("p", LONG, loads(a=5, b=2), bound="dead")
    assert placement.ranked[0] == 1
    assert placement.route.reason == "bind"


def test_the_placer_keeps_no_binding_between_calls():
    p = placer()
    p.place("p", LONG, loads(a=0, b=1))
    # Without the table's binding the rule binds anew, to the least-loaded.
    assert p.place("p", LONG, loads(a=1, b=0)).ranked[0] == 1
    assert p.balancer.bindings == {}


def test_replicas_that_failed_the_call_are_ranked_last_but_still_offered():
    placement = placer().place("p", LONG, loads(a=0, b=5, c=3), bound="a", avoid=("a",))
    assert placement.ranked == [2, 1, 0]
    only = placer().place("p", LONG, loads(a=0), avoid=("a",))
    assert only.ranked == [0]


@pytest.mark.parametrize("name", ["round-robin", "least-used", "consistent-hash"])
def test_every_balancer_of_the_project_can_place(name):
    placement = placer(name).place("p", LONG, loads(a=1, b=0))
    assert sorted(placement.ranked) == [0, 1]


def test_no_replica_is_an_error():
    with pytest.raises(ValueError):
        placer().place("p", LONG, [])
