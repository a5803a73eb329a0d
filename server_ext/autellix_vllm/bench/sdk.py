"""How much time the autellix SDK adds to an LLM call: ``autellix bench sdk``.

Times ``chat.completions.create`` through ``openai.AsyncOpenAI`` and through
``autellix.AsyncOpenAI`` inside a program, against the minimal upstream of
:mod:`autellix_vllm.bench.fake_upstream` in its own process (or, with the
``mock`` transport, answers made in process), one call of each variant per
round in a freshly shuffled order, so that all see the same machine noise and
each follows every other equally often. Also times the SDK's own per-call work
(tagging the request options) without any network.
"""

from __future__ import annotations

import asyncio
import itertools
import platform
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import autellix
import httpx2
import openai
from openai.types.chat import ChatCompletionMessageParam

from autellix_vllm.bench.fake_upstream import COMPLETION_BODY
from autellix_vllm.bench.subprocesses import FAKE_UPSTREAM_COMMAND, FAKE_UPSTREAM_READY, running
from autellix_vllm.protocol.paths import PROGRAMS_PATH

MOCK_BASE_URL = "http://mock.invalid/v1"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def answer_in_process(request: httpx2.Request) -> httpx2.Response:
    """The fake upstream's answers, for the ``mock`` transport."""
    if request.url.path.startswith(PROGRAMS_PATH):
        return httpx2.Response(200, json={"program_id": "prog-mock"})
    return httpx2.Response(
        200, content=COMPLETION_BODY, headers={"Content-Type": "application/json"}
    )


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


def run_sdk_bench(
    calls: int = 2000, warmup: int = 200, transport: str = "server"
) -> dict[str, Any]:
    """Time ``calls`` calls per variant after ``warmup`` untimed ones, over a local
    upstream in its own process (``server``) or in-process answers (``mock``)."""
    if transport == "mock":
        samples = asyncio.run(time_side_by_side(MOCK_BASE_URL, calls, warmup))
    else:
        with running(FAKE_UPSTREAM_COMMAND, FAKE_UPSTREAM_READY) as server:
            base_url = f"http://127.0.0.1:{server.ready}/v1"
            samples = asyncio.run(time_side_by_side(base_url, calls, warmup))
    return summarize(samples, time_tagging_alone(repeats=20_000), transport)
