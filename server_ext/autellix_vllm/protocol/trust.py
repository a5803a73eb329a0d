"""Who may state what: the one trust rule of the router, the engine and its scheduler.

Most of a call's identity is the client's to say (its program, thread, call
id, retention hint). Five parts are not (:data:`ROUTER_STATED`): the program's
prior service (how much the other engines served it, which ranks it), its
owner (whose fair share of service and of held KV it draws on), its band
(its priority class: a client may ask for one, and the router states the one
its key allows), its owner's weight (how large that fair share is) and the
router wait (how long the router's gate held the call: a worse band's call
ranks as band 0 that much sooner). The router states them itself, from its
own table, keys and gate, and sends them to the engine with the engine key.

The rule, in one predicate (:func:`may_state_router_fields`): a request may
state them only to an engine that has a key, and only when it carries that key
(``Authorization: Bearer <key>``). So:

* the router's edge takes them from no client (a client never reaches an
  engine key through the router): it drops the client's and states its own;
* the engine's middleware asks per request, with the request's
  ``Authorization``, and drops them from the headers and from the body of a
  request that may not state them;
* the scheduler cannot see the caller (vLLM drops headers before the engine
  core), so it asks for the callers that reach it: on an engine with a key,
  vLLM's own ``--api-key`` check admitted only the key's holders, and on an
  engine without one, nobody may state them.

:func:`accepted` applies the answer to an identity.
"""

from __future__ import annotations

from dataclasses import replace

from autellix_vllm.protocol.bearer import holds_key
from autellix_vllm.protocol.identity import IDENTITY_HEADERS, IDENTITY_XARGS, CallIdentity

ROUTER_STATED = ("prior_service", "owner", "priority", "weight", "router_wait_s")
"""The :class:`~autellix_vllm.protocol.identity.CallIdentity` fields only the router states."""
ROUTER_STATED_XARGS = tuple(IDENTITY_XARGS[field] for field in ROUTER_STATED)
"""Their ``vllm_xargs`` keys."""
ROUTER_STATED_HEADERS = tuple(IDENTITY_HEADERS[field] for field in ROUTER_STATED)
"""Their headers."""


def may_state_router_fields(engine_key: str | None, authorization: str | bytes | None) -> bool:
    """Whether a request with this ``Authorization`` header value may state the
    router-stated fields to an engine whose key is ``engine_key`` (None: an
    engine without a key, or the router's edge, which takes them from no one)."""
    return engine_key is not None and holds_key(authorization, engine_key)


def engine_core_trusts(engine_key: str | None) -> bool:
    """Whether the requests that reach an engine's scheduler may state the
    router-stated fields: :func:`may_state_router_fields` for the only callers
    vLLM lets through to it, those holding the engine's key if it has one."""
    return may_state_router_fields(engine_key, _bearer(engine_key))


def accepted(identity: CallIdentity, may_state: bool) -> CallIdentity:
    """``identity`` as a hop accepts it: without the router-stated fields unless
    the request ``may_state`` them (the same object when nothing is dropped)."""
    if may_state or all(getattr(identity, field) is None for field in ROUTER_STATED):
        return identity
    return replace(identity, **dict.fromkeys(ROUTER_STATED))


def _bearer(key: str | None) -> str | None:
    return None if key is None else f"Bearer {key}"
