"""How much time the autellix SDK adds to an LLM call, over the plain openai client.

Starts the SDK tests' aiohttp fake OpenAI server (tests/sdk/fake_server.py) on
127.0.0.1 in a separate process, then times `chat.completions.create` through
`openai.AsyncOpenAI` and through `autellix.AsyncOpenAI` inside a program, one
call of each variant per round, the starting variant rotating, so that all see
the same machine noise. Also times the SDK's own per-call work (tagging the
request options) without any network.

    python tests/bench/bench_sdk.py --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import autellix
import openai

FAKE_SERVER = Path(__file__).resolve().parents[1] / "sdk" / "fake_server.py"
MESSAGES = [{"role": "user", "content": "hi"}]


def start_server() -> tuple[subprocess.Popen[str], str]:
    """Run the SDK tests' fake server in its own process; return it and its base URL."""
    command = [sys.executable, str(FAKE_SERVER)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    announced = process.stdout.readline().split()
    if announced[:1] != ["PORT"]:
        process.kill()
        raise RuntimeError(f"fake server did not start: {announced}")
    return process, f"http://127.0.0.1:{announced[1]}/v1"


async def time_call(client: openai.AsyncOpenAI, **call_options: Any) -> tuple[float, float]:
    """Wall-clock and client-CPU seconds of one non-streaming chat completion.

    CPU time (of this thread only) is what the client side costs; unlike wall
    time it does not grow when a busy machine deschedules the benchmark.
    """
    wall, cpu = time.perf_counter(), time.thread_time()
    await client.chat.completions.create(model="m", messages=MESSAGES, **call_options)
    return time.perf_counter() - wall, time.thread_time() - cpu


def identity_by_hand() -> dict[str, Any]:
    """Per-call options that make a plain client send what the SDK sends (fixed ids)."""
    program, thread, call = "bench-program", "main-" + "0" * 32, "1" * 32
    return {
        "extra_headers": {
            autellix.PROGRAM_ID_HEADER: program,
            autellix.THREAD_ID_HEADER: thread,
            autellix.CALL_ID_HEADER: call,
            autellix.SESSION_ID_HEADER: program,
        },
        "extra_body": {
            "vllm_xargs": {
                "autellix_program_id": program,
                "autellix_thread_id": thread,
                "autellix_call_id": call,
            }
        },
    }


async def time_side_by_side(base_url: str, calls: int, warmup: int) -> dict[str, list[Any]]:
    """Rotate one call per variant, starting with a different variant each round.

    - plain: `openai.AsyncOpenAI`, the baseline;
    - plain_again: a second plain client, whose difference is the noise floor;
    - plain_with_identity: a plain client sending the same headers and
      `vllm_xargs` by hand, the cost of the identity bytes alone;
    - autellix: `autellix.AsyncOpenAI` inside a program.
    """
    plain = openai.AsyncOpenAI(base_url=base_url, api_key="bench")
    plain_again = openai.AsyncOpenAI(base_url=base_url, api_key="bench")
    plain_by_hand = openai.AsyncOpenAI(base_url=base_url, api_key="bench")
    tagged = autellix.AsyncOpenAI(base_url=base_url, api_key="bench")
    by_hand = identity_by_hand()
    # One client (and connection) per variant, so that no variant ever follows
    # a call through its own, cache-warm client while another never does.
    variants: dict[str, Callable[[], Awaitable[tuple[float, float]]]] = {
        "plain": lambda: time_call(plain),
        "plain_again": lambda: time_call(plain_again),
        "plain_with_identity": lambda: time_call(plain_by_hand, **by_hand),
        "autellix": lambda: time_call(tagged),
    }
    samples: dict[str, list[Any]] = {label: [] for label in variants}
    order = list(variants.items())
    async with autellix.session("bench", client=tagged):
        for _ in range(warmup):
            for _, timed_call in order:
                await timed_call()
        for round_number in range(calls):
            start = round_number % len(order)
            for label, timed_call in order[start:] + order[:start]:
                samples[label].append(await timed_call())
    for client in (plain, plain_again, plain_by_hand, tagged):
        await client.close()
    return samples


def time_tagging_alone(repeats: int) -> float:
    """Median seconds the SDK spends preparing one POST's options, without the network."""
    client = autellix.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="bench")
    timings = []
    token = autellix._identity.bind(autellix.ThreadIdentity("prog-bench", "main-bench"))
    try:
        for _ in range(repeats):
            post_arguments = {
                "body": {"model": "m", "messages": MESSAGES},
                "options": {"headers": {"X-User": "1"}},
            }
            started = time.perf_counter()
            client._prepare_post(post_arguments)
            timings.append(time.perf_counter() - started)
    finally:
        autellix._identity.unbind(token)
    return statistics.median(timings)


def compare(baseline: list[float], other: list[float]) -> dict[str, float]:
    """Medians in microseconds, their difference, and the median paired difference."""
    micro = 1e6
    paired = [b - a for a, b in zip(baseline, other, strict=True)]
    return {
        "baseline_median_us": round(statistics.median(baseline) * micro, 1),
        "median_us": round(statistics.median(other) * micro, 1),
        "overhead_us": round((statistics.median(other) - statistics.median(baseline)) * micro, 1),
        "paired_overhead_median_us": round(statistics.median(paired) * micro, 1),
    }


def summarize(samples: dict[str, list[Any]], tagging_seconds: float) -> dict[str, Any]:
    """Each variant against the plain client, by wall clock and by client CPU."""
    wall = {label: [each[0] for each in timings] for label, timings in samples.items()}
    cpu = {label: [each[1] for each in timings] for label, timings in samples.items()}
    return {
        "calls_per_variant": len(samples["plain"]),
        **{
            f"{label}_vs_plain": {
                "wall_clock": compare(wall["plain"], wall[label]),
                "client_cpu": compare(cpu["plain"], cpu[label]),
            }
            for label in ("autellix", "plain_with_identity", "plain_again")
        },
        "tagging_only_median_us": round(tagging_seconds * 1e6, 2),
        "budget_us": 50,
        "python": platform.python_version(),
        "openai": openai.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per client")
    parser.add_argument("--warmup", type=int, default=200, help="untimed calls per client")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    server, base_url = start_server()
    try:
        samples = asyncio.run(time_side_by_side(base_url, args.calls, args.warmup))
    finally:
        server.kill()
        server.wait()
    result = summarize(samples, time_tagging_alone(repeats=20_000))

    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")


if __name__ == "__main__":
    main()
