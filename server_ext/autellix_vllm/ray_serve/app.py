"""The Ray Serve application: ingress, directory, engine replicas.

From Python::

    serve.run(build_app(RayServeConfig(replicas=2)), name="autellix", route_prefix="/")

From a Serve config file (``serve deploy``), an application whose
``import_path`` is ``autellix_vllm.ray_serve.app:build`` and whose ``args``
are :class:`RayServeConfig`'s fields (docs/operations.md has one).

``router`` chooses how the engine replicas are picked: ``autellix`` (the
program-aware router with ``balancer``), or Ray's own ``pow2`` (power of two
choices, Serve's default) and ``consistent-hash`` (sticky on Serve's session id,
``x-session-id``), the baselines.

``flow_control`` turns on the router's flow-control gate (``autellix serve
--flow-control``), kept by the directory for the whole pool: its seats are the
engine replicas' ``max_num_seqs`` summed (:meth:`RayServeConfig.seats`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autellix_vllm.engine.launcher import EngineConfig, batch_seats
from autellix_vllm.policy.flow_control import FlowControlConfig
from autellix_vllm.policy.routing import DEFAULT_LOCALITY_THRESHOLD, make_balancer
from autellix_vllm.ray_serve._ray_adapter import RequestRouterConfig, serve
from autellix_vllm.ray_serve.directory import ProgramDirectory
from autellix_vllm.ray_serve.engine_replica import GRACEFUL_SHUTDOWN_TIMEOUT_S, EngineReplica
from autellix_vllm.ray_serve.ingress import Ingress, IngressSettings

# ``router`` -> the request router class of the engine deployment.
ROUTERS = {
    "autellix": "autellix_vllm.ray_serve.request_router.ProgramAwareRouter",
    "pow2": "ray.serve._private.request_router.pow_2_router.PowerOfTwoChoicesRequestRouter",
    "consistent-hash": "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter",
}


@dataclass
class RayServeConfig:
    """The application's settings; ``engine`` holds ``EngineConfig`` fields."""

    engine: dict[str, Any] = field(default_factory=lambda: {"model": "tiny"})
    replicas: int = 2
    ingress_replicas: int = 1
    router: str = "autellix"
    balancer: str = "locality"
    locality_threshold: int = DEFAULT_LOCALITY_THRESHOLD
    # CPUs (GPUs) Ray reserves per engine replica (its engine runs in that share).
    engine_cpus: float = 1.0
    engine_gpus: float = 0.0
    # The key every replica starts its engine with (None: a fresh one per replica).
    engine_key: str | None = None
    # Calls one engine replica takes at once before Serve queues them elsewhere.
    max_ongoing_calls: int = 64
    # Calls one ingress replica relays at once. Serve's default (5) would queue the
    # sixth concurrent client at the proxy although an ingress replica only waits
    # on its engines; this bounds it as the engines' seats do.
    max_ongoing_ingress_calls: int = 1024
    health_check_period_s: float = 2.0
    # ProgramDirectory's keyword arguments (its bounds: a TableBounds).
    directory: dict[str, Any] = field(default_factory=dict)
    ingress: IngressSettings = field(default_factory=IngressSettings)
    # Calls of worse bands wait at the directory while the pool is saturated for
    # them (policy.flow_control; ``autellix ray-serve --flow-control``); None, the
    # default: every call goes to an engine replica at once.
    flow_control: FlowControlConfig | None = None

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        if self.replicas < 1 or self.ingress_replicas < 1:
            raise ValueError("replicas and ingress_replicas must be at least 1")
        if self.max_ongoing_calls < 1 or self.max_ongoing_ingress_calls < 1:
            raise ValueError("max_ongoing_calls and max_ongoing_ingress_calls must be at least 1")
        if self.engine_cpus < 0 or self.engine_gpus < 0:
            raise ValueError("engine_cpus and engine_gpus must be >= 0")
        if self.router == "autellix":
            make_balancer(self.balancer, self.locality_threshold)
        if isinstance(self.ingress, dict):
            self.ingress = IngressSettings(**self.ingress)
        if isinstance(self.flow_control, dict):
            self.flow_control = FlowControlConfig(**self.flow_control)
        if self.flow_control is not None and self.seats() is None:
            raise ValueError(
                "flow control needs the engines' max_num_seqs on a GPU (vLLM sizes the"
                " batch by the device there): set it (--max-num-seqs)"
            )

    def seats(self) -> int | None:
        """The engine replicas' seats summed: the pool the flow-control gate fills
        (None: unknown, a GPU engine without ``max_num_seqs``)."""
        # A replica sees a GPU only if Ray gives it one.
        device = "gpu" if self.engine_gpus > 0 else "cpu"
        seats = batch_seats(EngineConfig(**self.engine), device)
        return None if seats is None else seats * self.replicas


def deployment_options(config: RayServeConfig) -> dict[str, dict[str, Any]]:
    """Each deployment's Serve options (``serve.deployment``'s keyword arguments), by name."""
    router_kwargs = (
        {"balancer": config.balancer, "locality_threshold": config.locality_threshold}
        if config.router == "autellix"
        else {}
    )
    return {
        "EngineReplica": {
            "num_replicas": config.replicas,
            "max_ongoing_requests": config.max_ongoing_calls,
            "health_check_period_s": config.health_check_period_s,
            # Time for a stopping replica to stop its engine (EngineReplica.__del__).
            "graceful_shutdown_timeout_s": GRACEFUL_SHUTDOWN_TIMEOUT_S,
            "ray_actor_options": {"num_cpus": config.engine_cpus, "num_gpus": config.engine_gpus},
            "request_router_config": RequestRouterConfig(
                # Ray types every keyword of RequestRouterConfig as a dict (**kwargs: dict).
                request_router_class=ROUTERS[config.router],  # type: ignore[arg-type]
                request_router_kwargs=router_kwargs,
            ),
        },
        # Every ingress replica's calls pass the directory: it takes them all at once
        # (each holds one request there at a time: its admission, or its wait at the
        # gate), and each replica's two background senders (reports, the gate's leaves).
        "ProgramDirectory": {
            "num_replicas": 1,
            "max_ongoing_requests": config.ingress_replicas
            * (config.max_ongoing_ingress_calls + 2),
            "ray_actor_options": {"num_cpus": 0},
        },
        "Ingress": {
            "num_replicas": config.ingress_replicas,
            "max_ongoing_requests": config.max_ongoing_ingress_calls,
            "ray_actor_options": {"num_cpus": 0},
        },
    }


def build_app(config: RayServeConfig) -> Any:
    """The bound Serve application (``serve.run`` takes it)."""
    options = deployment_options(config)
    # Ray types serve.deployment as the decorator it returns without a class, so the
    # class is passed to that decorator.
    deploy = lambda cls: serve.deployment(name=cls.__name__, **options[cls.__name__])(cls)  # noqa: E731
    engines = deploy(EngineReplica).bind(config.engine, config.engine_key)
    directory = deploy(ProgramDirectory).bind(
        **config.directory, flow_control=config.flow_control, seats=config.seats()
    )
    return deploy(Ingress).bind(engines, directory, config.ingress)


def build(args: dict[str, Any]) -> Any:
    """The application builder a Serve config file names (``args``: the config's fields)."""
    return build_app(RayServeConfig(**args))


def describe(config: RayServeConfig) -> dict[str, Any]:
    """The config as plain data, keys left out (for logs and the CLI's ready line)."""
    data = asdict(config)
    for key in ("api_key", "admin_key"):
        if data["ingress"].get(key):
            data["ingress"][key] = "***"
    if data["engine_key"]:
        data["engine_key"] = "***"
    return data
