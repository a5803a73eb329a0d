"""The wire contract: the SDK's copies of it match, and both servers send one error shape."""

import json

import autellix
import pytest
from autellix import _programs_api, _tagging
from autellix_vllm.engine.middleware import IdentityMiddleware
from autellix_vllm.protocol import identity, paths
from autellix_vllm.protocol.openai_errors import error_body
from autellix_vllm.router.calls import read_call
from autellix_vllm.router.errors import ApiError
from autellix_vllm.router.middlewares import error_response
from multidict import CIMultiDict


def test_the_sdk_speaks_the_protocol():
    """The SDK keeps its own constants (it must import without the server package)."""
    assert _tagging.PROGRAM_ID_HEADER == identity.PROGRAM_ID_HEADER
    assert _tagging.THREAD_ID_HEADER == identity.THREAD_ID_HEADER
    assert _tagging.PARENT_THREAD_ID_HEADER == identity.PARENT_THREAD_ID_HEADER
    assert _tagging.CALL_ID_HEADER == identity.CALL_ID_HEADER
    assert _tagging.SESSION_ID_HEADER == identity.SESSION_ID_HEADER
    assert _tagging.RETENTION_TTL_HEADER == identity.RETENTION_TTL_HEADER
    assert autellix.RETENTION_TTL_HEADER == identity.RETENTION_TTL_HEADER
    assert _programs_api.PROGRAMS_PATH == paths.PROGRAMS_PATH
    assert autellix.PROGRAM_ID_HEADER == identity.PROGRAM_ID_HEADER


def test_every_identity_field_has_a_header_and_a_vllm_xargs_key():
    fields = set(identity.CallIdentity.__dataclass_fields__)
    assert set(identity.IDENTITY_HEADERS) == set(identity.IDENTITY_XARGS) == fields
    assert all(key.startswith("autellix_") for key in identity.IDENTITY_XARGS.values())


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (404, "invalid_request_error"),
     (502, "server_error"), (503, "server_error")],
)  # fmt: skip
def test_error_body_is_openais_shape(status, error_type):
    assert error_body(status, "msg", "some_code", "p") == {
        "error": {"message": "msg", "type": error_type, "param": "p", "code": "some_code"}
    }


@pytest.mark.parametrize(
    ("header", "extra", "param"),
    [
        (("X-Autellix-Prior-Service", "-3"), {}, "X-Autellix-Prior-Service"),
        (("X-Autellix-Retention-Ttl", "5d"), {}, "X-Autellix-Retention-Ttl"),
        (
            ("X-Other", "x"),
            {"agent_hint": {"session_id": "s", "cache_control": {"ttl": -1}}},
            "agent_hint.cache_control.ttl",
        ),
    ],
)
async def test_router_and_engine_answer_a_malformed_identity_alike(header, extra, param):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    raw = json.dumps(body).encode()

    with pytest.raises(ApiError) as caught:
        read_call("/v1/chat/completions", raw, CIMultiDict([header]), {"m"}, 4.0)
    from_router = error_response(caught.value)

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    async def never_reached(scope, receive, send):
        raise AssertionError("the middleware forwarded a malformed call")

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"content-type", b"application/json"), tuple(h.encode() for h in header)],
    }
    await IdentityMiddleware(never_reached)(scope, receive, send)

    assert sent[0]["status"] == from_router.status == 400
    assert json.loads(sent[1]["body"]) == json.loads(from_router.body)
    assert json.loads(from_router.body)["error"]["code"] == "invalid_identity"
    assert json.loads(from_router.body)["error"]["param"] == param
