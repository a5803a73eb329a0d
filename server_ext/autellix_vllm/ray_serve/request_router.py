"""The program-aware request router: Ray Serve's extension point, set on the engine replicas.

Serve builds one router per deployment handle (so one per ingress replica) and
asks it to rank the engine replicas for each call. The ranking is
:class:`~autellix_vllm.ray_serve.placement.ReplicaPlacer`'s, with the balancer
named in ``request_router_kwargs`` (``balancer``, ``locality_threshold``; the
paper's locality rule by default). The call's program, prompt size, binding
(from the global table) and failed replicas come with the
:class:`~autellix_vllm.ray_serve.messages.EngineCall` the ingress sends; the
router writes its route on that call, and the replica echoes it back, so the
ingress can report the binding to the table.

Load: the requests a replica has ongoing as Serve knows them (its queue-length
cache, probed and counted per call across every handle), else the calls this
router has in flight there. Replicas that die or are drained leave
``candidate_replicas``; a program bound to one is rebound by the rule.
"""

from __future__ import annotations

from typing import Any

from autellix_vllm.policy.routing import DEFAULT_LOCALITY_THRESHOLD, EngineLoad, make_balancer
from autellix_vllm.ray_serve._ray_adapter import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
    call_argument,
    queue_length,
    replica_name,
)
from autellix_vllm.ray_serve.messages import EngineCall
from autellix_vllm.ray_serve.placement import ReplicaPlacer


class ProgramAwareRouter(RequestRouter):
    """Ranks engine replicas by the project's balancer (see the module)."""

    def initialize_state(
        self,
        balancer: str = "locality",
        locality_threshold: int = DEFAULT_LOCALITY_THRESHOLD,
        **kwargs: Any,
    ) -> None:
        self.placer = ReplicaPlacer(make_balancer(balancer, locality_threshold))
        self.in_flight: dict[str, int] = {}
        self._sent: dict[str, str] = {}  # internal request id -> replica name

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        call = call_argument(pending_request)
        if not isinstance(call, EngineCall):
            # Not a call of ours (health and control methods): any replica.
            return [candidate_replicas]
        loads = [EngineLoad(replica_name(r), self._load(r)) for r in candidate_replicas]
        placement = self.placer.place(
            call.program_key, call.prompt_tokens, loads, call.bound_replica, call.avoid
        )
        call.route = placement.route
        call.placed_on = loads[placement.ranked[0]].name
        return [[candidate_replicas[i]] for i in placement.ranked]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        name = replica_id.unique_id
        self._sent[pending_request.metadata.internal_request_id] = name
        self.in_flight[name] = self.in_flight.get(name, 0) + 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        name = self._sent.pop(internal_request_id, None)
        if name is not None:
            self.in_flight[name] = max(0, self.in_flight.get(name, 0) - 1)

    def _load(self, replica: RunningReplica) -> float:
        queued = queue_length(self, replica)
        return queued if queued is not None else self.in_flight.get(replica_name(replica), 0)
