"""``autellix ray-serve``'s flags become the application's config (no Ray cluster)."""

import pytest
from autellix_vllm.cli import UsageError, build_parser
from autellix_vllm.cli.ray_serve import config_from_args

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
    assert made.directory == {"max_programs": 50, "max_programs_per_owner": 10_000}
    assert made.ingress.max_attempts == 2 and made.ingress.key_ring().required


def test_on_a_cluster_the_engines_do_not_split_one_hosts_cores():
    assert config("--address", "auto").engine["engines_on_host"] == 1


@pytest.mark.parametrize(
    "argv", [("--replicas", "0"), ("--allow-remote-upstreams",), ("--max-num-seqs", "0")]
)
def test_bad_flags_are_usage_errors(argv):
    with pytest.raises(UsageError):
        config(*argv)
