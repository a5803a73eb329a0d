"""``autellix ray-serve``'s flags become the application's config (no Ray cluster)."""

import pytest
from autellix_vllm.cli import UsageError, build_parser
from autellix_vllm.cli.ray_serve import config_from_args
from autellix_vllm.engine.launcher import CPU_MAX_NUM_SEQS
from autellix_vllm.policy.config import TableBounds
from autellix_vllm.policy.flow_control import FlowControlConfig

pytest.importorskip("ray")


def config(*argv: str):
    return config_from_args(build_parser().parse_args(["ray-serve", *argv]))


def test_flags_reach_the_engines_the_router_the_directory_and_the_ingress():
    made = config(
        "--model", "tiny", "--replicas", "3", "--router", "autellix", "--lb", "least-used",
        "--locality-threshold", "64", "--max-num-seqs", "2", "--max-programs", "50",
        "--api-key", "sk-test-key-1234567890", "--max-attempts", "2",
    )  # fmt: skip
    assert (made.replicas, made.balancer, made.locality_threshold) == (3, "least-used", 64)
    assert made.engine["model"] == "tiny" and made.engine["max_num_seqs"] == 2
    # Each replica picks its engine's port and key itself; a local cluster is one host.
    assert not {"host", "port", "api_key", "log_file"} & set(made.engine)
    assert made.engine["engines_on_host"] == 3
    assert made.directory["bounds"] == TableBounds(max_programs=50)
    assert made.directory["derived_programs"] and made.directory["prefix_programs"]
    assert made.engine["table"] == TableBounds(max_programs=50)
    assert made.ingress.max_attempts == 2 and made.ingress.key_ring().required


def test_the_directory_derives_programs_as_the_router_is_told():
    made = config("--no-derived-programs", "--derived-idle-end", "60")
    assert not made.directory["derived_programs"]
    assert made.directory["derived_idle_end_s"] == 60


def test_flow_control_fills_the_replicas_seats_summed():
    assert config().flow_control is None  # off unless asked for
    made = config("--flow-control", "--replicas", "3", "--max-num-seqs", "4")
    assert made.flow_control == FlowControlConfig() and made.seats() == 12
    # A CPU engine's default seats; a GPU engine's are vLLM's to pick by the device.
    assert config("--flow-control", "--replicas", "2").seats() == 2 * CPU_MAX_NUM_SEQS
    with pytest.raises(UsageError, match="max-num-seqs"):
        config("--flow-control", "--engine-gpus", "1")
    assert config("--flow-control", "--engine-gpus", "1", "--max-num-seqs", "64").seats() == 128


def test_a_serve_config_file_states_flow_control_as_its_fields():
    from autellix_vllm.ray_serve.app import RayServeConfig

    made = RayServeConfig(flow_control={"reserve_share": 0.5})  # type: ignore[arg-type]
    assert made.flow_control == FlowControlConfig(reserve_share=0.5)


def test_one_engine_key_for_every_replica_is_kept_out_of_the_ready_line(monkeypatch):
    from autellix_vllm.ray_serve.app import describe

    monkeypatch.delenv("AUTELLIX_ENGINE_KEY", raising=False)
    assert config().engine_key is None  # each replica makes its own
    made = config("--engine-key", "sk-engine-test")
    assert made.engine_key == "sk-engine-test" and describe(made)["engine_key"] == "***"
    monkeypatch.setenv("AUTELLIX_ENGINE_KEY", "sk-from-env")
    assert config().engine_key == "sk-from-env"


def test_on_a_cluster_the_engines_do_not_split_one_hosts_cores():
    assert config("--address", "auto").engine["engines_on_host"] == 1


@pytest.mark.parametrize(
    "argv",
    [("--replicas", "0"), ("--allow-remote-upstreams",), ("--max-num-seqs", "0"),
     ("--engine-gpus", "-1"), ("--locality-threshold", "-1")],
)  # fmt: skip
def test_bad_flags_are_usage_errors(argv):
    with pytest.raises(UsageError):
        config(*argv)


def test_each_deployment_takes_as_many_calls_as_its_callers_send():
    options = deployment_options_of("--replicas", "2", "--ingress-replicas", "3")
    # Serve's default (5 at once) would queue the sixth concurrent client at the proxy.
    assert options["Ingress"]["max_ongoing_requests"] == 1024
    # Each call's one request at a time there, and each ingress replica's two senders.
    assert options["ProgramDirectory"]["max_ongoing_requests"] == 3 * (1024 + 2)
    assert options["EngineReplica"]["max_ongoing_requests"] == 64
    assert (options["Ingress"]["num_replicas"], options["EngineReplica"]["num_replicas"]) == (3, 2)


def test_engine_gpus_reach_the_replicas_resources():
    options = deployment_options_of("--engine-gpus", "1", "--engine-cpus", "2")
    assert options["EngineReplica"]["ray_actor_options"] == {"num_cpus": 2.0, "num_gpus": 1.0}
    assert deployment_options_of()["EngineReplica"]["ray_actor_options"]["num_gpus"] == 0.0


def deployment_options_of(*argv: str):
    from autellix_vllm.ray_serve.app import deployment_options

    return deployment_options(config(*argv))
