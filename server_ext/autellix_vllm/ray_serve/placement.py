"""Placing a call on an engine replica with the project's balancers.

The rule itself lives in :mod:`autellix_vllm.policy.routing` (the paper's
locality rule by default: a long call goes to its program's replica, bound on
first use to the least-loaded one; a short call to the least-loaded). This
module only turns the balancer's one choice into the ranking Ray Serve's
request router returns: the choice first, then the other replicas by load,
so that a full replica (Serve's backpressure) falls back to the next.

A program's binding is kept in one place, the global table (``directory``),
since calls of one program may enter through different ingress replicas: the
binding the table holds is adopted before each choice and forgotten after it,
so the balancer keeps nothing per program here and needs no cleanup when a
program ends. A binding to a replica that is no longer offered (dead, drained)
is replaced by the balancer's rule, and the new one reaches the table with the
call's report. Until that report lands (the ingress sends reports in batches),
a parallel call of a program that has no binding yet may bind elsewhere; the
later report wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autellix_vllm.policy.routing import Balancer, EngineLoad, Route


@dataclass(frozen=True)
class Placement:
    """Indices into the offered replicas, best first, and the balancer's route."""

    ranked: list[int]
    route: Route


class ReplicaPlacer:
    """Ranks engine replicas for calls with one :class:`Balancer`."""

    def __init__(self, balancer: Balancer) -> None:
        self.balancer = balancer

    def place(
        self,
        program_key: str,
        prompt_tokens: int,
        replicas: Sequence[EngineLoad],
        bound: str | None = None,
        avoid: Sequence[str] = (),
    ) -> Placement:
        """Rank ``replicas`` (non-empty) for a call of ``program_key``.

        ``bound``: the replica the table says the program is bound to.
        ``avoid``: replicas that failed this call already; they are ranked last
        (still offered: Serve may not yet know they died, and the last replica
        standing is better than none).
        """
        if not replicas:
            raise ValueError("no replica to place a call on")
        if bound is not None:
            self.balancer.adopt(program_key, bound)
        usable = [i for i, r in enumerate(replicas) if r.name not in avoid] or list(
            range(len(replicas))
        )
        offered = [replicas[i] for i in usable]
        try:
            route = self.balancer.choose(program_key, prompt_tokens, offered)
        finally:
            self.balancer.forget(program_key)
        first = usable[route.index]
        rest = sorted(
            (i for i in range(len(replicas)) if i != first),
            key=lambda i: (replicas[i].name in avoid, replicas[i].load),
        )
        return Placement([first, *rest], Route(first, route.reason, route.binds))
