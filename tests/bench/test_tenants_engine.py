"""bench/experiments/tenants_engine.py end to end: ``--quick`` on the tiny model.

It starts a real engine as ``autellix serve`` does and a real router per case,
as a user runs it (a subprocess: about 90 s on 2 busy cores). Every figure must
come out positive (but the gated batch throughput: the quick window is shorter
than an interactive program and the gate's 4 s linger, which hold the batch
key's calls), and the engine's table must show that the keys file reached it:
in the classes cases the batch key's programs ranked in band 1 and the
interactive key's in band 0, today's both in band 0; with the gate, the router
must have held batch calls.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "experiments" / "tenants_engine.py"
FIGURES = (
    "interactive_p95_alone_s",
    "interactive_p95_ratio_today",
    "interactive_p95_ratio",
    "interactive_p95_ratio_gated",
    "batch_throughput_ratio",
    "flood_over_served",
    "split_service_ratio",
    "behave_service_ratio",
    "agents_p95_ratio",
)
SUMMARY = (
    "worst_interactive_p95_ratio",
    "worst_interactive_p95_ratio_gated",
    "worst_agents_p95_ratio",
    "worst_batch_throughput_ratio",
    "worst_batch_throughput_ratio_gated",
    "worst_split_service_gap",
)


@pytest.fixture(scope="module")
def result() -> dict:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def test_every_figure_is_reported_and_positive(result):
    (row,) = result["seeds"]
    figures = {name: row.get(name) for name in FIGURES}
    assert all(isinstance(v, float) and v > 0 for v in figures.values()), figures
    assert row["batch_throughput_ratio_gated"] >= 0
    assert all(name in result for name in SUMMARY), sorted(result)
    assert result["probe"]["capacity"] > 0
    served = row["split_served_decode_tokens"]
    assert served["a"] > 0 and served["b"] > 0, served


def test_the_keys_files_classes_reached_the_engine(result):
    (row,) = result["seeds"]
    cases = row["cases"]

    def bands(case: str, key: str) -> list[int]:
        return cases[case][key]["engine_bands"]

    for case in ("flood_classes", "little_classes"):
        assert (bands(case, "interactive"), bands(case, "batch")) == ([0], [1]), cases[case]
    for case in ("flood_today", "little_today"):
        assert (bands(case, "interactive"), bands(case, "batch")) == ([0], [0]), cases[case]
    # Gated, the batch key's calls waited at the router while the interactive key's
    # programs ran.
    flood_gated = cases["flood_gated"]
    assert flood_gated["held_max"].get("batch", 0) > 0, flood_gated
    assert bands("flood_gated", "interactive") == [0], flood_gated
    # Today the router gates nothing.
    assert cases["flood_today"]["held_max"] == {}
