"""The peers in the simulator: each runs a workload to completion on the same engine
model as the default, and Continuum reproduces the direction of its own published
result (ahead of vLLM's scheduling on agent sessions)."""

import math

import pytest
from autellix_vllm.policy import PolicyConfig
from autellix_vllm.policy.config import ResidencyConfig
from autellix_vllm.policy.policies import PEER_POLICIES
from autellix_vllm.sim import simulate
from autellix_vllm.workloads.generators import generate

# Agent sessions whose contexts outgrow the KV cache: where KV retention matters.
AGENTS = dict(preset="a100-llama8b-kv")


@pytest.fixture(scope="module")
def agents():
    return generate("agent", 24, 0.0125, seed=3)


@pytest.fixture(scope="module")
def fcfs(agents):
    return simulate(agents, "vllm-opt", **AGENTS).metrics


@pytest.mark.parametrize("policy", PEER_POLICIES)
def test_each_peer_serves_every_call(agents, policy):
    metrics = simulate(agents, policy, **AGENTS).metrics
    assert metrics["calls_completed"] == metrics["calls"] > 0
    assert metrics["holds_granted"] > 0


def test_continuum_is_ahead_of_vllm_on_agent_sessions_as_its_paper_reports(agents, fcfs):
    continuum = simulate(agents, "continuum", **AGENTS).metrics
    assert continuum["avg_latency_per_token"] < 0.8 * fcfs["avg_latency_per_token"]
    assert continuum["prefix_hit_rate"] > fcfs["prefix_hit_rate"]


def test_thunderagent_pausing_keeps_agent_sessions_from_thrashing(agents, fcfs):
    thunder = simulate(agents, "thunderagent", **AGENTS).metrics
    assert thunder["recomputed_tokens"] < 0.5 * fcfs["recomputed_tokens"]
    assert thunder["avg_latency_per_token"] < fcfs["avg_latency_per_token"]


def test_mori_demotes_idle_contexts_to_the_host_tier_instead_of_recomputing_them(agents):
    with_tier = dict(AGENTS, kv_offload_gib=64)
    mori = simulate(agents, "mori", **with_tier).metrics
    assert mori["reloaded_tokens"] > 0
    assert mori["calls_completed"] == mori["calls"]


def test_a_hold_never_keeps_a_new_programs_first_call_out(agents):
    """The default's first-call bound: near its highest rate on agent sessions, new
    programs' first calls no longer wait for worse-ranked holds to expire."""
    busy = generate("agent", 24, 0.0125, seed=3)
    unbounded = PolicyConfig(residency=ResidencyConfig(first_call_bound_s=math.inf))
    before = simulate(busy, "autellix", config=unbounded, **AGENTS).metrics
    after = simulate(busy, "autellix", **AGENTS).metrics
    assert after["p95_first_call_wait"] < 0.5 * before["p95_first_call_wait"]
