"""``autellix simulate tune``: the candidate rows behind docs/scheduling.md's tables."""

import itertools

from autellix_vllm.sim.tune import QUICK_WORKLOADS, RATES, candidates, row


def test_every_workload_gets_each_table_with_its_baseline_first():
    rows = candidates(list(RATES))
    for workload in RATES:
        own = [c for c in rows if c.workload == workload]
        assert own[0].policy == "vllm-opt"
        assert {"levels", "beta", "prefill weight"} <= {c.table for c in own}
    assert [c.label for c in rows if c.table == "ATLAS variant"] == ["program", "thread"]
    # Rows of one table are adjacent, so each table prints under one header.
    runs = [table for table, _ in itertools.groupby((c.workload, c.table) for c in rows)]
    assert len(runs) == len(set(runs))


def test_quick_tunes_sharegpt_and_lats_only():
    assert {c.workload for c in candidates(list(QUICK_WORKLOADS))} == {"sharegpt", "lats"}


def test_a_row_is_a_markdown_table_row():
    metrics = {"avg_latency_per_token": 0.05634, "p95_latency_per_token": 0.187,
               "p99_latency_per_token": 0.2174, "preemptions": 356, "promotions": 0}
    assert row("base", metrics) == "| base | 0.0563 | 0.1870 | 0.2174 | 356 | 0 |"
