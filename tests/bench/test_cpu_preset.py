"""`autellix bench cpu-preset`'s prefill fit (the calibration itself starts an engine
and runs for minutes; its numbers are in autellix_vllm/sim/presets.py)."""

import pytest
from autellix_vllm.bench.cpu_preset import PREFILL_LENGTHS, fit_prefill


def test_the_prefill_fit_recovers_a_per_token_and_a_pair_cost():
    def first_token_s(n: int) -> float:
        return 0.012 + 0.00058 * n + 0.00000042 * n * (n + 1) / 2

    per_token, per_pair = fit_prefill({n: first_token_s(n) for n in PREFILL_LENGTHS})
    assert per_token == pytest.approx(0.00058)
    assert per_pair == pytest.approx(0.00000042)


def test_a_linear_prefill_fits_no_pair_cost():
    per_token, per_pair = fit_prefill({n: 0.02 + 0.0008 * n for n in PREFILL_LENGTHS})
    assert per_token == pytest.approx(0.0008)
    assert per_pair == pytest.approx(0.0, abs=1e-12)


def test_two_lengths_cannot_separate_the_terms():
    with pytest.raises(ValueError, match="three prompt lengths"):
        fit_prefill({32: 0.04, 800: 0.6})
