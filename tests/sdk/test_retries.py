"""Transient failures are retried with one call id; other errors surface unchanged."""

from __future__ import annotations

import logging
import time

import autellix
import openai
import pytest
from fake_server import FakeOpenAIServer

MESSAGES = [{"role": "user", "content": "hi"}]


@autellix.program
async def one_call(client: autellix.AsyncOpenAI) -> str | None:
    answer = await client.chat.completions.create(model="m", messages=MESSAGES)
    return answer.choices[0].message.content


@pytest.mark.parametrize("status", [429, 502, 503, 504])
async def test_transient_statuses_are_retried_with_the_same_call_id(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI, status: int
) -> None:
    server.fail_next(status, times=2)

    assert await one_call(client) == "ok"

    attempts = server.generation_calls()
    assert len(attempts) == 3
    assert len({attempt.call_id for attempt in attempts}) == 1
    assert attempts[0].call_id is not None


async def test_connection_resets_are_retried_with_the_same_call_id(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    server.reset_next(times=2)

    assert await one_call(client) == "ok"

    attempts = server.generation_calls()
    assert len(attempts) == 3
    assert len({attempt.call_id for attempt in attempts}) == 1


async def test_streaming_calls_are_retried_too(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    server.fail_next(503)

    @autellix.program
    async def agent() -> list[str | None]:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        return [chunk.choices[0].delta.content async for chunk in stream]

    assert await agent() == ["ok", None]
    first, second = server.generation_calls()
    assert first.call_id == second.call_id


async def test_attempts_are_bounded_by_max_retries(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    server.fail_next(503, times=10)

    with pytest.raises(openai.InternalServerError) as failure:
        await one_call(client)

    assert failure.value.status_code == 503
    assert len(server.generation_calls()) == 3  # max_retries=2; openai adds none of its own
    server.state.failures.clear()

    server.fail_next(503, times=10)
    with pytest.raises(openai.InternalServerError):
        await one_call(client.with_options(max_retries=0))
    assert len(server.generation_calls()) == 4


async def test_retrying_stops_after_retry_max_seconds(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    server.fail_next(503, times=1000)
    patient = client.with_options(
        max_retries=1000, retry_max_seconds=0.3, retry_backoff_seconds=0.05
    )

    started = time.monotonic()
    with pytest.raises(openai.InternalServerError):
        await one_call(patient)

    assert time.monotonic() - started < 2.0
    assert 2 <= len(server.generation_calls()) < 100


async def test_retry_after_is_honoured(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    server.fail_next(429, retry_after="0.4")

    started = time.monotonic()
    assert await one_call(client) == "ok"

    assert time.monotonic() - started >= 0.4
    assert len(server.generation_calls()) == 2


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, openai.BadRequestError),
        (401, openai.AuthenticationError),
        (404, openai.NotFoundError),
        (422, openai.UnprocessableEntityError),
        (500, openai.InternalServerError),
    ],
)
async def test_other_errors_surface_at_once_as_openai_exceptions(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI, status: int, error: type
) -> None:
    server.fail_next(status)

    with pytest.raises(error) as failure:
        await one_call(client)

    assert failure.value.status_code == status
    assert len(server.generation_calls()) == 1


async def test_calls_outside_programs_are_retried_too(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI
) -> None:
    server.fail_next(502)

    await client.completions.create(model="m", prompt="hi")

    assert len(server.generation_calls()) == 2
    assert all(attempt.call_id is None for attempt in server.generation_calls())


async def test_connection_refused_is_retried_then_raised(
    server: FakeOpenAIServer, client: autellix.AsyncOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    server.stop()

    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="autellix"), pytest.raises(openai.APIConnectionError):
        await client.completions.create(model="m", prompt="hi")

    assert time.monotonic() - started < 2.0
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 2  # three attempts in all
