"""The one trust rule (``protocol.trust``): which identity fields only the router
states, and who may state them, as the router, the engine's middleware and the
scheduler each ask it."""

import json

from autellix_vllm.engine.middleware import drop_router_stated, rewrite_body
from autellix_vllm.engine.settings import SchedulerSettings
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.protocol.trust import (
    ROUTER_STATED,
    ROUTER_STATED_HEADERS,
    ROUTER_STATED_XARGS,
    accepted,
    engine_core_trusts,
    may_state_router_fields,
)
from autellix_vllm.router.calls import read_call

KEY = "engine-key-1234"
STATED = CallIdentity(
    "p",
    thread_id="t",
    prior_service=40.0,
    owner="key-alice",
    priority=1,
    weight=3.0,
    router_wait_s=12.5,
)


def test_the_router_stated_fields_are_the_service_owner_band_weight_and_router_wait():
    assert ROUTER_STATED == ("prior_service", "owner", "priority", "weight", "router_wait_s")
    assert ROUTER_STATED_XARGS == (
        "autellix_prior_service",
        "autellix_owner",
        "autellix_priority",
        "autellix_weight",
        "autellix_router_wait_s",
    )
    assert ROUTER_STATED_HEADERS == (
        "X-Autellix-Prior-Service",
        "X-Autellix-Owner",
        "X-Autellix-Priority",
        "X-Autellix-Weight",
        "X-Autellix-Router-Wait",
    )


def test_only_a_holder_of_the_engines_key_may_state_them():
    assert may_state_router_fields(KEY, f"Bearer {KEY}")
    assert may_state_router_fields(KEY, f"bearer {KEY}".encode())  # raw ASGI bytes
    for authorization in (None, "", "Bearer other", KEY, f"Basic {KEY}"):
        assert not may_state_router_fields(KEY, authorization)
    # An engine without a key, or the router's edge: nobody may.
    assert not may_state_router_fields(None, f"Bearer {KEY}")


def test_the_engine_core_trusts_the_callers_vllm_lets_through():
    assert engine_core_trusts(KEY)
    assert not engine_core_trusts(None)
    assert SchedulerSettings.from_env({"AUTELLIX_ENGINE_KEY": KEY}).trusts_router_fields
    assert not SchedulerSettings.from_env({}).trusts_router_fields


def test_accepted_drops_the_router_stated_fields_unless_they_may_be_stated():
    assert accepted(STATED, may_state=True) is STATED
    assert accepted(STATED, may_state=False) == CallIdentity("p", thread_id="t")
    plain = CallIdentity("p", retention_ttl_s=30.0)
    assert accepted(plain, may_state=False) is plain  # nothing to drop: the same object


def test_the_router_takes_them_from_no_client():
    headers = {
        "X-Autellix-Program-Id": "p",
        "X-Autellix-Prior-Service": "1e300",
        "X-Autellix-Owner": "key-victim",
        "X-Autellix-Weight": "1e6",
        "X-Autellix-Router-Wait": "119",  # would buy an earlier band-0 rank
        "Authorization": f"Bearer {KEY}",  # even a client that knows an engine's key
    }
    xargs = {"autellix_owner": "key-victim", "autellix_weight": 50, "autellix_router_wait_s": 99}
    body = {"model": "m", "vllm_xargs": xargs}
    call = read_call("/v1/completions", json.dumps(body).encode(), headers, {"m"}, 4.0)
    assert call.identity == CallIdentity("p")
    assert "vllm_xargs" not in call.body  # nor does the body carry them on


def test_the_middleware_drops_them_from_a_request_that_may_not_state_them():
    headers = [
        (b"x-autellix-program-id", b"p"),
        (b"x-autellix-prior-service", b"40"),
        (b"x-autellix-weight", b"2.5"),
        (b"x-autellix-router-wait", b"30"),
    ]
    body = json.dumps({"model": "m", "vllm_xargs": {"autellix_owner": "o", "k": 1}}).encode()
    trusted = json.loads(rewrite_body(body, headers, may_state_router_fields=True))
    assert trusted["vllm_xargs"] == {
        "k": 1,
        "autellix_owner": "o",
        "autellix_program_id": "p",
        "autellix_prior_service": 40.0,
        "autellix_weight": 2.5,
        "autellix_router_wait_s": 30.0,
    }
    untrusted = json.loads(rewrite_body(body, headers, may_state_router_fields=False))
    assert untrusted["vllm_xargs"] == {"k": 1, "autellix_program_id": "p"}
    # Other JSON routes take vllm_xargs too: the same fields go there.
    assert json.loads(drop_router_stated(body))["vllm_xargs"] == {"k": 1}
