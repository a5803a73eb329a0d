"""Calibrate the simulator's ``cpu-tiny`` preset: ``autellix bench cpu-preset``.

Starts one real engine (stock FCFS scheduling, the tiny random-weight model),
then measures:

* the decode step time at batch sizes 1, 2, 4 and 8: b concurrent requests
  decoding 144 tokens minus b decoding 16, over the 128 extra tokens (median of
  three rounds each), fitted as ``step_base + per_decode * b``;
* the prefill cost per prompt token (time to the first token of a long prompt,
  minus one base step, over the prompt length).

Reports, in seconds, the fitted ``step_base``, ``per_decode`` and
``per_prefill`` that :mod:`autellix_vllm.sim.presets` records for ``cpu-tiny``.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import openai

from autellix_vllm.engine.launcher import EngineConfig, EngineProcess

BATCHES = (1, 2, 4, 8)
SHORT, LONG = 16, 144  # decode lengths whose difference isolates the decode steps
PROMPT_TOKENS = 900  # the tiny model's tokenizer has one token per character


async def batch_time(client: openai.AsyncOpenAI, model: str, batch: int, tokens: int) -> float:
    """Wall time of ``batch`` concurrent requests that each decode ``tokens`` tokens."""
    t0 = time.perf_counter()
    await asyncio.gather(
        *(
            client.completions.create(
                model=model, prompt=f"{i} hello", max_tokens=tokens,
                extra_body={"ignore_eos": True},
            )
            for i in range(batch)
        )
    )
    return time.perf_counter() - t0


async def decode_step(client: openai.AsyncOpenAI, model: str, batch: int) -> float:
    """One decode step at ``batch`` sequences: the extra time of decoding LONG
    instead of SHORT tokens, per extra token (prefill and HTTP costs cancel out)."""
    short = statistics.median([await batch_time(client, model, batch, SHORT) for _ in range(3)])
    long = statistics.median([await batch_time(client, model, batch, LONG) for _ in range(3)])
    return (long - short) / (LONG - SHORT)


async def measure(base_url: str, model: str) -> dict[str, float]:
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="-", max_retries=0)
    steps = {batch: await decode_step(client, model, batch) for batch in BATCHES}
    n = len(BATCHES)
    mean_b = sum(BATCHES) / n
    mean_t = sum(steps.values()) / n
    slope = sum((b - mean_b) * (steps[b] - mean_t) for b in BATCHES) / sum(
        (b - mean_b) ** 2 for b in BATCHES
    )
    base = mean_t - slope * mean_b
    prefill = []
    for i in range(5):
        t0 = time.perf_counter()
        await client.completions.create(
            model=model, prompt=chr(65 + i) * PROMPT_TOKENS, max_tokens=1
        )
        prefill.append(time.perf_counter() - t0)
    per_prefill = max(0.0, (statistics.median(prefill) - base) / PROMPT_TOKENS)
    await client.close()
    return {
        "step_base": base,
        "per_decode": max(0.0, slope),
        "per_prefill": per_prefill,
        **{f"step_at_batch_{b}": t for b, t in steps.items()},
    }


def calibrate_cpu_preset() -> dict[str, float]:
    """Start the embedded engine and fit the preset's step costs (seconds)."""
    config = EngineConfig(port=0, scheduler="fcfs", max_num_seqs=8, max_model_len=1024)
    with EngineProcess(config) as engine:
        return asyncio.run(measure(engine.base_url, engine.served_model_name))
