"""Multi-threaded agents: a tree search that forks and joins threads (lats)."""

from __future__ import annotations

import random

from .sampling import lognormal
from .trace import CallSpec


def lats(rng: random.Random, pid: str) -> tuple[CallSpec, ...]:
    """A LATS tree search: each iteration forks k children (generate, then value)
    in parallel threads and joins them into a reflection call on the main thread."""
    width = 5
    iterations = lognormal(rng, 14.5, 0.6, 1, 40)
    calls = [CallSpec(f"{pid}.root", lognormal(rng, 72, 0.5, 4, 512), 350)]
    last_main = calls[0].id
    for it in range(iterations):
        path = 350 + 40 * (it // 2 + 1)
        values = []
        for j in range(width):
            thread = f"i{it}.t{j}"
            gen = CallSpec(
                f"{pid}.i{it}.g{j}", lognormal(rng, 72, 0.5, 4, 512), path,
                thread=thread, parent_thread="main", after=(last_main,),
            )
            value = CallSpec(
                f"{pid}.i{it}.v{j}", lognormal(rng, 72, 0.5, 4, 512), path + gen.decode_tokens,
                thread=thread, parent_thread="main", after=(gen.id,),
                tool_gap=rng.expovariate(1 / 0.05),
            )
            calls += [gen, value]
            values.append(value.id)
        reflect = CallSpec(
            f"{pid}.i{it}.r", lognormal(rng, 72, 0.5, 4, 512), path + 100, after=tuple(values)
        )
        calls.append(reflect)
        last_main = reflect.id
    return tuple(calls)
