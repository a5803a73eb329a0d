"""The scripts of bench/experiments run, each on a tiny input."""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
from autellix_vllm.policy.policies import POLICIES
from autellix_vllm.sim.presets import PRESETS
from autellix_vllm.workloads import generate

EXPERIMENTS = Path(__file__).resolve().parents[2] / "bench" / "experiments"


def experiment(name: str) -> ModuleType:
    """The script as a module its process pool's workers can import too."""
    if str(EXPERIMENTS) not in sys.path:
        sys.path.append(str(EXPERIMENTS))
    return importlib.import_module(name)


def test_every_script_is_listed_and_has_a_main():
    listed = (EXPERIMENTS / "README.md").read_text()
    for path in EXPERIMENTS.glob("*.py"):
        assert f"`{path.name}`" in listed
        assert callable(experiment(path.stem).main)


def test_the_replica_grid_point_where_a_short_program_used_to_pay(capsys):
    args = ["--seeds", "2", "--speeds", "234", "--scales", "0.736", "--workers", "1", "--json"]
    assert experiment("replica_grid").main(args) == 0
    result = json.loads(capsys.readouterr().out)
    (point,) = result["points"]
    assert point["avg_ratio"] == pytest.approx(result["summary"]["mean_avg_ratio"])
    # Seed 2's late single-call program was preempted right after its own
    # prefill; the rent-or-buy rule lets it decode first.
    assert point["short_over"] == []
    assert point["avg_ratio"] > 1.0


def test_the_replica_grid_point_where_a_preempted_prefill_used_to_pay(capsys):
    args = ["--seeds", "0", "--speeds", "234", "--scales", "0.85", "--workers", "1", "--json"]
    assert experiment("replica_grid").main(args) == 0
    (point,) = json.loads(capsys.readouterr().out)["points"]
    # Seed 0's agent-1 had its third call preempted mid-prefill for KV while idle
    # contexts of its own level stayed held; now those holds give way first.
    assert point["short_over"] == []


def test_the_replica_grid_replays_another_mix_of_the_bench(capsys):
    point = ["--seeds", "1", "--speeds", "190", "--scales", "0.85", "--workers", "1", "--json"]
    mix = ["--programs", "24", "--max-model-len", "1536", "--kv-blocks", "64"]
    assert experiment("replica_grid").main(point) == 0
    default = json.loads(capsys.readouterr().out)
    assert experiment("replica_grid").main(point + mix) == 0
    other = json.loads(capsys.readouterr().out)
    assert default["mix"] == {"programs": 14, "max_model_len": 2560, "kv_blocks": 96}
    assert other["mix"] == {"programs": 24, "max_model_len": 1536, "kv_blocks": 64}
    assert other["points"][0]["avg_ratio"] != default["points"][0]["avg_ratio"]


def test_a_band_is_the_mean_of_its_rates(capsys):
    band = experiment("band")
    args = ["--workload", "bfcl", "--setting", "a100-llama8b", "--centre", "0:4.0",
            "--workers", "1"]  # fmt: skip
    assert band.main([*args, "--points", "2"]) == 0
    both = json.loads(capsys.readouterr().out)
    one = [band.average(("bfcl", band.setting("a100-llama8b"), "autellix", band.PolicyConfig(),
                         False, 0, rate)) for rate in (3.8, 4.2)]  # fmt: skip
    assert both["mean"] == pytest.approx(sum(one) / 2)


def test_the_crossing_is_the_highest_passing_and_lowest_failing_rate(capsys):
    args = ["--workload", "bfcl", "--setting", "a100-llama8b", "--guess", "vllm-opt:4,autellix:4.4",
            "--points", "3", "--step", "0.5", "--workers", "1"]  # fmt: skip
    assert experiment("crossing").main(args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    grids, crossings = lines[:2], lines[2:]
    for grid, crossing in zip(grids, crossings, strict=True):
        assert grid["policy"] == crossing["policy"]
        rates = {float(rate): value for rate, value in grid["averages"].items()}
        passing = [rate for rate, value in rates.items() if value <= grid["slo"]]
        assert crossing["highest_passing"] == max(passing, default=0.0)
        assert len(rates) == 3 and grid["slo"] > 0
    assert crossings[0]["ratio_passing"] == 1.0


def test_every_timed_call_finds_the_program_its_conversation_began(capsys):
    args = ["--programs", "50", "--steps", "3", "--calls", "100", "--chars", "200"]
    assert experiment("derived_identity_cost").main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["found_its_program"] == 100 and result["derived_programs"] == 50
    assert 0 < result["median_ms"] <= result["p99_ms"]


def test_the_fair_share_compares_the_others_with_and_without_the_claims(capsys):
    args = ["--programs", "6", "--rate", "0.05", "--owners", "2", "--seeds", "0",
            "--workers", "1"]  # fmt: skip
    assert experiment("fair_share").main(args) == 0
    result = json.loads(capsys.readouterr().out)
    (row,) = result["seeds"]
    honest, greedy = row["others_avg"]
    assert row["avg_ratio"] == pytest.approx(greedy / honest)
    assert result["fair_share"] is True and result["fair_share_of_budget"] == 0.5
    # The greedy owner's claims show in its held share, which stays within [0, 1].
    assert all(0 <= share <= 1 for share in row["greedy_held_share"])


def test_the_staleness_table_has_a_row_per_engine_count_seed_and_sync(capsys):
    staleness = experiment("table_staleness")
    args = ["--engines", "2", "--seeds", "0", "--sync", "fresh,1", "--duration", "3", "--json"]
    assert staleness.main(args) == 0
    fresh, synced = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert (fresh["sync"], synced["sync"]) == ("fresh", "1")
    assert fresh["programs"] == synced["programs"] == 24  # 4 programs/s per engine, 3 s
    # One admission a call either way; a fresh table takes one report a call, a
    # synced one at most one batch per engine a second.
    assert fresh["report_per_s"] == fresh["admit_per_s"] == pytest.approx(synced["admit_per_s"])
    assert 0 < synced["report_per_s"] < fresh["report_per_s"]


def test_the_directory_admits_every_call_and_times_them(capsys):
    args = ["--programs", "5", "--calls", "200", "--reports", "3", "--replicas", "2"]
    assert experiment("directory_throughput").main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["calls"] == 200 and result["calls_per_s"] > 0
    assert result["calls_per_s"] == pytest.approx(200 / result["seconds"])


def test_the_tier_bound_sweeps_the_same_engine_with_an_instant_host_link(capsys):
    bound = experiment("tier_bound")
    instant, pcie = bound.INSTANT, bound.PCIE
    assert pcie is PRESETS["a100-llama8b-kv"] and instant.name not in PRESETS  # swept as it is
    assert instant.host_seconds_per_token < 1e-12 < pcie.host_seconds_per_token
    assert replace(instant, name=pcie.name, host_bytes_per_s=pcie.host_bytes_per_s) == pcie
    args = ["--seeds", "0", "--programs", "8", "--policies", "vllm-opt", "--workers", "1"]
    assert bound.main(args) == 0
    row = json.loads(capsys.readouterr().out)
    rate = row["pcie"]["vllm-opt"]
    assert rate > 0
    assert row["instant_over_pcie"]["vllm-opt"] == row["instant_link"]["vllm-opt"] / rate


def test_the_size_aware_orders_rank_by_the_known_distribution(capsys):
    size_bound = experiment("size_bound")
    known = dict(POLICIES)
    size_bound.know({size_bound.ALL: [1000, 10] * 50})
    new, past_the_short = size_bound._grid(0), size_bound._grid(20)
    # New: half end within 10 tokens, which take 10 each (index 0.5 / 10).
    assert size_bound.gittins_index(size_bound.ALL, new) == pytest.approx(0.05)
    # Past the short ones only the long remain: about 980 tokens to go.
    attained = size_bound._attained(past_the_short)
    assert size_bound.gittins_index(size_bound.ALL, past_the_short) == pytest.approx(
        1 / (1000 - attained)
    )
    assert size_bound.mean_residual(size_bound.ALL, new) == pytest.approx(505)
    args = ["--workload", "mixed", "--seeds", "0", "--programs", "12", "--workers", "1",
            "--policies", "vllm-opt", "--orders", "gittins,autellix-gittins-kind"]  # fmt: skip
    assert size_bound.main(args) == 0
    rates = json.loads(capsys.readouterr().out)["max_rate"]
    assert set(rates) == {"vllm-opt", "gittins", "autellix-gittins-kind"}
    assert min(rates.values()) > 0
    assert known == POLICIES  # registered for the run only


def test_the_tenants_experiment_reports_each_target_per_seed(capsys):
    args = ["--window", "4", "--seeds", "0", "--workers", "1", "--max-num-seqs", "8"]
    assert experiment("tenants").main(args) == 0
    result = json.loads(capsys.readouterr().out)
    (row,) = result["seeds"]
    assert row["interactive_p95_alone"] > 0
    ratios = ("interactive_p95_ratio", "batch_throughput_ratio", "split_service_ratio",
              "interactive_p95_ratio_gated", "batch_throughput_ratio_gated",
              "closed_split_service_ratio", "closed_agents_p95_ratio",
              "closed_split_service_ratio_today", "closed_agents_p95_ratio_today",
              "behave_service_ratio", "weighted_service_ratio")  # fmt: skip
    for ratio in ratios:
        assert row[ratio] > 0
    assert result["worst_batch_throughput_ratio"] == row["batch_throughput_ratio"]
    assert result["worst_batch_throughput_ratio_gated"] == row["batch_throughput_ratio_gated"]


def test_a_split_program_is_one_program_per_call_arriving_open_loop():
    tenants = experiment("tenants")
    (program,) = generate("bfcl", 1, 1.0, 0)
    pieces = tenants.split([program], "a100-llama8b")
    assert len(pieces) == len(program.calls)
    assert all(len(p.calls) == 1 and not p.calls[0].after for p in pieces)
    arrivals = [p.arrival for p in pieces]
    assert arrivals == sorted(arrivals) and arrivals[0] >= program.arrival
    assert arrivals[-1] > program.arrival  # a chain's later calls come later
