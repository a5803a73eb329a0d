"""Clients that only set a base URL and a key, through the router to the real engine:
the router derives their programs (router/derived.py), the engine schedules them
as programs, ``autellix ps`` shows them, and they end once idle."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from autellix_vllm.cli import main
from autellix_vllm.router.keys import ANONYMOUS
from polling import eventually
from router_http import engine_table, program_row

pytestmark = pytest.mark.engine

KEYS = "alice: sk-alice\nbob: sk-bob\n"


def client(router: Any, key: str = "sk-alice") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=key, max_retries=0)


async def ask(plain: openai.AsyncOpenAI, model: str, messages: list[Any], **body: Any) -> str:
    answer = await plain.chat.completions.create(
        model=model, messages=messages, max_tokens=3, extra_body=body
    )
    return answer.choices[0].message.content or ""


def programs_of(router: Any) -> list[Any]:
    return list(router.state.programs)


async def test_a_plain_client_with_prompt_cache_key_is_one_program_per_key(
    engine: Any, start_router: Any, tmp_path: Any, capsys: Any
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(KEYS)
    model = engine.served_model_name
    async with start_router([engine], api_keys_file=str(keys)) as router:
        alice, bob = client(router), client(router, "sk-bob")
        for turn in range(3):  # unrelated prompts: only the key ties them together
            await ask(alice, model, [{"role": "user", "content": f"turn {turn}"}],
                      prompt_cache_key="task-7")  # fmt: skip
        await ask(bob, model, [{"role": "user", "content": "hi"}], prompt_cache_key="task-7")
        alice_program, bob_program = sorted(programs_of(router), key=lambda r: r.owner_name)
        assert (alice_program.owner_name, bob_program.owner_name) == ("alice", "bob")
        assert alice_program.calls_completed == 3 and bob_program.calls_completed == 1
        assert alice_program.name == "prompt_cache_key=task-7"
        # The engine scheduled the calls as that program (the router's identity).
        table = await engine_table(engine)
        row = program_row(table, alice_program.program_id)
        assert row is not None and row["calls_completed"] == 3

        argv = ["ps", "--url", router.url + "/v1", "--api-key", "sk-alice"]
        assert await asyncio.to_thread(main, argv) == 0
        shown = capsys.readouterr().out
        assert alice_program.program_id in shown and "prompt_cache_key=task-7" in shown
        assert bob_program.program_id not in shown  # another key's program


async def test_a_plain_agent_that_extends_its_conversation_is_one_program(
    engine: Any, start_router: Any
) -> None:
    model = engine.served_model_name
    async with start_router([engine]) as router:
        plain = client(router)
        messages: list[Any] = [{"role": "user", "content": "count with me"}]
        for step in range(4):
            said = await ask(plain, model, messages)
            messages += [{"role": "assistant", "content": said},
                         {"role": "user", "content": f"and {step}?"}]  # fmt: skip
        other = await ask(plain, model, [{"role": "user", "content": "something else"}])
        assert other is not None
        conversation, alone = sorted(programs_of(router), key=lambda r: -r.calls_completed)
        assert conversation.calls_completed == 4 and alone.calls_completed == 1
        assert conversation.name == "conversation prefix (1 messages)"

    async with start_router([engine], prefix_programs=False) as router:
        await ask(client(router), model, messages)
        assert programs_of(router) == []  # switched off: the call runs alone


async def test_a_response_chain_is_one_program(engine: Any, start_router: Any) -> None:
    model = engine.served_model_name
    async with start_router([engine]) as router:
        plain = client(router)
        first = await plain.responses.create(model=model, input="hello", max_output_tokens=3)
        second = await plain.responses.create(
            model=model, input="and then?", previous_response_id=first.id, max_output_tokens=3
        )
        stream = await plain.responses.create(
            model=model, input="go on", previous_response_id=second.id, max_output_tokens=3,
            stream=True,
        )  # fmt: skip
        async for _ in stream:
            pass
        [program] = programs_of(router)  # the first by its input, then by response ids
        assert program.calls_completed == 3


async def test_a_derived_program_ends_once_idle_here_and_on_its_engine(
    engine: Any, start_router: Any
) -> None:
    model = engine.served_model_name
    options = {"derived_idle_end_s": 0.5, "health_interval_s": 0.2}
    async with start_router([engine], **options) as router:
        await ask(client(router), model, [{"role": "user", "content": "hi"}], user="u-1")
        [record] = programs_of(router)
        assert program_row(await engine_table(engine), record.program_id) is not None

        await eventually(lambda: programs_of(router) == [], timeout_s=10)
        rows, _ = router.state.programs.ended_rows(ANONYMOUS, limit=10)
        assert [row["program_id"] for row in rows] == [record.program_id]
        assert program_row(await engine_table(engine), record.program_id) is None
        # The same value later opens a new program.
        await ask(client(router), model, [{"role": "user", "content": "hi"}], user="u-1")
        [again] = programs_of(router)
        assert again.program_id != record.program_id and again.name == "user=u-1"
