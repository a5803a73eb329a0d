"""Identity headers -> vllm_xargs: parsing, validation and precedence (no vLLM needed)."""

import math

import pytest
from autellix_vllm.protocol import (
    CALL_ID,
    PRIOR_SERVICE,
    PROGRAM_ID,
    THREAD_ID,
    CallIdentity,
    IdentityError,
    identity_from_xargs,
    merge_into_xargs,
    validate_xargs,
    xargs_from_headers,
)


def test_headers_map_to_flat_keys_case_insensitively():
    headers = [
        ("X-Autellix-Program-Id", "p1"),
        ("x-autellix-thread-id", "t1"),
        ("X-AUTELLIX-PARENT-THREAD-ID", "main"),
        ("X-Autellix-Call-Id", "c1"),
        ("X-Autellix-Prior-Service", " 12.5 "),
        ("Content-Type", "application/json"),
    ]
    assert xargs_from_headers(headers) == {
        "autellix_program_id": "p1",
        "autellix_thread_id": "t1",
        "autellix_parent_thread_id": "main",
        "autellix_call_id": "c1",
        "autellix_prior_service": 12.5,
    }


def test_empty_parent_header_means_the_main_thread():
    headers = [("X-Autellix-Thread-Id", "main"), ("X-Autellix-Parent-Thread-Id", "")]
    assert xargs_from_headers(headers) == {"autellix_thread_id": "main"}


def test_no_identity_headers_gives_nothing():
    assert xargs_from_headers([("Authorization", "Bearer x")]) == {}


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
    ],
)
def test_malformed_header_is_rejected_naming_the_header(header, value, message):
    with pytest.raises(IdentityError, match=message) as info:
        xargs_from_headers([(header, value)])
    assert info.value.param == header


def test_id_of_exactly_128_characters_is_accepted():
    assert xargs_from_headers([("X-Autellix-Program-Id", "p" * 128)])[PROGRAM_ID] == "p" * 128


def test_headers_win_over_body_keys_and_other_body_keys_are_kept():
    body = {PROGRAM_ID: "stale", "session_id": "s", "temperature_hint": 3}
    merged = merge_into_xargs(body, {PROGRAM_ID: "fresh", CALL_ID: "c9"})
    assert merged == {PROGRAM_ID: "fresh", CALL_ID: "c9", "session_id": "s", "temperature_hint": 3}
    assert body[PROGRAM_ID] == "stale"  # the input is not mutated


def test_body_keys_are_validated_too():
    validate_xargs({PROGRAM_ID: "ok", PRIOR_SERVICE: 3, "unrelated": [1, 2]})
    with pytest.raises(IdentityError) as info:
        validate_xargs({PRIOR_SERVICE: True})
    assert info.value.param == f"vllm_xargs.{PRIOR_SERVICE}"
    with pytest.raises(IdentityError):
        validate_xargs({THREAD_ID: 7})


def test_engine_side_identity_falls_back_to_session_id():
    assert identity_from_xargs(None, "sess") == CallIdentity(program_id="sess")
    assert identity_from_xargs({PROGRAM_ID: "p"}, "sess").program_id == "p"
    assert identity_from_xargs({}, None) == CallIdentity()


def test_engine_side_identity_ignores_invalid_values_instead_of_failing():
    identity = identity_from_xargs(
        {PROGRAM_ID: "x" * 500, THREAD_ID: "t", PRIOR_SERVICE: -4, CALL_ID: 5}, "sess"
    )
    assert identity == CallIdentity(program_id="sess", thread_id="t")
    assert math.isclose(identity_from_xargs({PRIOR_SERVICE: "2.5"}).prior_service, 2.5)
