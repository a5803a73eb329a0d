"""Calibrate a simulator ``cpu-*`` preset: ``autellix bench cpu-preset [--model M]``.

Starts one real engine (stock FCFS scheduling; the tiny random-weight model for
``cpu-tiny``, ``--model smollm2`` for ``cpu-smollm2``), then measures:

* the decode step time at batch sizes 1, 2, 4 and 8: b concurrent requests
  decoding 144 tokens minus b decoding 16, over the 128 extra tokens (median of
  three rounds each), fitted as ``step_base + per_decode * b``;
* the prefill cost: the time to the first token of prompts of 32 to 2,400
  tokens (medians of five prompts no cache holds), fitted as a constant (HTTP
  and step overheads) + ``per_prefill`` per prompt token + ``per_prefill_pair``
  per (token, earlier token it attends to) pair, n(n+1)/2 for n tokens: the
  attention that makes a long prompt's tokens dearer than a short one's.

* the decode step at 4 sequences whose prompts are ``PROMPT_TOKENS`` long, the
  same way: how much a step's cost grows with the context its decodes attend
  over (``per_context_token``: the extra time over the extra context tokens).

Prompts are token ids from the model's vocabulary, so their lengths are exact.
Reports, in seconds, the fitted ``step_base``, ``per_decode``, ``per_prefill``,
``per_prefill_pair`` and ``per_context_token`` that
:mod:`autellix_vllm.sim.presets` records, and the measured first-token times.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import numpy as np
import openai

from autellix_vllm.bench.replay import PromptVocabulary
from autellix_vllm.engine.launcher import EngineConfig, EngineProcess

BATCHES = (1, 2, 4, 8)
CONTEXT_BATCH = 4  # sequences of the long-context decode measurement
SHORT, LONG = 16, 144  # decode lengths whose difference isolates the decode steps
PROMPT_TOKENS = 800  # decode context of the long-context step measurement
SHORT_PROMPT_TOKENS = 2
PREFILL_LENGTHS = (32, 800, 1600, 2400)  # prompts timed to their first token
MAX_MODEL_LEN = 2560  # the longest prompt, with room to spare


async def batch_time(
    client: openai.AsyncOpenAI, model: str, prompts: list[list[int]], tokens: int
) -> float:
    """Wall time of one concurrent request per prompt, each decoding ``tokens`` tokens."""
    t0 = time.perf_counter()
    await asyncio.gather(
        *(
            client.completions.create(
                model=model, prompt=prompt, max_tokens=tokens, extra_body={"ignore_eos": True}
            )
            for prompt in prompts
        )
    )
    return time.perf_counter() - t0


async def decode_step(client: openai.AsyncOpenAI, model: str, prompts: list[list[int]]) -> float:
    """One decode step at ``len(prompts)`` sequences: the extra time of decoding LONG
    instead of SHORT tokens, per extra token (prefill and HTTP costs cancel out;
    the prompts are cached after the first round)."""
    short = statistics.median([await batch_time(client, model, prompts, SHORT) for _ in range(3)])
    long = statistics.median([await batch_time(client, model, prompts, LONG) for _ in range(3)])
    return (long - short) / (LONG - SHORT)


async def measure(base_url: str, model: str, vocabulary: PromptVocabulary) -> dict[str, float]:
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="-", max_retries=0)

    def prompts(count: int, length: int) -> list[list[int]]:
        return [vocabulary.transcript(f"{length}/{i}", length) for i in range(count)]

    steps = {
        batch: await decode_step(client, model, prompts(batch, SHORT_PROMPT_TOKENS))
        for batch in BATCHES
    }
    n = len(BATCHES)
    mean_b = sum(BATCHES) / n
    mean_t = sum(steps.values()) / n
    slope = sum((b - mean_b) * (steps[b] - mean_t) for b in BATCHES) / sum(
        (b - mean_b) ** 2 for b in BATCHES
    )
    base = mean_t - slope * mean_b

    async def first_token_s(length: int) -> float:
        times = []
        for prompt in prompts(5, length):  # prompts no cache holds
            t0 = time.perf_counter()
            await client.completions.create(model=model, prompt=prompt, max_tokens=1)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    first_token = {length: await first_token_s(length) for length in PREFILL_LENGTHS}
    per_prefill, per_prefill_pair = fit_prefill(first_token)
    long_context = await decode_step(client, model, prompts(CONTEXT_BATCH, PROMPT_TOKENS))
    # The extra context each step's decodes read: the longer prompts' extra tokens
    # (both runs decode the same tokens on top).
    extra_context = CONTEXT_BATCH * (PROMPT_TOKENS - SHORT_PROMPT_TOKENS)
    await client.close()
    return {
        "step_base": base,
        "per_decode": max(0.0, slope),
        "per_prefill": max(0.0, per_prefill),
        "per_prefill_pair": max(0.0, per_prefill_pair),
        "per_context_token": max(0.0, (long_context - steps[CONTEXT_BATCH]) / extra_context),
        **{f"step_at_batch_{b}": t for b, t in steps.items()},
        f"step_at_batch_{CONTEXT_BATCH}_context_{PROMPT_TOKENS}": long_context,
        **{f"first_token_at_{n}": t for n, t in first_token.items()},
    }


def fit_prefill(first_token_s: dict[int, float]) -> tuple[float, float]:
    """Least squares of ``t(n) = c + per_prefill * n + per_prefill_pair * n(n+1)/2``
    over (prompt length n, time to its first token t): ``(per_prefill,
    per_prefill_pair)``. Needs three lengths or more."""
    if len(first_token_s) < 3:
        raise ValueError("fitting a prefill's cost needs three prompt lengths or more")
    lengths = np.array(list(first_token_s), dtype=float)
    design = np.column_stack([np.ones_like(lengths), lengths, lengths * (lengths + 1) / 2])
    times = np.array(list(first_token_s.values()))
    (_, per_token, per_pair), *_ = np.linalg.lstsq(design, times, rcond=None)
    return float(per_token), float(per_pair)


def calibrate_cpu_preset(model: str = "tiny") -> dict[str, float]:
    """Start a CPU engine on ``model`` and fit the preset's step costs (seconds)."""
    config = EngineConfig(
        model=model,
        port=0,
        scheduler="fcfs",
        max_num_seqs=8,
        max_model_len=MAX_MODEL_LEN,
        device="cpu",
    )
    with EngineProcess(config) as engine:
        vocabulary = PromptVocabulary.of_model(engine.model.path)
        return asyncio.run(measure(engine.base_url, engine.served_model_name, vocabulary))
