"""How much time the autellix SDK adds to an LLM call, over the plain openai client.

Starts the SDK tests' aiohttp fake OpenAI server (tests/sdk/fake_server.py) on
127.0.0.1 in a separate process, then times `chat.completions.create` through
`openai.AsyncOpenAI` and through `autellix.AsyncOpenAI` inside a program, one
call of each variant per round in a freshly shuffled order, so that all see the
same machine noise and each follows every other equally often. Also times the
SDK's own per-call work (tagging the request options) without any network.

    python tests/bench/bench_sdk.py --json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import autellix
import httpx2
import openai

FAKE_SERVER = Path(__file__).resolve().parents[1] / "sdk" / "fake_server.py"
sys.path.insert(0, str(FAKE_SERVER.parent))
from fake_server import chat_completion  # noqa: E402  (the fake server's own answer)

MOCK_BASE_URL = "http://mock.invalid/v1"
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


def answer_in_process(request: httpx2.Request) -> httpx2.Response:
    """The fake server's answers, for `--transport mock`."""
    if request.url.path.startswith("/autellix/v1/programs"):
        return httpx2.Response(200, json={"program_id": "prog-mock"})
    return httpx2.Response(200, json=chat_completion(json.loads(request.content)))


def make_client(kind: type[openai.AsyncOpenAI], base_url: str) -> openai.AsyncOpenAI:
    """A client of `kind` for `base_url`; in-process answers for `MOCK_BASE_URL`."""
    if base_url != MOCK_BASE_URL:
        return kind(base_url=base_url, api_key="bench")
    transport = httpx2.MockTransport(answer_in_process)
    return kind(
        base_url=base_url, api_key="bench", http_client=httpx2.AsyncClient(transport=transport)
    )


async def time_call(client: openai.AsyncOpenAI, **call_options: Any) -> tuple[float, float]:
    """Wall-clock and client-CPU seconds of one non-streaming chat completion.

    CPU time (of this thread only) is what the client side costs; unlike wall
    time it does not grow when a busy machine deschedules the benchmark.
    """
    wall, cpu = time.perf_counter(), time.thread_time()
    await client.chat.completions.create(model="m", messages=MESSAGES, **call_options)
    return time.perf_counter() - wall, time.thread_time() - cpu


def identity_by_hand(call_ids: Iterator[int]) -> dict[str, Any]:
    """Per-call options that make a plain client send the headers the SDK sends."""
    program, thread = "bench-program", "main-" + "0" * 32
    return {
        "extra_headers": {
            autellix.PROGRAM_ID_HEADER: program,
            autellix.THREAD_ID_HEADER: thread,
            autellix.PARENT_THREAD_ID_HEADER: "",
            autellix.CALL_ID_HEADER: f"{next(call_ids):032x}",
            autellix.SESSION_ID_HEADER: program,
        },
    }


async def time_side_by_side(
    base_url: str, calls: int, warmup: int, seed: int = 0
) -> dict[str, list[Any]]:
    """Make one call per variant in each round, in an order shuffled every round.

    A fixed rotation would let each variant always follow the same other one,
    and a call right after one through the same code path runs on warmer caches
    (that alone moved a variant by 10 us).

    - plain: `openai.AsyncOpenAI`, the baseline;
    - plain_again: a second plain client, whose difference is the noise floor;
    - plain_with_identity: a plain client sending the same five headers by
      hand, the cost of the identity bytes alone;
    - autellix: `autellix.AsyncOpenAI` inside a program.
    """
    plain = make_client(openai.AsyncOpenAI, base_url)
    plain_again = make_client(openai.AsyncOpenAI, base_url)
    plain_by_hand = make_client(openai.AsyncOpenAI, base_url)
    tagged = make_client(autellix.AsyncOpenAI, base_url)
    call_ids = itertools.count()
    # One client (and connection) per variant, so that no variant ever follows
    # a call through its own, cache-warm client while another never does.
    variants: dict[str, Callable[[], Awaitable[tuple[float, float]]]] = {
        "plain": lambda: time_call(plain),
        "plain_again": lambda: time_call(plain_again),
        "plain_with_identity": lambda: time_call(plain_by_hand, **identity_by_hand(call_ids)),
        "autellix": lambda: time_call(tagged),
    }
    samples: dict[str, list[Any]] = {label: [] for label in variants}
    order = list(variants.items())
    shuffler = random.Random(seed)
    async with autellix.session("bench", client=tagged):
        for _ in range(warmup):
            for _, timed_call in order:
                await timed_call()
        for _ in range(calls):
            shuffler.shuffle(order)
            for label, timed_call in order:
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


def summarize(
    samples: dict[str, list[Any]], tagging_seconds: float, transport: str
) -> dict[str, Any]:
    """Each variant against the plain client, by wall clock and by client CPU."""
    wall = {label: [each[0] for each in timings] for label, timings in samples.items()}
    cpu = {label: [each[1] for each in timings] for label, timings in samples.items()}
    return {
        "transport": transport,
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
    parser.add_argument(
        "--transport",
        choices=("server", "mock"),
        default="server",
        help="a local server in its own process (default) or in-process answers",
    )
    args = parser.parse_args()

    if args.transport == "mock":
        samples = asyncio.run(time_side_by_side(MOCK_BASE_URL, args.calls, args.warmup))
    else:
        server, base_url = start_server()
        try:
            samples = asyncio.run(time_side_by_side(base_url, args.calls, args.warmup))
        finally:
            server.kill()
            server.wait()
    result = summarize(samples, time_tagging_alone(repeats=20_000), args.transport)

    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")


if __name__ == "__main__":
    main()
