"""Single-threaded agents: each call follows the previous one (sharegpt, bfcl)."""

from __future__ import annotations

import random

from .sampling import lognormal, power_law_count
from .trace import CallSpec

MAX_CONTEXT = 8192  # a common max_model_len for 8B chat serving; history is truncated


def chain(
    rng: random.Random, pid: str, n: int, system: int, new: float, decode: float,
    decode_sigma: float, gap: float,
) -> tuple[CallSpec, ...]:
    """``n`` calls, each prompted with the history so far plus its own new tokens."""
    calls, history = [], system
    for j in range(n):
        prompt = min(MAX_CONTEXT, history + lognormal(rng, new, 0.9, 4, 2048))
        out = lognormal(rng, decode, decode_sigma, 1, 1024)
        calls.append(
            CallSpec(
                id=f"{pid}.c{j}",
                decode_tokens=out,
                prompt_tokens=prompt,
                after=(f"{pid}.c{j - 1}",) if j else (),
                tool_gap=rng.expovariate(1 / gap) if (gap and j) else 0.0,
            )
        )
        history = prompt + out
    return tuple(calls)


def sharegpt(rng: random.Random, pid: str) -> tuple[CallSpec, ...]:
    """A chat conversation: decode-heavy turns, replayed back to back."""
    return chain(rng, pid, power_law_count(rng, 80, 6.66), 0, 256, 277, 0.8, 0.0)


def bfcl(rng: random.Random, pid: str) -> tuple[CallSpec, ...]:
    """A ReAct tool-use episode: long system prompt with tool specs, short outputs."""
    return chain(rng, pid, power_law_count(rng, 70, 10.75), 400, 60, 34, 0.6, 0.5)
