"""One percentile for the simulator and the benchmarks (always one of the values),
and the tails both report."""

import pytest
from autellix_vllm.stats import TAIL_KEYS, percentile, tails


def test_a_percentile_is_the_value_at_the_rounded_index():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]  # sorted: 1 2 3 4 5
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 3.0
    assert percentile(values, 95) == 5.0  # index round(3.8) = 4
    assert percentile(values, 70) == 4.0  # index round(2.8) = 3
    assert percentile(values, 100) == 5.0
    assert values == [5.0, 1.0, 4.0, 2.0, 3.0]  # the caller's list is left alone


@pytest.mark.parametrize(("count", "p95_rank"), [(16, 15), (32, 30), (2000, 1900)])
def test_p95_of_a_benchmark_run(count, p95_rank):
    assert percentile([float(i) for i in range(1, count + 1)], 95) == p95_rank


def test_no_values_give_zero():
    assert percentile([], 99) == 0.0


def test_tails_are_the_latency_percentiles_and_the_first_call_waits_mean_and_p95():
    latency = [float(i) for i in range(1, 101)]  # 1 .. 100 s
    waits = [0.0] * 90 + [10.0] * 10
    assert tails(latency, waits) == {
        "p95_program_latency": 95.0,  # index round(94.05) = 94
        "p99_program_latency": 99.0,
        "avg_first_call_wait": 1.0,
        "p95_first_call_wait": 10.0,
    }
    assert list(tails([], [])) == list(TAIL_KEYS)
    assert set(tails([], []).values()) == {0.0}
