"""The router's gate rule (policy.flow_control): saturation, order, starvation bound."""

import pytest
from autellix_vllm.policy import TenantConfig
from autellix_vllm.policy.flow_control import FlowControl, FlowControlConfig

AGING = TenantConfig().band_aging_s


def gate(seats: int | None = 4, **config: float) -> FlowControl[str]:
    options = {"seat_share": 1.0, "reserve_share": 0.0, "linger_s": 0.0, **config}
    return FlowControl(FlowControlConfig(**options), TenantConfig(), seats)


def test_band_0_is_never_held_and_one_band_never_waits():
    g = gate(seats=1)
    assert all(g.arrive(f"c{i}", 0, "a", 0.0) is None for i in range(10))
    assert g.holding() == 0


def test_a_worse_band_waits_while_the_seats_are_full_and_goes_when_one_frees():
    g = gate(seats=2)
    assert g.arrive("i", 0, "a", 0.0) is None
    assert g.arrive("b1", 1, "b", 0.0) is None
    held = g.arrive("b2", 1, "b", 0.0)
    assert held is not None and g.held() == {1: 1}
    assert g.release(1.0) == []
    g.ended(0, 1.0)
    assert [h.item for h in g.release(1.0)] == ["b2"]
    assert held.band == 1 and not held.aged and g.holding() == 0


def test_unknown_seats_hold_nothing():
    g = gate(seats=None)
    assert all(g.arrive(f"c{i}", 3, "a", 0.0) is None for i in range(10))


def test_the_seat_share_caps_worse_bands():
    g = gate(seats=8, seat_share=0.5)
    assert [g.arrive(f"b{i}", 1, "b", 0.0) for i in range(4)] == [None] * 4
    assert g.arrive("b4", 1, "b", 0.0) is not None


def test_each_better_call_in_flight_keeps_reserve_seats_from_worse_bands():
    g = gate(seats=10, reserve_share=0.3)
    assert g.arrive("i1", 0, "a", 0.0) is None
    assert g.arrive("i2", 0, "a", 0.0) is None
    # 2 in flight + 3 x 2 reserved = 8 of 10: one batch call, then full.
    assert g.arrive("b1", 1, "b", 0.0) is None
    assert g.arrive("b2", 1, "b", 0.0) is None
    assert g.arrive("b3", 1, "b", 0.0) is not None
    # Band 1 is better than band 2: its calls keep seats from band 2, not from itself.
    assert g.saturated(2, 0.0)


def test_a_better_call_lingers_after_it_ended():
    g = gate(seats=10, reserve_share=0.3, linger_s=2.0)
    assert g.arrive("i", 0, "a", 0.0) is None
    assert [g.arrive(f"b{i}", 1, "b", 0.0) for i in range(6)] == [None] * 6
    held = g.arrive("b6", 1, "b", 0.0)
    assert held is not None
    g.ended(0, 1.0)  # 6 in flight + 3 reserved for the lingering call: full
    assert g.release(1.0) == []
    assert g.next_look(1.0) == pytest.approx(3.0)
    # Never a moment past: once the linger is over, the next is the held call's bound.
    assert g.next_look(3.5) == pytest.approx(AGING)
    assert [h.item for h in g.release(3.0)] == ["b6"]


def test_best_band_first_then_owners_in_turn_then_arrival():
    g = gate(seats=1)
    assert g.arrive("first", 2, "x", 0.0) is None
    for item, band, owner in [("x2a", 2, "x"), ("a1", 1, "a"), ("a2", 1, "a"),
                              ("a3", 1, "a"), ("b1", 1, "b"), ("b2", 1, "b")]:  # fmt: skip
        assert g.arrive(item, band, owner, 0.0) is not None
    order = []
    for t in range(1, 7):
        g.ended(2 if t == 1 else 1, float(t))
        order += [h.item for h in g.release(float(t))]
    assert order == ["a1", "b1", "a2", "b2", "a3", "x2a"]


def test_a_newcomer_waits_behind_its_bands_held_calls():
    g = gate(seats=2)
    assert g.arrive("b1", 1, "b", 0.0) is None
    assert g.arrive("b2", 1, "b", 0.0) is None
    assert g.arrive("b3", 1, "b", 0.0) is not None
    g.ended(1, 1.0)  # a seat frees, but b3 was first: the next arrival waits
    assert g.arrive("b4", 1, "b", 1.0) is not None
    assert [h.item for h in g.release(1.0)] == ["b3"]


def test_a_held_call_goes_as_band_0_at_the_starvation_bound():
    g = gate(seats=1)
    assert g.arrive("b1", 1, "b", 0.0) is None
    held = g.arrive("b2", 1, "b", 5.0)
    assert held is not None
    assert g.next_look(5.0) == pytest.approx(5.0 + AGING)
    assert g.release(4.0 + AGING) == []
    assert [h.item for h in g.release(5.0 + AGING)] == ["b2"]
    assert held.aged and held.band == 0
    # It went as band 0: it is counted there, and ends there.
    assert g.saturated(1, 5.0 + AGING)
    g.ended(0, 6.0 + AGING)
    g.ended(1, 6.0 + AGING)
    assert not g.saturated(1, 6.0 + AGING)


def test_a_dropped_call_never_goes():
    g = gate(seats=1)
    assert g.arrive("b1", 1, "b", 0.0) is None
    held = g.arrive("b2", 1, "b", 0.0)
    later = g.arrive("b3", 1, "b", 0.0)
    assert held is not None and later is not None
    g.drop(held)
    g.drop(held)  # twice is harmless
    g.ended(1, 1.0)
    assert [h.item for h in g.release(1.0)] == ["b3"]
    assert g.next_look(1.0) is None


def test_the_config_is_checked():
    with pytest.raises(ValueError, match="seat_share"):
        FlowControlConfig(seat_share=0.0)
    with pytest.raises(ValueError, match="reserve_share"):
        FlowControlConfig(reserve_share=-1.0)
    with pytest.raises(ValueError, match="linger_s"):
        FlowControlConfig(linger_s=-1.0)
