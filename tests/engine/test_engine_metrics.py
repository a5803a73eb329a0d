"""The engine's holds on its Prometheus ``/metrics``, against the shared real CPU
engine (tests/conftest.py ``engine``; its default policy is KV-aware)."""

import asyncio
import uuid

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.engine

# Characters of a prompt that fills two of the CPU build's 128-token KV blocks
# (the tiny model's tokenizer is character-level): only full blocks are held.
PROMPT_CHARS = 300


async def scrape(engine) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The engine's ``autellix_*`` samples: (name, labels) -> value."""
    async with aiohttp.ClientSession() as http, http.get(engine.base_url + "/metrics") as answer:
        assert answer.status == 200
        text = await answer.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("autellix_")
        for sample in family.samples
    }


def granted(samples) -> float:
    return samples.get(("autellix_holds_total", (("event", "granted"),)), 0.0)


def held_blocks(samples) -> float:
    return samples[("autellix_held_blocks", ())]


async def scrape_until(engine, condition, timeout_s=10.0):
    """Scrape until ``condition(samples)`` holds (the series are refreshed from the
    engine about once a second); the last samples either way."""
    for _ in range(int(timeout_s / 0.25)):
        samples = await scrape(engine)
        if condition(samples):
            break
        await asyncio.sleep(0.25)
    return samples


async def test_holding_a_programs_context_moves_the_hold_series(engine):
    before = await scrape_until(engine, lambda s: ("autellix_held_blocks", ()) in s)
    program_id = f"held-{uuid.uuid4().hex[:8]}"
    async with openai.AsyncOpenAI(
        base_url=engine.base_url + "/v1", api_key="unused", max_retries=0
    ) as client:
        await client.completions.create(
            model=engine.served_model_name,
            prompt="x" * PROMPT_CHARS,
            max_tokens=2,
            extra_headers={"X-Autellix-Program-Id": program_id},
        )
    held = await scrape_until(engine, lambda s: granted(s) > granted(before))
    assert granted(held) > granted(before)
    # Its own hold's blocks at least (an earlier test's hold may have expired, or
    # been broken for this program's first call, meanwhile).
    assert held_blocks(held) >= 2
    assert ("autellix_held_programs", ()) in held

    url = f"{engine.base_url}/autellix/v1/engine/programs/{program_id}"
    async with aiohttp.ClientSession() as http, http.delete(url) as answer:
        assert answer.status == 200  # ending the program ends its hold
    released = await scrape_until(engine, lambda s: held_blocks(s) <= held_blocks(held) - 2)
    assert held_blocks(released) <= held_blocks(held) - 2
