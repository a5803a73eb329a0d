"""Reading a call's identity: headers, body keys, session id; writing it on (no vLLM)."""

import math

import pytest
from autellix_vllm.protocol.bearer import holds_key
from autellix_vllm.protocol.identity import (
    CALL_ID,
    PARENT_THREAD_ID,
    PRIOR_SERVICE,
    PROGRAM_ID,
    RETENTION_TTL,
    THREAD_ID,
    CallIdentity,
    IdentityError,
    read_identity,
    validate_ttl,
)


def test_headers_are_read_case_insensitively():
    headers = [
        ("X-Autellix-Program-Id", "p1"),
        ("x-autellix-thread-id", "t1"),
        ("X-AUTELLIX-PARENT-THREAD-ID", "main"),
        ("X-Autellix-Call-Id", "c1"),
        ("X-Autellix-Prior-Service", " 12.5 "),
        ("Content-Type", "application/json"),
    ]
    assert read_identity(headers) == CallIdentity("p1", "t1", "main", "c1", 12.5)


def test_empty_parent_header_means_the_main_thread():
    headers = [("X-Autellix-Thread-Id", "main"), ("X-Autellix-Parent-Thread-Id", "")]
    assert read_identity(headers) == CallIdentity(thread_id="main")


def test_nothing_given_is_no_identity():
    assert read_identity([("Authorization", "Bearer x")], {"unrelated": 1}) == CallIdentity()
    assert read_identity() == CallIdentity()


@pytest.mark.parametrize(
    ("header", "value", "message"),
    [
        ("X-Autellix-Prior-Service", "-1", ">= 0"),
        ("X-Autellix-Prior-Service", "abc", "must be a number"),
        ("X-Autellix-Prior-Service", "nan", "finite"),
        ("X-Autellix-Prior-Service", "inf", "finite"),
        ("X-Autellix-Program-Id", "p" * 129, "limit is 128"),
        ("X-Autellix-Thread-Id", "a\x01b", "control character"),
        ("X-Autellix-Call-Id", "", "must not be empty"),
        ("X-Session-ID", " ", "must not be empty"),
    ],
)
def test_malformed_header_is_rejected_naming_the_header(header, value, message):
    with pytest.raises(IdentityError, match=message) as info:
        read_identity([(header.lower(), value)])
    assert info.value.param == header
    assert info.value.code == "invalid_identity"


def test_id_of_exactly_128_characters_is_accepted():
    assert read_identity([("X-Autellix-Program-Id", "p" * 128)]).program_id == "p" * 128


def test_precedence_is_header_then_body_key_then_session_id():
    xargs = {PROGRAM_ID: "body", CALL_ID: "body-call", "other": [1]}
    header = [("X-Autellix-Program-Id", "header"), ("X-Session-ID", "session-header")]
    assert read_identity(header, xargs, "session-body").program_id == "header"
    from_body = read_identity([("X-Session-ID", "session-header")], xargs, "session-body")
    assert (from_body.program_id, from_body.call_id) == ("body", "body-call")
    assert read_identity([("X-Session-ID", "s")], {}, "session-body").program_id == "s"
    assert read_identity([], None, "session-body").program_id == "session-body"


def test_body_keys_are_validated_naming_the_key():
    read_identity([], {PROGRAM_ID: "ok", PRIOR_SERVICE: 3, "unrelated": [1, 2]})
    with pytest.raises(IdentityError) as info:
        read_identity([], {PRIOR_SERVICE: True})
    assert info.value.param == f"vllm_xargs.{PRIOR_SERVICE}"
    with pytest.raises(IdentityError):
        read_identity([], {THREAD_ID: 7})
    with pytest.raises(IdentityError) as info:
        read_identity([], {}, 42)
    assert info.value.param == "session_id"


def test_strict_rejects_a_malformed_value_even_where_a_header_overrides_it():
    with pytest.raises(IdentityError) as info:
        read_identity([("X-Autellix-Call-Id", "c")], {CALL_ID: "x" * 200})
    assert info.value.param == f"vllm_xargs.{CALL_ID}"


def test_a_vllm_xargs_that_is_not_a_dict_is_left_to_vllm():
    assert read_identity([], ["not", "a", "dict"], "s") == CallIdentity(program_id="s")


def test_a_malformed_body_value_is_rejected_even_where_a_header_overrides_it():
    with pytest.raises(IdentityError) as info:
        read_identity([("X-Autellix-Program-Id", "p")], {PROGRAM_ID: "x" * 500}, "sess")
    assert info.value.param == f"vllm_xargs.{PROGRAM_ID}"
    service = read_identity([], {PRIOR_SERVICE: "2.5"}).prior_service
    assert math.isclose(service, 2.5)


def test_as_xargs_and_as_headers_have_the_parts_that_are_set():
    identity = CallIdentity(program_id="p", parent_thread_id="main", prior_service=0.0)
    assert identity.as_xargs() == {PROGRAM_ID: "p", PARENT_THREAD_ID: "main", PRIOR_SERVICE: 0.0}
    assert identity.as_headers() == {
        "X-Autellix-Program-Id": "p",
        "X-Autellix-Parent-Thread-Id": "main",
        "X-Autellix-Prior-Service": "0.0",
    }


def test_an_identity_read_back_from_its_headers_or_its_xargs_is_itself():
    identity = CallIdentity("p", "t", "main", "c", 12.5, 30.0)
    assert read_identity(identity.as_headers().items()) == identity
    assert read_identity(xargs=identity.as_xargs()) == identity


# ---- retention TTLs and the body's agent_hint ----------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(30, 30.0), (2.5, 2.5), (0, 0.0), ("30", 30.0), (" 12.5 ", 12.5), ("30s", 30.0),
     ("5m", 300.0), ("1h", 3600.0), ("1.5H", 5400.0), (".5s", 0.5), ("2 m", 120.0),
     ("1e3", 1000.0)],
)  # fmt: skip
def test_a_ttl_is_seconds_or_a_duration_with_a_unit(value, seconds):
    assert validate_ttl(value, "ttl") == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [(-1, ">= 0"), ("-3", ">= 0"), (math.inf, "finite"), ("nan", "finite"), (10**400, "finite"),
     (True, "number of seconds"), (None, "number of seconds"), ([30], "number of seconds"),
     ("5d", "duration"), ("-3s", "duration"), ("", "duration"), ("s", "duration")],
)  # fmt: skip
def test_a_malformed_ttl_is_rejected_naming_it(value, message):
    with pytest.raises(IdentityError, match=message) as info:
        validate_ttl(value, "agent_hint.cache_control.ttl")
    assert info.value.param == "agent_hint.cache_control.ttl"


def test_the_retention_ttl_comes_from_header_then_body_key_then_agent_hint():
    hint = {"cache_control": {"ttl": "5m"}}
    header = [("X-Autellix-Retention-Ttl", "20")]
    assert read_identity(header, {RETENTION_TTL: 40}, agent_hint=hint).retention_ttl_s == 20
    assert read_identity([], {RETENTION_TTL: "40s"}, agent_hint=hint).retention_ttl_s == 40
    assert read_identity([], {}, agent_hint=hint).retention_ttl_s == 300
    assert read_identity().retention_ttl_s is None
    assert CallIdentity(retention_ttl_s=7.0).as_xargs() == {RETENTION_TTL: 7.0}


def test_an_agent_hint_names_the_program_and_a_subagents_thread():
    main = {"session_id": "sess-1", "cache_control": {"type": "ephemeral", "ttl": 30}}
    assert read_identity(agent_hint=main) == CallIdentity(program_id="sess-1", retention_ttl_s=30)
    sub = {"session_id": "sub-7", "parent_session_id": "sess-1", "other": {"x": 1}}
    assert read_identity(agent_hint=sub) == CallIdentity("sess-1", "sub-7", "main")
    # A parent without a session of its own: the parent's program, main thread.
    orphan = {"parent_session_id": "sess-1"}
    assert read_identity(agent_hint=orphan) == CallIdentity(program_id="sess-1")


def test_an_agent_hint_comes_after_every_other_identity():
    sub = {"session_id": "sub-7", "parent_session_id": "sess-1"}
    for headers, xargs, session_id in (
        ([("X-Autellix-Program-Id", "ours")], None, None),
        ([], {PROGRAM_ID: "ours"}, None),
        ([("X-Session-ID", "ours")], None, None),
        ([], None, "ours"),
    ):
        identity = read_identity(headers, xargs, session_id, agent_hint=sub)
        assert identity == CallIdentity(program_id="ours"), (headers, xargs, session_id)
    # The same program named both ways: the hint's thread still counts.
    same = read_identity([("X-Session-ID", "sess-1")], agent_hint=sub)
    assert same == CallIdentity("sess-1", "sub-7", "main")
    # Our own thread header wins over the hint's thread.
    ours = read_identity([("X-Autellix-Thread-Id", "t")], agent_hint=sub)
    assert ours == CallIdentity(program_id="sess-1", thread_id="t")


@pytest.mark.parametrize(
    ("hint", "param"),
    [("sess-1", "agent_hint"), ({"session_id": 7}, "agent_hint.session_id"),
     ({"session_id": "s", "parent_session_id": ""}, "agent_hint.parent_session_id"),
     ({"cache_control": "5m"}, "agent_hint.cache_control"),
     ({"cache_control": {"ttl": "soon"}}, "agent_hint.cache_control.ttl"),
     ({"cache_control": {"ttl": -5}}, "agent_hint.cache_control.ttl")],
)  # fmt: skip
def test_a_malformed_agent_hint_is_rejected_naming_it(hint, param):
    with pytest.raises(IdentityError) as info:
        read_identity([], None, "s", agent_hint=hint)
    assert (info.value.param, info.value.code) == (param, "invalid_identity")


def test_a_malformed_retention_header_is_rejected_naming_it():
    with pytest.raises(IdentityError) as info:
        read_identity([("x-autellix-retention-ttl", "forever")])
    assert info.value.param == "X-Autellix-Retention-Ttl"


# ---- one encoding rule: header values are UTF-8 -------------------------------------


def test_raw_header_bytes_and_aiohttp_text_read_the_same_id():
    raw = "é🙂-ïd".encode()
    as_aiohttp_decodes = raw.decode("utf-8", "surrogateescape")
    from_engine = read_identity([(b"x-autellix-program-id", raw)])
    from_router = read_identity([("X-Autellix-Program-Id", as_aiohttp_decodes)])
    assert from_engine == from_router == CallIdentity(program_id="é🙂-ïd")


@pytest.mark.parametrize("raw", ["ïd".encode("latin-1"), b"\xff\xfe", b"ok\xc3"])
def test_header_bytes_that_are_not_utf8_are_malformed_on_both_sides(raw):
    for headers in (
        [(b"x-autellix-thread-id", raw)],
        [("X-Autellix-Thread-Id", raw.decode("utf-8", "surrogateescape"))],
    ):
        with pytest.raises(IdentityError, match="not valid UTF-8") as info:
            read_identity(headers)
        assert info.value.param == "X-Autellix-Thread-Id"


def test_holds_key_reads_a_bearer_header_as_vllm_does():
    assert holds_key("Bearer s3cret", "s3cret")
    assert holds_key(b"bearer s3cret", "s3cret")
    assert holds_key("Bearer clé", "clé")
    for value in (None, "", "s3cret", "Bearer", "Bearer s3cre", "Bearer s3cret ", "Basic s3cret"):
        assert not holds_key(value, "s3cret"), value
