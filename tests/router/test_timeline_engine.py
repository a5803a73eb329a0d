"""A program's timeline through the router in front of the shared real engine
(tests/conftest.py ``engine``): the parts add up to the latency its client saw,
only its owner reads it, and ``autellix ps PROGRAM`` prints it and writes a trace."""

from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest
from autellix_vllm.cli import main
from router_http import request, unique

pytestmark = pytest.mark.engine

TOOL_S = 1.0  # the program's own time between its calls (a tool)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_a_programs_timeline_adds_up_to_its_latency_for_its_owner_only(
    engine, start_router, tmp_path, capsys
):
    keys = tmp_path / "keys"
    keys.write_text("alice: sk-alice\nbob: sk-bob\n")
    options = {"api_keys_file": str(keys), "admin_key": "sk-admin"}
    program_id = unique("timed")
    headers = {"X-Autellix-Program-Id": program_id, "X-Autellix-Thread-Id": "main"}
    async with (
        start_router([engine], **options) as router,
        openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk-alice", max_retries=0) as alice,
    ):
        await alice.models.list()  # the client's connection is open before the clock starts
        started = time.time()
        for number, stream in enumerate((False, True, False)):
            if number:
                await asyncio.sleep(TOOL_S)
            answer = await alice.completions.create(
                model=engine.served_model_name, prompt=f"step {number}: " + "x" * 150,
                max_tokens=8, stream=stream, extra_body={"ignore_eos": True},
                extra_headers={**headers, "X-Autellix-Call-Id": f"c{number}"},
            )  # fmt: skip
            if stream:
                async for _ in answer:
                    pass
        latency = time.time() - started

        path = f"{router.url}/autellix/v1/programs/{program_id}/timeline"
        status, timeline = await request("GET", path, headers=bearer("sk-alice"))
        assert status == 200, timeline
        calls = timeline["calls"]
        assert [c["call_id"] for c in calls] == ["c0", "c1", "c2"]
        for call in calls:
            assert call["thread_id"] == "main" and call["engine"] == "engine-0"
            assert call["prompt_tokens"] > 150 and call["completion_tokens"] == 8
            assert call["prefill_s"] > 0 and call["decode_s"] > 0 and call["queue_s"] >= 0
            assert call["other_s"] >= -0.001  # the engine's parts fit in the router's span
            parts = call["queue_s"] + call["prefill_s"] + call["decode_s"] + call["other_s"]
            assert parts == pytest.approx(call["duration_s"])
        assert [c["gap_after_s"] >= TOOL_S for c in calls[:2]] == [True, True]
        assert calls[2]["gap_after_s"] is None
        # The calls' parts and the program's own time add up to what its client saw.
        in_calls = sum(c["duration_s"] for c in calls)
        own_time = sum(c["gap_after_s"] or 0.0 for c in calls)
        assert in_calls + own_time == pytest.approx(timeline["latency_s"], rel=1e-6)
        assert timeline["latency_s"] == pytest.approx(latency, rel=0.01)
        assert timeline["own_time_s"] == pytest.approx(own_time)

        status, body = await request("GET", path, headers=bearer("sk-bob"))
        assert status == 404 and body["error"]["code"] == "program_not_found"
        status, _ = await request("GET", path, headers=bearer("sk-admin"))
        assert status == 200

        trace_file = tmp_path / "trace.json"
        argv = ["ps", program_id, "--url", router.url, "--api-key", "sk-alice",
                "--chrome-trace", str(trace_file)]  # fmt: skip
        assert await asyncio.to_thread(main, argv) == 0
        printed = capsys.readouterr().out
        assert printed.startswith(f"{program_id}: 3 calls in ")
        assert all(f" c{number} " in printed for number in range(3))
        trace = json.loads(trace_file.read_text())
        spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "call"]
        assert [e["name"] for e in spans] == ["c0", "c1", "c2"]

        argv = ["ps", program_id, "--url", router.url, "--api-key", "sk-bob"]
        assert await asyncio.to_thread(main, argv) == 2
        assert f"no program {program_id!r}" in capsys.readouterr().err

        ending = f"{router.url}/autellix/v1/programs/{program_id}"
        assert (await request("DELETE", ending, headers=bearer("sk-alice")))[0] == 200
        status, ended = await request("GET", path, headers=bearer("sk-alice"))
        assert status == 200 and ended["ended"] is True
        assert ended["calls"] == timeline["calls"]  # kept with its final row
