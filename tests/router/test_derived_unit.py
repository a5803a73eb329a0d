"""The router's derived program identity (router/derived.py), without a network."""

from __future__ import annotations

from typing import Any

import pytest
from autellix_vllm.protocol.paths import CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, RESPONSES_PATH
from autellix_vllm.router.derived import (
    REGISTRATIONS_KEPT,
    STRING_ENDS,
    Derived,
    ProgramDeriver,
    _fingerprint,
    session_headers,
)
from autellix_vllm.router.programs import ProgramRecord

CHAT = CHAT_COMPLETIONS_PATH
SYSTEM = {"role": "system", "content": "You are a careful agent."}
TASK = {"role": "user", "content": "Find the population of Lyon."}


def reply(text: str, tool_call_id: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_call_id is not None:
        message["tool_calls"] = [
            {"id": tool_call_id, "type": "function",
             "function": {"name": "search", "arguments": '{"q": "Lyon"}'}}
        ]  # fmt: skip
    return message


def tool(tool_call_id: str, output: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": tool_call_id, "content": output}


def chat(deriver: ProgramDeriver, messages: list[Any], owner: str = "alice", **body: Any) -> str:
    derived = deriver.derive(CHAT, {"messages": messages, **body}, {}, owner)
    assert derived is not None
    return derived.program_id


# ---- named by a value ------------------------------------------------------------------


def test_a_call_keeps_its_session_headers_read_once_when_it_is_accepted() -> None:
    """The deriver reads what was accepted (``Call.session_headers``), not the
    request's headers again: only the session headers, named in lower case."""
    from autellix_vllm.router.calls import read_call
    from multidict import CIMultiDict

    headers = CIMultiDict({"Session-Id": " s-1 ", "X-Session-Affinity": "", "Cookie": "c"})
    assert session_headers(headers) == {"session-id": "s-1"}
    call = read_call(CHAT, b'{"model": "m", "messages": []}', headers, {"m"}, 4.0)
    assert call.session_headers == {"session-id": "s-1"}


def test_the_sources_are_read_in_the_documented_order() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    body = {"prompt_cache_key": "k", "user": "u", "conversation": "c", "messages": [TASK]}
    headers = {"x-claude-code-session-id": "s", "x-session-affinity": "a"}
    first = deriver.derive(CHAT, body, headers, "alice")
    assert first is not None and first.name == "x-session-affinity=a"
    assert deriver.derive(CHAT, body, {}, "alice").name == "prompt_cache_key=k"
    del body["prompt_cache_key"]
    assert deriver.derive(CHAT, body, {}, "alice").name == "conversation=c"
    del body["conversation"]
    assert deriver.derive(CHAT, body, {}, "alice").name == "user=u"
    del body["user"]
    assert deriver.derive(CHAT, body, {}, "alice").name == "conversation prefix (1 messages)"


def test_one_value_is_one_program_per_key_and_never_another_keys() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    body = {"prompt_cache_key": "shared-name", "messages": [TASK]}
    alice = deriver.derive(CHAT, body, {}, "alice")
    again = deriver.derive(CHAT, body, {}, "alice")
    bob = deriver.derive(CHAT, body, {}, "bob")
    assert alice is not None and again is not None and bob is not None
    assert alice.new and not again.new and again.program_id == alice.program_id
    assert bob.new and bob.program_id != alice.program_id
    assert alice.program_id.startswith("derived-")


def test_values_that_name_nothing_are_skipped() -> None:
    deriver = ProgramDeriver(idle_end_s=60, prefix_programs=False)
    body = {"prompt_cache_key": "", "user": 7, "safety_identifier": None, "conversation": {}}
    assert deriver.derive(CHAT, body, {"session-id": "  "}, "alice") is None
    named = deriver.derive(CHAT, {**body, "safety_identifier": "h-42"}, {}, "alice")
    assert named is not None and named.name == "safety_identifier=h-42"


def test_a_conversation_object_names_its_id() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    derived = deriver.derive(RESPONSES_PATH, {"conversation": {"id": "conv_1"}}, {}, "alice")
    assert derived is not None and derived.name == "conversation=conv_1"


def test_a_name_is_printable_and_short() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    derived = deriver.derive(CHAT, {"user": "a\nb" + "x" * 100}, {}, "alice")
    assert derived is not None
    assert derived.name.isprintable() and derived.name.startswith("user=a?bx")
    assert derived.name.endswith("...") and len(derived.name) < 60


def test_previous_response_id_joins_the_program_that_got_that_response() -> None:
    deriver = ProgramDeriver(idle_end_s=60, prefix_programs=False)
    first = deriver.derive(RESPONSES_PATH, {"prompt_cache_key": "k"}, {}, "alice")
    assert first is not None
    deriver.answered(first.program_id, "alice", "resp_1")
    follow = {"previous_response_id": "resp_1", "user": "u"}
    joined = deriver.derive(RESPONSES_PATH, follow, {}, "alice")
    assert joined == Derived(first.program_id, "previous_response_id=resp_1", new=False)
    # Another key cannot reach it; an unknown response falls through to the next source.
    other = deriver.derive(RESPONSES_PATH, follow, {}, "bob")
    assert other is not None and other.name == "user=u" and other.program_id != first.program_id
    unknown = deriver.derive(RESPONSES_PATH, {"previous_response_id": "resp_9"}, {}, "alice")
    assert unknown is None


def test_a_program_keeps_its_newest_response_ids() -> None:
    deriver = ProgramDeriver(idle_end_s=60, prefix_programs=False)
    for i in range(20):
        deriver.answered("p", "alice", f"resp_{i}")
    known = [
        i for i in range(20)
        if deriver.derive(RESPONSES_PATH, {"previous_response_id": f"resp_{i}"}, {}, "alice")
    ]  # fmt: skip
    assert known == list(range(12, 20))


# ---- the conversation prefix -------------------------------------------------------------


def test_an_agent_loop_is_one_program() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    messages = [SYSTEM, TASK]
    program = chat(deriver, messages)
    for step in range(10):  # more steps than registrations kept: each extends the last
        messages = [*messages, reply(f"step {step}", f"call_{step}"), tool(f"call_{step}", "ok")]
        assert chat(deriver, messages) == program
    messages = [*messages, reply("Lyon has 520,000 people."), {"role": "user", "content": "Thanks"}]
    assert chat(deriver, messages) == program


def test_two_agents_that_start_alike_stay_apart() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    first, second = chat(deriver, [SYSTEM, TASK]), chat(deriver, [SYSTEM, TASK])
    assert first != second  # the same messages again extend nothing
    a = [SYSTEM, TASK, reply("search A", "call_a"), tool("call_a", "A")]
    b = [SYSTEM, TASK, reply("search B", "call_b"), tool("call_b", "B")]
    program_a, program_b = chat(deriver, a), chat(deriver, b)
    assert {program_a, program_b} == {first, second}
    # Each continues on its own program; a retry of a call stays on it too.
    assert chat(deriver, [*a, reply("done A")]) == program_a
    assert chat(deriver, [*b, reply("done B")]) == program_b
    assert chat(deriver, a) == program_a
    # A third reply to the same start, after both were claimed: another program.
    c = [SYSTEM, TASK, reply("search C", "call_c"), tool("call_c", "C")]
    assert chat(deriver, c) not in (program_a, program_b)


def test_a_call_that_extends_without_a_reply_joins() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    program = chat(deriver, [SYSTEM, TASK])
    assert chat(deriver, [SYSTEM, TASK, {"role": "user", "content": "Be brief."}]) == program


def test_a_rewritten_history_starts_a_new_program() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    program = chat(deriver, [SYSTEM, TASK, reply("one"), {"role": "user", "content": "go"}])
    summary = {"role": "user", "content": "Summary of the work so far: ..."}
    assert chat(deriver, [SYSTEM, summary, reply("two")]) != program


def test_the_prefix_is_owner_scoped_and_can_be_switched_off() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    program = chat(deriver, [SYSTEM, TASK])
    extended = [SYSTEM, TASK, reply("r"), tool("t", "o")]
    assert chat(deriver, extended, owner="bob") != program
    off = ProgramDeriver(idle_end_s=60, prefix_programs=False)
    assert off.derive(CHAT, {"messages": extended}, {}, "alice") is None


def test_response_input_items_and_function_calls_extend_too() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    items: list[Any] = [{"role": "user", "content": "Plan a trip"}]
    first = deriver.derive(RESPONSES_PATH, {"input": items}, {}, "alice")
    assert first is not None and first.name == "conversation prefix (1 items)"
    items += [{"type": "function_call", "call_id": "fc_1", "name": "maps", "arguments": "{}"},
              {"type": "function_call_output", "call_id": "fc_1", "output": "3 h"}]  # fmt: skip
    second = deriver.derive(RESPONSES_PATH, {"input": items}, {}, "alice")
    assert second is not None and second.program_id == first.program_id and not second.new


def test_calls_without_a_conversation_derive_nothing() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    assert deriver.derive(COMPLETIONS_PATH, {"prompt": "Once upon"}, {}, "alice") is None
    assert deriver.derive(CHAT, {"messages": "not a list"}, {}, "alice") is None
    assert deriver.derive(CHAT, {"messages": []}, {}, "alice") is None
    assert deriver.derive(RESPONSES_PATH, {"input": 7}, {}, "alice") is None
    one = deriver.derive(RESPONSES_PATH, {"input": "a plain string"}, {}, "alice")
    assert one is not None and one.name == "conversation prefix (1 items)"


def test_a_program_keeps_only_its_newest_registrations() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    messages: list[Any] = [TASK]
    program = chat(deriver, messages)
    prefixes = [list(messages)]
    for step in range(REGISTRATIONS_KEPT + 2):
        messages = [*messages, reply(f"r{step}"), {"role": "user", "content": f"u{step}"}]
        chat(deriver, messages)
        prefixes.append(list(messages))
    assert len(deriver._branches) == REGISTRATIONS_KEPT
    # An old prefix is forgotten: extending it opens another program.
    assert chat(deriver, [*prefixes[0], reply("r0"), {"role": "user", "content": "x"}]) != program


def test_forgetting_a_program_forgets_everything_that_named_it() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    program = chat(deriver, [SYSTEM, TASK], prompt_cache_key="k")
    by_prefix = chat(deriver, [TASK, reply("x"), TASK])
    deriver.answered(program, "alice", "resp_1")
    for program_id in (program, by_prefix):
        deriver.forget(program_id)
    assert len(deriver) == 0 and not deriver._by_key and not deriver._branches
    assert chat(deriver, [SYSTEM, TASK], prompt_cache_key="k") != program


def test_a_refused_program_is_forgotten() -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    derived = deriver.derive(CHAT, {"user": "u"}, {}, "alice")
    assert derived is not None
    deriver.refused(derived)
    assert len(deriver) == 0
    again = deriver.derive(CHAT, {"user": "u"}, {}, "alice")
    assert again is not None and again.new and again.program_id != derived.program_id


# ---- fingerprints and idle ends ----------------------------------------------------------


def test_an_item_is_compared_without_its_empty_fields() -> None:
    bare = {"role": "assistant", "content": "hi"}
    padded = {"content": "hi", "role": "assistant", "refusal": None, "tool_calls": []}
    assert _fingerprint(bare) == _fingerprint(padded)
    assert _fingerprint(bare) != _fingerprint({"role": "assistant", "content": "ho"})
    assert _fingerprint(bare) != _fingerprint({"role": "user", "content": "hi"})


def test_a_long_string_is_compared_by_length_and_ends() -> None:
    head, middle, tail = "h" * STRING_ENDS, "m" * 10 * STRING_ENDS, "t" * STRING_ENDS
    text = head + middle + tail
    # The documented limit: a different middle of the same length compares equal.
    assert _fingerprint(text) == _fingerprint(head + "n" * len(middle) + tail)
    assert _fingerprint(text) != _fingerprint(text + "!")
    assert _fingerprint(text) != _fingerprint("x" + text[1:])
    assert len(_fingerprint({"content": text})) < 4 * STRING_ENDS


def test_a_deep_or_huge_item_costs_a_bounded_walk() -> None:
    deep: Any = "leaf"
    for _ in range(100_000):
        deep = {"content": [deep]}
    assert _fingerprint(deep)  # no RecursionError, bounded
    assert len(_fingerprint(list(range(100_000)))) < 10_000


@pytest.mark.parametrize("busy", [False, True])
def test_a_derived_program_is_ended_once_idle_and_not_while_busy(busy: bool) -> None:
    deriver = ProgramDeriver(idle_end_s=60)
    derived = deriver.derive(CHAT, {"user": "u"}, {}, "alice")
    assert derived is not None
    record = ProgramRecord(derived.program_id, derived.name, created_s=0.0, issued=False)
    record.calls_active = int(busy)
    deriver.opened(derived, record)
    assert deriver.idle(59.0) == []
    assert deriver.idle(61.0) == ([] if busy else [derived.program_id])
