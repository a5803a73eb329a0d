"""The one place that touches Ray (pinned to Ray 2.60.0, ``ray[serve]``).

Every other module of ``ray_serve`` goes through the names below, and
``tests/ray_serve/test_ray_api_drift.py`` fails loudly when one of them changes
shape. What is relied on, and why:

* ``ray.serve.request_router``: ``RequestRouter`` is subclassed; Serve calls its
  ``choose_replicas(candidate_replicas, pending_request)`` (ranks of replicas,
  best first; Serve takes the least-queued replica of the first rank that has
  room) and ``initialize_state(**request_router_kwargs)``. A
  ``PendingRequest``'s ``args`` are the handle call's arguments, unserialized
  (the router runs in the caller's process, before the call is sent).
  ``RunningReplica.replica_id.unique_id`` names a replica; the replica itself
  reads the same id from ``serve.get_replica_context()``.
* ``RequestRouter.replica_queue_len_cache``: the requests each replica has
  ongoing, as Serve last probed or counted them (``None`` when stale).
* ``RequestRouterConfig(request_router_class=..., request_router_kwargs=...)`` on
  a deployment sets its router for every handle to it.
* ``DeploymentHandle.options(stream=True, session_id=...)``: a method that yields
  is streamed to the caller; the session id reaches every request router as
  ``pending_request.metadata.session_id`` (Ray's consistent-hash router keys on it).
* A call to a replica that died raises ``RayActorError`` (``ActorDiedError``,
  ``ActorUnavailableError``) in the caller: the call may be sent again.
"""

from __future__ import annotations

from typing import Any

import ray
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

PINNED_RAY_VERSION = "2.60.0"

# Raised by a handle call whose replica died or cannot be reached.
REPLICA_FAILURES: tuple[type[BaseException], ...] = (RayActorError,)

__all__ = [
    "PINNED_RAY_VERSION",
    "REPLICA_FAILURES",
    "DeploymentHandle",
    "DeploymentResponseGenerator",
    "PendingRequest",
    "ReplicaID",
    "RequestRouter",
    "RequestRouterConfig",
    "RunningReplica",
    "call_argument",
    "queue_length",
    "ray",
    "replica_name",
    "serve",
    "this_replica_name",
]


def replica_name(replica: RunningReplica) -> str:
    """The name a replica goes by in routes, reports and the process table."""
    return replica.replica_id.unique_id


def this_replica_name() -> str:
    """Inside a replica: its own name (the same as :func:`replica_name` gives)."""
    return serve.get_replica_context().replica_id.unique_id


def queue_length(router: RequestRouter, replica: RunningReplica) -> int | None:
    """The requests ``replica`` has ongoing as Serve last knew it; None if unknown."""
    return router.replica_queue_len_cache.get(replica.replica_id)


def call_argument(pending_request: PendingRequest | None) -> Any:
    """The first argument of the handle call being routed (None if there is none)."""
    if pending_request is None or not pending_request.args:
        return None
    return pending_request.args[0]
