"""The identity middleware at the ASGI level, in front of a recording app."""

import json
import logging

import pytest
from autellix_vllm.engine.middleware import IdentityMiddleware
from autellix_vllm.protocol.openai_errors import error_body
from autellix_vllm.router.calls import read_call
from autellix_vllm.router.errors import ApiError


class RecordingApp:
    """Stands behind the middleware and remembers what reached it."""

    def __init__(self):
        self.calls = []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.calls.append((scope, body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(app, body: bytes, headers=(), path="/v1/chat/completions", method="POST", chunks=1):
    """``headers``: (name, value) pairs, the value text (sent as UTF-8) or raw bytes."""
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(b"content-type", b"application/json")]
        + [(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in headers]
        + [(b"content-length", str(len(body)).encode())],
    }
    size = max(1, -(-len(body) // chunks))
    pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    messages = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        for i, piece in enumerate(pieces)
    ]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    sent = []

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    status = sent[0]["status"]
    return status, b"".join(m.get("body", b"") for m in sent[1:])


@pytest.fixture
def inner():
    return RecordingApp()


@pytest.fixture
def app(inner, monkeypatch):
    """An engine without a key (a development setup)."""
    monkeypatch.delenv("AUTELLIX_ENGINE_KEY", raising=False)
    return IdentityMiddleware(inner)


KEY = "engine-secret"
AUTHORIZED = ("Authorization", f"Bearer {KEY}")


@pytest.fixture
def keyed_app(inner, monkeypatch):
    """An engine started with a key."""
    monkeypatch.setenv("AUTELLIX_ENGINE_KEY", KEY)
    return IdentityMiddleware(inner)


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_headers_are_copied_into_vllm_xargs(keyed_app, inner):
    app = keyed_app
    headers = [("X-Autellix-Program-Id", "p1"), ("X-Autellix-Prior-Service", "7"), AUTHORIZED]
    status, _ = await call(app, json.dumps(BODY).encode(), headers, chunks=3)
    assert status == 200
    scope, body = inner.calls[0]
    forwarded = json.loads(body)
    assert forwarded["vllm_xargs"] == {"autellix_program_id": "p1", "autellix_prior_service": 7.0}
    assert forwarded["messages"] == BODY["messages"]
    lengths = [v for k, v in scope["headers"] if k == b"content-length"]
    assert lengths == [str(len(body)).encode()]


async def test_headers_win_and_other_body_xargs_survive(app, inner):
    body = {**BODY, "vllm_xargs": {"autellix_program_id": "old", "mine": 1}}
    await call(app, json.dumps(body).encode(), [("X-Autellix-Program-Id", "new")])
    forwarded = json.loads(inner.calls[0][1])
    assert forwarded["vllm_xargs"] == {"autellix_program_id": "new", "mine": 1}


async def test_request_without_headers_passes_through_byte_for_byte(app, inner):
    raw = b'{"model": "m",   "prompt": "x"}'
    await call(app, raw, path="/v1/completions")
    assert inner.calls[0][1] == raw


async def test_malformed_header_gets_openai_400_and_is_not_forwarded(app, inner):
    status, content = await call(
        app, json.dumps(BODY).encode(), [("X-Autellix-Prior-Service", "-2")]
    )
    assert status == 400
    error = json.loads(content)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "X-Autellix-Prior-Service"
    assert error["code"] == "invalid_identity"
    assert ">= 0" in error["message"]
    assert inner.calls == []


async def test_the_session_id_becomes_the_program_id_the_scheduler_reads(app, inner):
    await call(app, json.dumps(BODY).encode(), [("X-Session-ID", "from-header")])
    body = {**BODY, "session_id": "from-body"}
    await call(app, json.dumps(body).encode())
    forwarded = [json.loads(raw)["vllm_xargs"] for _, raw in inner.calls]
    assert forwarded == [
        {"autellix_program_id": "from-header"},
        {"autellix_program_id": "from-body"},
    ]


async def test_the_retention_hint_is_copied_into_vllm_xargs_from_anyone(app, inner):
    """Not a priority field: an engine without the caller's key takes it all the same."""
    await call(app, json.dumps(BODY).encode(), [("X-Autellix-Retention-Ttl", "90s")])
    body = {**BODY, "agent_hint": {"session_id": "s", "cache_control": {"ttl": "2m"}}}
    await call(app, json.dumps(body).encode(), [("X-Autellix-Program-Id", "p")])
    forwarded = [json.loads(raw)["vllm_xargs"] for _, raw in inner.calls]
    assert forwarded == [
        {"autellix_retention_ttl_s": 90.0},
        {"autellix_program_id": "p", "autellix_retention_ttl_s": 120.0},
    ]


async def test_an_agent_hint_becomes_the_identity_the_scheduler_reads(app, inner):
    hint = {"session_id": "sub-7", "parent_session_id": "sess-1"}
    body = {**BODY, "agent_hint": hint}
    await call(app, json.dumps(body).encode())
    forwarded = json.loads(inner.calls[0][1])
    assert forwarded["vllm_xargs"] == {
        "autellix_program_id": "sess-1",
        "autellix_thread_id": "sub-7",
        "autellix_parent_thread_id": "main",
    }
    assert forwarded["agent_hint"] == hint  # the client's field is left as it came


@pytest.mark.parametrize(
    ("hint", "param"),
    [
        ({"session_id": 7}, "agent_hint.session_id"),
        ({"session_id": "s", "cache_control": {"ttl": "a while"}}, "agent_hint.cache_control.ttl"),
        ({"session_id": "s", "cache_control": {"ttl": -1}}, "agent_hint.cache_control.ttl"),
        (["s"], "agent_hint"),
    ],
)
async def test_a_malformed_agent_hint_gets_400_and_is_not_forwarded(app, inner, hint, param):
    body = {**BODY, "agent_hint": hint}
    status, content = await call(app, json.dumps(body).encode())
    assert status == 400
    error = json.loads(content)["error"]
    assert (error["param"], error["code"]) == (param, "invalid_identity")
    assert inner.calls == []


async def test_body_already_holding_its_identity_passes_through_byte_for_byte(app, inner):
    raw = json.dumps({**BODY, "vllm_xargs": {"autellix_program_id": "p"}}).encode()
    await call(app, raw, [("X-Autellix-Program-Id", "p")])
    assert inner.calls[0][1] == raw


async def test_malformed_body_identity_gets_400(app, inner):
    body = {**BODY, "vllm_xargs": {"autellix_thread_id": "x" * 200}}
    status, content = await call(app, json.dumps(body).encode())
    assert status == 400
    assert json.loads(content)["error"]["param"] == "vllm_xargs.autellix_thread_id"
    assert inner.calls == []


async def test_other_paths_and_unparsable_bodies_are_left_to_vllm(app, inner):
    header = [("X-Autellix-Program-Id", "p" * 500)]  # would be a 400 on a generation path
    status, _ = await call(app, b'{"x": 1}', header, path="/tokenize")
    assert status == 200
    status, _ = await call(app, b"not json", [("X-Autellix-Program-Id", "p")])
    assert status == 200
    status, _ = await call(app, b"", header, path="/health", method="GET")
    assert status == 200
    assert [body for _, body in inner.calls] == [b'{"x": 1}', b"not json", b""]
    status, _ = await call(app, b"not json", header)  # a malformed header is still a 400
    assert status == 400


# ---- the prior service and the owner: only from the key's holder ---------------------

PRIOR = ("X-Autellix-Prior-Service", "1e300")
OWNER = ("X-Autellix-Owner", "key-router-said")
BODY_WITH_PRIOR = {
    **BODY,
    "vllm_xargs": {"autellix_prior_service": 1e300, "autellix_owner": "key-x", "mine": 1},
}


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-key", f"Basic {KEY}", f"Bearer {KEY}x"],
)
async def test_a_keyed_engine_drops_prior_service_from_callers_without_its_key(
    keyed_app, inner, authorization
):
    headers = [("X-Autellix-Program-Id", "victim"), PRIOR, OWNER]
    if authorization:
        headers.append(("Authorization", authorization))
    await call(keyed_app, json.dumps(BODY_WITH_PRIOR).encode(), headers)
    forwarded = json.loads(inner.calls[0][1])
    assert forwarded["vllm_xargs"] == {"autellix_program_id": "victim", "mine": 1}


async def test_a_keyed_engine_takes_prior_service_from_its_key_holder(keyed_app, inner):
    headers = [PRIOR, OWNER, ("Authorization", f"bearer {KEY}")]  # any scheme case, as vLLM
    await call(keyed_app, json.dumps(BODY_WITH_PRIOR).encode(), headers)
    forwarded = json.loads(inner.calls[0][1])["vllm_xargs"]
    assert forwarded["autellix_prior_service"] == 1e300
    assert forwarded["autellix_owner"] == "key-router-said"  # the header wins


async def test_a_keyed_engine_takes_a_band_only_from_its_key_holder(keyed_app, inner):
    band = ("X-Autellix-Priority", "batch")
    await call(keyed_app, json.dumps(BODY).encode(), [band])
    assert "autellix_priority" not in json.loads(inner.calls[0][1]).get("vllm_xargs", {})
    await call(keyed_app, json.dumps(BODY).encode(), [band, ("Authorization", f"Bearer {KEY}")])
    assert json.loads(inner.calls[1][1])["vllm_xargs"]["autellix_priority"] == 1


async def test_a_keyed_engine_takes_the_router_wait_only_from_its_key_holder(keyed_app, inner):
    """A client stating a wait would rank as band 0 sooner: only the router may."""
    wait = ("X-Autellix-Router-Wait", "42.5")
    forged = {**BODY, "vllm_xargs": {"autellix_router_wait_s": 100}}
    await call(keyed_app, json.dumps(forged).encode(), [wait])
    await call(keyed_app, json.dumps(BODY).encode(), [wait, AUTHORIZED])
    untrusted, trusted = (json.loads(body).get("vllm_xargs", {}) for _, body in inner.calls)
    assert "autellix_router_wait_s" not in untrusted
    assert trusted["autellix_router_wait_s"] == 42.5


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "1e999", "later"])
async def test_a_malformed_router_wait_is_the_routers_400_trusted_or_not(keyed_app, inner, bad):
    headers = {"X-Autellix-Router-Wait": bad}
    with pytest.raises(ApiError) as at_router:
        read_call("/v1/chat/completions", json.dumps(BODY).encode(), headers, {"m"}, 4.0)
    e = at_router.value
    expected = (400, error_body(400, e.message, e.code, e.param))
    assert e.param == "X-Autellix-Router-Wait"
    for extra in ([], [AUTHORIZED]):
        status, content = await call(
            keyed_app, json.dumps(BODY).encode(), [*headers.items(), *extra]
        )
        assert (status, json.loads(content)) == expected
    assert inner.calls == []


async def test_the_bodys_priority_is_a_band_from_the_key_holder_and_never_reaches_vllm(
    keyed_app, inner
):
    """vLLM's ``priority`` field asks for a band by the header's rule; vLLM gets neither."""
    body = json.dumps({**BODY, "priority": 1}).encode()
    await call(keyed_app, body, [AUTHORIZED])
    await call(keyed_app, body, [AUTHORIZED, ("X-Autellix-Priority", "3")])  # the header wins
    await call(keyed_app, body)  # not the key's holder: no band
    trusted, header_won, untrusted = (json.loads(b) for _, b in inner.calls)
    assert "priority" not in trusted and "priority" not in untrusted
    assert trusted["vllm_xargs"]["autellix_priority"] == 1
    assert header_won["vllm_xargs"]["autellix_priority"] == 3
    assert "autellix_priority" not in untrusted.get("vllm_xargs", {})


async def test_a_priority_that_is_no_band_is_the_routers_400(app, inner):
    raw = json.dumps({**BODY, "priority": -1}).encode()
    status, content = await call(app, raw)
    with pytest.raises(ApiError) as at_router:
        read_call("/v1/chat/completions", raw, {}, {"m"}, 4.0)
    e = at_router.value
    assert (status, json.loads(content)) == (400, error_body(400, e.message, e.code, e.param))
    assert inner.calls == []


async def test_an_engine_without_a_key_takes_no_prior_service_from_anyone(app, inner):
    await call(app, json.dumps(BODY_WITH_PRIOR).encode(), [PRIOR, OWNER, AUTHORIZED])
    assert json.loads(inner.calls[0][1])["vllm_xargs"] == {"mine": 1}


async def test_a_malformed_prior_service_is_a_400_trusted_or_not(app, inner):
    status, content = await call(
        app, json.dumps(BODY).encode(), [("X-Autellix-Prior-Service", "x")]
    )
    assert status == 400 and json.loads(content)["error"]["param"] == "X-Autellix-Prior-Service"


async def test_prior_service_is_dropped_on_other_routes_that_take_vllm_xargs(app, inner):
    # vLLM's Anthropic route hands vllm_xargs to the scheduler too.
    raw = json.dumps({"model": "m", "vllm_xargs": {"autellix_prior_service": 5}}).encode()
    await call(app, raw, path="/v1/messages")
    untouched = b'{"model": "m",  "max_tokens": 3}'
    await call(app, untouched, path="/v1/messages")
    bodies = [body for _, body in inner.calls]
    assert json.loads(bodies[0]) == {"model": "m", "vllm_xargs": {}}
    assert bodies[1] == untouched


# ---- one encoding rule for identity headers ----------------------------------------


async def test_identity_headers_are_utf8_as_on_the_router(app, inner):
    await call(app, json.dumps(BODY).encode(), [("X-Autellix-Program-Id", "é🙂-naïve")])
    assert json.loads(inner.calls[0][1])["vllm_xargs"] == {"autellix_program_id": "é🙂-naïve"}


async def test_a_header_that_is_not_utf8_is_a_400(app, inner):
    latin1 = "naïve".encode("latin-1")
    status, content = await call(
        app, json.dumps(BODY).encode(), [("X-Autellix-Program-Id", latin1)]
    )
    assert status == 400
    error = json.loads(content)["error"]
    assert (error["param"], error["code"]) == ("X-Autellix-Program-Id", "invalid_identity")
    assert "UTF-8" in error["message"]
    assert inner.calls == []


# ---- bodies that cannot be parsed ----------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
async def test_a_body_nested_too_deeply_is_one_400_and_one_log_line(app, inner, caplog, path):
    with caplog.at_level(logging.WARNING, logger="autellix_vllm.engine.middleware"):
        status, content = await call(app, b"[" * 100_000, path=path)
    assert status == 400
    error = json.loads(content)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_json")
    assert [record.exc_info for record in caplog.records] == [None]  # one line, no traceback
    assert inner.calls == []


# ---- error answers: one shape, streams untouched ------------------------------------


class Answering:
    """An app that answers with the given ASGI messages, noting when each was sent."""

    def __init__(self, status, headers, bodies, raises=None):
        self.status, self.headers, self.bodies, self.raises = status, headers, bodies, raises

    async def __call__(self, scope, receive, send):
        if self.raises is not None:
            raise self.raises
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        for i, body in enumerate(self.bodies):
            await send(
                {"type": "http.response.body", "body": body, "more_body": i < len(self.bodies) - 1}
            )


async def answered(inner, method="GET"):
    """(the messages the middleware sent, and how many it had sent when each of
    the inner app's body messages went out)."""
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": method, "path": "/v1/models", "headers": []}
    await IdentityMiddleware(inner)(scope, receive, send)
    return sent


def answer_of(sent):
    headers = dict(sent[0]["headers"])
    body = b"".join(m.get("body", b"") for m in sent[1:])
    assert headers[b"content-length"] == str(len(body)).encode()
    return sent[0]["status"], headers, json.loads(body)


JSON = [(b"content-type", b"application/json")]


async def test_vllms_error_bodies_are_rewritten_into_our_shape(monkeypatch):
    monkeypatch.delenv("AUTELLIX_ENGINE_KEY", raising=False)
    unauthorized = Answering(
        401, JSON + [(b"www-authenticate", b"Bearer")], [b'{"error":"Unau', b'thorized"}']
    )
    status, headers, body = answer_of(await answered(unauthorized))
    assert status == 401 and headers[b"www-authenticate"] == b"Bearer"  # other headers kept
    assert body["error"] == {
        "message": "Unauthorized",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_api_key",
    }
    message = "max_tokens must be at least 1"
    vllm_400 = {
        "error": {"message": message, "type": "BadRequestError", "param": "max_tokens", "code": 400}
    }
    status, _, body = answer_of(
        await answered(Answering(400, JSON, [json.dumps(vllm_400).encode()]))
    )
    assert status == 400
    assert body["error"] == {
        "message": message,
        "type": "invalid_request_error",
        "param": "max_tokens",
        "code": "invalid_request",
    }
    plain = Answering(500, [(b"content-type", b"text/plain")], [b"Internal Server Error"])
    status, headers, body = answer_of(await answered(plain))
    assert (status, headers[b"content-type"]) == (500, b"application/json")
    assert body["error"]["code"] == "internal_error"
    assert body["error"]["message"] == "Internal Server Error"


async def test_streams_and_successes_pass_through_message_by_message(monkeypatch):
    monkeypatch.delenv("AUTELLIX_ENGINE_KEY", raising=False)
    events = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
    stream = Answering(200, [(b"content-type", b"text/event-stream")], events)
    sent = await answered(stream)
    assert [m.get("body") for m in sent[1:]] == events  # not buffered, not changed
    # An error answered as a stream (not vLLM's way) is not buffered either.
    sent = await answered(Answering(400, [(b"content-type", b"text/event-stream")], events))
    assert [m.get("body") for m in sent[1:]] == events
    # HEAD answers have no body to rewrite.
    sent = await answered(Answering(404, JSON, [b""]), method="HEAD")
    assert sent[1]["body"] == b""


async def test_an_exception_before_any_answer_is_a_500_in_our_shape(monkeypatch):
    monkeypatch.delenv("AUTELLIX_ENGINE_KEY", raising=False)
    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": []}
    with pytest.raises(RuntimeError):  # raised on, so that the server logs it
        await IdentityMiddleware(Answering(200, [], [], raises=RuntimeError("boom")))(
            scope, None, send
        )
    status, _, body = answer_of(sent)
    assert status == 500 and body["error"]["code"] == "internal_error"


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-8-sig"])
async def test_a_body_without_vllm_xargs_keeps_its_bytes_and_gains_the_identity(inner, encoding):
    text = '  {"model": "m",  "messages": [{"role": "user", "content": "h\\u00e9 \u00e9"}]}'
    raw = text.encode(encoding)
    status, _ = await call(IdentityMiddleware(inner), raw, [("X-Autellix-Program-Id", "p")])
    assert status == 200
    scope, forwarded = inner.calls[0]
    assert json.loads(forwarded) == {**json.loads(raw), "vllm_xargs": {"autellix_program_id": "p"}}
    if encoding == "utf-8":  # spliced in: the client's bytes follow as they came
        assert forwarded.endswith(text.strip()[1:].encode())
    assert dict(scope["headers"])[b"content-length"] == str(len(forwarded)).encode()
