"""``autellix serve --engines 2`` on the embedded model: stickiness, failover,
restarts, shutdown.

One ``autellix serve`` process (two real engines) is shared by the tests of
this module, which run in file order: routing first, then ``ps``/``top`` and
tool calling, then an engine's API server is killed mid-run (its process group
goes, the engine is restarted and serves again), and last the whole thing is
stopped with SIGTERM. Prompts "exceed the threshold" cheaply: the threshold is
lowered to 200 tokens and the tiny model's tokenizer has one token per
character. A last test SIGKILLs a serve of its own and finds no engine process
left.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import string
import subprocess
import uuid

import aiohttp
import openai
import pytest
from autellix_vllm.engine.reaper import group_alive, group_members, server_of
from polling import eventually, wait_until, wait_until_gone
from serve_process import SERVE, Served, read_until_ready, start_serve, stop_serve

pytestmark = pytest.mark.engine

THRESHOLD = 200
# The engines' key, given to serve so that the router benchmark below can reach them too.
ENGINE_KEY_ENV = {**os.environ, "AUTELLIX_ENGINE_KEY": f"test-{uuid.uuid4().hex}"}
PROGRAMS = "/autellix/v1/programs"


def processes_mentioning(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if marker.encode() in cmdline.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def wait_for_line(served: Served, pattern: str, timeout_s: float) -> re.Match[str]:
    def first_match() -> re.Match[str] | None:
        matches = (re.search(pattern, line) for line in list(served.output))
        return next((found for found in matches if found), None)

    return wait_until(
        first_match,
        timeout_s=timeout_s,
        poll_s=0.2,
        what=lambda: f"no line matching {pattern!r} in:\n" + "".join(served.output),
    )




@pytest.fixture(scope="module")
def served():
    served = start_serve(
        "--engines", "2", "--lb", "locality", "--locality-threshold", str(THRESHOLD),
        "--model", "tiny", "--chars-per-token", "1", "--max-model-len", "1024",
        "--max-num-seqs", "8",
        "--health-interval", "0.5",
        env=ENGINE_KEY_ENV,
    )  # fmt: skip
    try:
        read_until_ready(served)
        yield served
    finally:
        stop_serve(served)


def transcript(seed: str, length: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(length))


async def get_json(url: str) -> dict:
    async with aiohttp.ClientSession() as http, http.get(url) as answer:
        assert answer.status == 200
        return await answer.json()


async def open_program(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.post(url + PROGRAMS, json={}) as answer:
        return (await answer.json())["program_id"]


async def run_program(
    client: openai.AsyncOpenAI,
    url: str,
    calls: int,
    max_tokens: int,
    first_len: int = 300,
    program_id: str | None = None,
    after_first: asyncio.Event | None = None,
) -> str:
    """Make ``calls`` sequential long calls on a growing transcript, in the program
    ``program_id`` (opened here if None), waiting for ``after_first`` (if given)
    after the first; returns the program's id."""
    program_id = program_id or await open_program(url)
    text = transcript(program_id, first_len + 60 * calls)
    for n in range(calls):
        if n == 1 and after_first is not None:
            await after_first.wait()
        answer = await client.completions.create(
            model="autellix-tiny",
            prompt=text[: first_len + 60 * n],
            max_tokens=max_tokens,
            extra_body={"ignore_eos": True},
            extra_headers={"X-Autellix-Program-Id": program_id, "X-Autellix-Call-Id": f"c{n}"},
        )
        assert answer.usage.completion_tokens == max_tokens
    return program_id


def client_for(served: Served) -> openai.AsyncOpenAI:
    # No client retries: whatever survives an engine failure is the router's doing.
    return openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="-", max_retries=0)


async def test_long_calls_stick_to_one_engine_and_short_calls_spread_by_load(served):
    async with client_for(served) as client:
        programs = await asyncio.gather(
            *(run_program(client, served.url, calls=3, max_tokens=2) for _ in range(20))
        )
        table = await get_json(served.url + PROGRAMS)
        rows = {row["program_id"]: row for row in table["programs"]}
        for program_id in programs:
            row = rows[program_id]
            assert list(row["engines"]) == [row["engine"]], row  # one engine, its binding
            assert row["calls_completed"] == 3 and row["rebinds"] == 0
        assert {rows[p]["engine"] for p in programs} == {"engine-0", "engine-1"}

        await asyncio.gather(
            *(
                client.completions.create(
                    model="autellix-tiny",
                    prompt="short",
                    max_tokens=2,
                    extra_headers={"X-Autellix-Program-Id": programs[0]},
                )  # fmt: skip
                for _ in range(16)
            )
        )
    async with aiohttp.ClientSession() as http, http.get(served.url + "/metrics") as answer:
        metrics = await answer.text()
    for engine in ("engine-0", "engine-1"):
        assert re.search(rf'calls_total{{engine="{engine}",reason="least-loaded"}} [1-9]', metrics)
        assert re.search(rf'calls_total{{engine="{engine}",reason="bind"}} [1-9]', metrics)
    assert re.search(r'reason="sticky"} [1-9]', metrics)


def test_ps_and_top_print_the_table(served):
    ps = subprocess.run(
        [*SERVE, "ps", "--url", served.url + "/v1"], capture_output=True, text=True, timeout=60
    )
    assert ps.returncode == 0, ps.stderr
    lines = ps.stdout.splitlines()
    assert "engine-0 up" in lines[0] and "engine-1 up" in lines[0]
    assert lines[1].split()[:4] == ["PROGRAM", "NAME", "CLASS", "ENGINE"]
    assert len(lines) >= 2 + 20 and any("engine-1" in line for line in lines[2:])
    raw = subprocess.run(
        [*SERVE, "ps", "--url", served.url, "--json"], capture_output=True, text=True, timeout=60
    )
    assert len(json.loads(raw.stdout)["programs"]) >= 20
    top = subprocess.run(
        [*SERVE, "top", "--url", served.url, "--iterations", "2", "--interval", "0.1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert top.returncode == 0 and top.stdout.count("autellix top") == 2


def test_the_router_benchmark_runs_over_the_served_engines(served):
    """A small ``autellix bench router`` over this module's engines (the real run
    starts its own; docs/benchmarks.md)."""
    upstreams = [f"--upstream={served.engine_urls[i]}" for i in (0, 1)]
    bench = subprocess.run(
        [*SERVE, "bench", "router", *upstreams, "--programs", "3", "--json"],
        capture_output=True, text=True, timeout=600, env=ENGINE_KEY_ENV,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    result = json.loads(bench.stdout)
    assert result["avg_ratio"] > 0 and result["settings"]["side_by_side"] is False
    for policy in ("round-robin", "locality"):
        assert result[policy]["programs"] == 3
        assert sum(result[policy]["calls_by_reason"].values()) == result[policy]["calls"]
        # vLLM's counters were read (None: no lookups counted); three short programs'
        # prompts may not fill one of the CPU build's 128-token blocks.
        assert 0 <= result[policy]["prefix_cache_hit_rate"] <= 1


async def test_killing_an_engine_mid_run_loses_no_program(served):
    calls = 6
    # Opened first, so that the look below sees this test's programs only: the
    # table still holds the earlier tests' programs, some bound to engine-1.
    opened = [await open_program(served.url) for _ in range(10)]
    # Each program makes its first call, binding it to an engine, then waits; the
    # kill comes just before they all send their next calls, so engine-1 dies
    # with live programs bound to it, whose next calls the router must move.
    # (Watching the table for a program mid-run can miss it: the tiny engine may
    # run all of a program's calls between two looks.)
    first_done = asyncio.Event()
    async with client_for(served) as client:
        runs = [
            asyncio.ensure_future(
                run_program(
                    client,
                    served.url,
                    calls=calls,
                    max_tokens=24,
                    program_id=p,
                    after_first=first_done,
                )
            )
            for p in opened
        ]

        async def opened_rows() -> list[dict]:
            listing = await get_json(served.url + PROGRAMS)
            return [row for row in listing["programs"] if row["program_id"] in opened]

        rows = await eventually(
            opened_rows,
            lambda rows: len(rows) == len(opened) and all(r["calls_completed"] == 1 for r in rows),
            timeout_s=60,
            what="not every program made its first call",
        )
        engines = [r["engine"] for r in rows]
        assert "engine-1" in engines, f"every first call went to {set(engines)}"
        first_done.set()
        # The API server only: the reaper must take its engine core and worker with it.
        os.kill(server_of(served.engine_pids[1]), signal.SIGKILL)
        programs = await asyncio.gather(*runs)  # raises if any call of any program failed
    wait_until_gone(served.engine_pids[1])

    table = await get_json(served.url + PROGRAMS)
    rows = {row["program_id"]: row for row in table["programs"]}
    moved = [p for p in programs if rows[p]["rebinds"] > 0]
    assert moved, "no program was on the killed engine"
    for program_id in programs:
        row = rows[program_id]
        assert row["engine"] == "engine-0" and row["calls_failed"] == 0
        assert row["calls_completed"] == calls
    for program_id in moved:
        assert set(rows[program_id]["engines"]) == {"engine-0", "engine-1"}


async def test_the_killed_engine_is_restarted_on_its_port_and_serves_again(served):
    wait_for_line(served, r"engine 1 \(\S+\) exited with code 137; restarting it in 1 s", 10)
    back = wait_for_line(served, r"engine 1 \S+ healthy again after restart 1 \(pid (\d+)\)", 600)
    served.engine_pids[1] = int(back[1])

    async def listed_engines() -> dict[str, dict]:
        listing = await get_json(served.url + "/autellix/v1/engines")
        return {engine["name"]: engine for engine in listing["engines"]}

    # The router takes it back after one good probe.
    engines = await eventually(
        listed_engines, lambda engines: engines["engine-1"]["healthy"], timeout_s=30, poll_s=0.2
    )
    assert engines["engine-1"]["url"] == served.engine_urls[1]
    async with client_for(served) as client:
        programs = await asyncio.gather(
            *(run_program(client, served.url, calls=2, max_tokens=2) for _ in range(8))
        )
    rows = {row["program_id"]: row for row in (await get_json(served.url + PROGRAMS))["programs"]}
    assert any("engine-1" in rows[p]["engines"] for p in programs)  # it serves again


async def test_tool_calls_get_200_through_the_router(served):
    tools = [{
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }]  # fmt: skip
    async with client_for(served) as client:
        for choice in (
            "auto",
            "required",
            {"type": "function", "function": {"name": "get_weather"}},
        ):
            answer = await client.chat.completions.with_raw_response.create(
                model="autellix-tiny",
                messages=[{"role": "user", "content": "weather in Paris?"}],
                tools=tools,
                tool_choice=choice,
                max_tokens=8,
            )
            assert answer.status_code == 200


def test_sigterm_stops_the_router_and_every_engine(served):
    assert served.process.poll() is None
    served.process.send_signal(signal.SIGTERM)
    # serve's output is read by keep_reading's thread, not here: look for the line there.
    assert served.process.wait(timeout=90) == 0, "".join(served.output)
    wait_for_line(served, "stopped", timeout_s=10)
    for pid in served.engine_pids.values():
        assert not group_alive(pid)


def test_a_sigkilled_serve_leaves_no_engine_process():
    marker = f"marker-{uuid.uuid4().hex[:8]}"
    served = start_serve("--model", "tiny", "--served-model-name", marker)
    try:
        read_until_ready(served)
        group = served.engine_pids[0]
        assert len(group_members(group)) >= 4  # reaper, API server, engine core, worker
        served.process.kill()  # SIGKILL: serve runs no cleanup at all
        served.process.wait(timeout=10)
        wait_until_gone(group, timeout_s=5)
        assert processes_mentioning(marker) == []
    finally:
        for pid in served.engine_pids.values():
            if group_alive(pid):
                os.killpg(pid, signal.SIGKILL)


def test_serve_stops_what_it_started_when_an_engine_cannot_start():
    marker = f"marker-{uuid.uuid4().hex[:8]}"
    served = start_serve(
        "--engines", "2", "--served-model-name", marker, "--", "--no-such-vllm-flag"
    )
    output, _ = served.process.communicate(timeout=300)
    assert served.process.returncode == 1, output
    assert "error:" in output
    assert processes_mentioning(marker) == []
