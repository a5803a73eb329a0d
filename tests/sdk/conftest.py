"""Fixtures: a real local fake OpenAI server per test, and autellix clients pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import autellix
import pytest
from fake_server import FakeOpenAIServer

# Short backoffs keep retry tests fast; the policy is otherwise the default one.
FAST_RETRIES = {"retry_backoff_seconds": 0.01, "retry_max_seconds": 5.0}


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    fake = FakeOpenAIServer().start()
    yield fake
    fake.stop()


@pytest.fixture
async def client(server: FakeOpenAIServer) -> AsyncIterator[autellix.AsyncOpenAI]:
    async with autellix.AsyncOpenAI(
        base_url=server.base_url, api_key="test-key", **FAST_RETRIES
    ) as async_client:
        yield async_client


@pytest.fixture
def sync_client(server: FakeOpenAIServer) -> Iterator[autellix.OpenAI]:
    with autellix.OpenAI(base_url=server.base_url, api_key="test-key", **FAST_RETRIES) as c:
        yield c
