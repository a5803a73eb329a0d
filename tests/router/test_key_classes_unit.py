"""A key's priority classes: the keys file gives them, a client may lower its
call's class but never raise it past its key's, and the router states it."""

from __future__ import annotations

import json

import pytest
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.router.admission import admit
from autellix_vllm.router.calls import read_call
from autellix_vllm.router.keys import KeyRing, load_api_keys, owner_of
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
