"""A key's priority class and weight: the keys file gives them, a client may
lower its call's class (by header, ``vllm_xargs`` or the body's own
``priority``) but never raise it past its key's, the router states the class
and the weight, and lists and measures by them."""

from __future__ import annotations

import json

import pytest
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.router.admission import admit
from autellix_vllm.router.calls import read_call
from autellix_vllm.router.errors import ApiError
from autellix_vllm.router.keys import KeyRing, load_api_keys, owner_of
from autellix_vllm.router.metrics import RouterMetrics
from autellix_vllm.router.programs import ProgramTable
from multidict import CIMultiDict

KEYS = """\
chat: sk-chat
nightly: sk-nightly class=batch
evals: sk-evals class=batch max-class=interactive
bands: sk-bands class=5 max-class=2
"""


def clients(tmp_path):
    path = tmp_path / "keys"
    path.write_text(KEYS)
    ring = KeyRing.build(None, load_api_keys(path))
    return {
        name: ring.client_for(f"Bearer sk-{name}") for name in ("chat", "nightly", "evals", "bands")
    }


def stated_band(caller, asked: str | None) -> int | None:
    """The band the router states to the engines for a call that asked for ``asked``."""
    headers = {"X-Autellix-Priority": asked} if asked is not None else {}
    body = json.dumps({"model": "m", "messages": []}).encode()
    call = read_call("/v1/chat/completions", body, CIMultiDict(headers), {"m"}, chars_per_token=4.0)
    identity = CallIdentity("p-" + caller.name, priority=call.identity.priority)
    return admit(ProgramTable(), None, identity, caller, call.path, call.body, {}).identity.priority


def test_the_keys_file_gives_each_key_its_class_and_best_class(tmp_path):
    by_name = clients(tmp_path)
    assert (by_name["chat"].band, by_name["chat"].best_band) == (0, 0)
    assert (by_name["nightly"].band, by_name["nightly"].best_band) == (1, 1)
    assert (by_name["evals"].band, by_name["evals"].best_band) == (1, 0)
    assert (by_name["bands"].band, by_name["bands"].best_band) == (5, 2)
    assert by_name["nightly"].owner == owner_of("sk-nightly")


def test_a_client_may_lower_its_class_but_never_raise_it_past_its_keys(tmp_path):
    by_name = clients(tmp_path)
    assert stated_band(by_name["chat"], None) is None  # band 0 goes unstated
    assert stated_band(by_name["chat"], "batch") == 1  # lowered
    assert stated_band(by_name["nightly"], None) == 1
    assert stated_band(by_name["nightly"], "interactive") == 1  # not raised
    assert stated_band(by_name["evals"], "interactive") is None  # its key allows it
    assert stated_band(by_name["bands"], "0") == 2
    assert stated_band(by_name["bands"], "7") == 7


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("a: sk-1 class=urgent", "line 1: class must be interactive, batch or a band"),
        ("a: sk-1 colour=red", "line 1: unknown option 'colour'"),
        ("a: sk-1 class=interactive max-class=batch", "line 1: max-class must be at least"),
        ("a: sk-1 batch", "line 1: the key must not contain spaces"),
    ],
)
def test_a_bad_class_in_the_keys_file_names_its_line_never_the_key(tmp_path, line, message):
    path = tmp_path / "keys"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message) as caught:
        load_api_keys(path)
    assert "sk-" not in str(caught.value)


def read_chat(headers: dict[str, str] | None = None, **body: object):
    raw = json.dumps({"model": "m", "messages": [], **body}).encode()
    return read_call("/v1/chat/completions", raw, CIMultiDict(headers or {}), {"m"}, 4.0)


def test_the_bodys_priority_asks_for_a_band_by_the_headers_rule(tmp_path):
    """vLLM's own ``priority`` field (lower first) is a band, bounded by the key."""
    by_name = clients(tmp_path)
    for priority, band in ((0, 0), (1, 1), (9, 9), ("batch", 1), ("interactive", 0)):
        assert read_chat(priority=priority).identity.priority == band
    call = read_chat(priority=0)
    identity = CallIdentity("p-nightly", priority=call.identity.priority)
    stated = admit(ProgramTable(), None, identity, by_name["nightly"], call.path, call.body, {})
    assert stated.identity.priority == 1  # asked for 0: not past its key's class
    # The header wins over the body (the SDK sets it; a body field may be a default).
    assert read_chat({"X-Autellix-Priority": "batch"}, priority=0).identity.priority == 1
    assert read_chat({"X-Autellix-Priority": "0"}, priority=3).identity.priority == 0


def test_the_bodys_priority_never_reaches_an_engine_as_sent():
    call = read_chat(priority=2, temperature=0.5)
    assert json.loads(call.raw) == {"model": "m", "messages": [], "temperature": 0.5}
    assert "priority" not in json.loads(read_chat(priority=None).raw)


@pytest.mark.parametrize("priority", [-1, 10, 1.5, True, "urgent", [1]])
def test_a_priority_that_is_no_band_is_a_400_with_the_error_body(priority):
    with pytest.raises(ApiError) as caught:
        read_chat(priority=priority)
    error = caught.value
    assert (error.status, error.code, error.param) == (400, "invalid_identity", "priority")
    assert "interactive, batch or a band from 0 to 9" in str(error)


def test_a_keys_weight_comes_from_its_line_and_defaults_to_one(tmp_path):
    path = tmp_path / "keys"
    path.write_text("a: sk-a\nb: sk-b weight=2.5 class=batch\n")
    ring = KeyRing.build(None, load_api_keys(path))
    a, b = ring.client_for("Bearer sk-a"), ring.client_for("Bearer sk-b")
    assert (a.weight, b.weight, b.band) == (1.0, 2.5, 1)


@pytest.mark.parametrize("weight", ["0", "-1", "inf", "nan", "heavy", ""])
def test_a_weight_that_is_not_positive_and_finite_stops_the_start(tmp_path, weight):
    path = tmp_path / "keys"
    path.write_text(f"# keys\na: sk-secret weight={weight}\n")
    with pytest.raises(ValueError, match="line 2: weight must be a") as caught:
        load_api_keys(path)
    assert "sk-secret" not in str(caught.value)


def test_the_router_states_the_owners_weight_and_notes_the_class(tmp_path):
    path = tmp_path / "keys"
    path.write_text("light: sk-light\nheavy: sk-heavy weight=3 class=batch\n")
    ring = KeyRing.build(None, load_api_keys(path), admin_key="sk-admin")
    light, heavy = ring.client_for("Bearer sk-light"), ring.client_for("Bearer sk-heavy")
    admin = ring.client_for("Bearer sk-admin")
    table = ProgramTable()
    assert admit(table, None, CallIdentity("l"), light, "", {}, {}).identity.weight is None
    stated = admit(table, None, CallIdentity("h"), heavy, "", {}, {}).identity
    assert (stated.weight, stated.priority, stated.owner) == (3.0, 1, heavy.owner)
    # The admin calling the heavy key's program: the call draws on that key's share.
    by_admin = admit(table, None, CallIdentity("h", priority=4), admin, "", {}, {}).identity
    assert (by_admin.weight, by_admin.owner, by_admin.priority) == (3.0, heavy.owner, 4)
    # A call without a program draws on its caller's share.
    alone = admit(table, None, CallIdentity(), heavy, "", {}, {}).identity
    assert (alone.weight, alone.owner) == (3.0, heavy.owner)
    assert table.row(table.get("h"), 0.0)["class"] == "4"  # its latest call's band
    assert table.row(table.get("l"), 0.0)["class"] == "interactive"


def test_each_keys_share_is_its_programs_service_over_its_weight(tmp_path):
    path = tmp_path / "keys"
    path.write_text("light: sk-light\nheavy: sk-heavy weight=4 class=batch\n")
    ring = KeyRing.build(None, load_api_keys(path), admin_key="sk-admin")
    light, heavy = ring.client_for("Bearer sk-light"), ring.client_for("Bearer sk-heavy")
    table = ProgramTable()
    for program_id, caller, service in (("l1", light, 10.0), ("l2", light, 5.0),
                                        ("h1", heavy, 40.0)):  # fmt: skip
        record = table.call_arrived(CallIdentity(program_id), caller)
        table.call_finished(record, None, engine="e", service=service, completed=True)
    table.end("l2", light)  # an ended program's service still counts
    rows = table.key_rows(ring.client_for("Bearer sk-admin"))
    assert rows == [
        {"name": "heavy", "class": "batch", "weight": 4.0, "service": 40.0, "share": 10.0,
         "programs": 1},
        {"name": "light", "class": "interactive", "weight": 1.0, "service": 15.0, "share": 15.0,
         "programs": 1},
    ]  # fmt: skip
    assert [row["name"] for row in table.key_rows(light)] == ["light"]  # only its own


def test_call_latency_is_observed_by_key_and_class():
    metrics = RouterMetrics()
    metrics.answered("nightly", 1, 0.2)
    metrics.answered("nightly", 0, 0.3)
    metrics.answered("chat", 7, 0.4)
    text = metrics.render().decode()
    for key, name in (("nightly", "batch"), ("nightly", "interactive"), ("chat", "7")):
        assert f'autellix_router_call_seconds_count{{class="{name}",key="{key}"}} 1.0' in text
