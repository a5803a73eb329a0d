"""Seeded synthetic workloads with the statistics the paper reports (its Table 2).

=========  ==============  ===============  =====================  ============
workload   threads         calls/program    prompt (new) / decode  tool gap
=========  ==============  ===============  =====================  ============
sharegpt   single          mean 6.66, <=80  256 new/turn / 277     none
bfcl       single          mean 10.75, <=70 400 system + 60 / 34   exp, 0.5 s
lats       fork/join tree  mean ~160        350 + path / 72        exp, 0.05 s
mixed      an equal mix of the three
=========  ==============  ===============  =====================  ============

Calls per program follow a truncated power law (heavy-tailed, as in the paper's
distributions); token counts are log-normal. A call's prompt is its program's
history (earlier prompts' new tokens and outputs) plus its own new tokens, so a
program's later calls are long and worth a prefix-cache hit. Program arrivals
are Poisson. The content of program i depends only on the seed and i, not on
the rate or the count: a longer trace extends a shorter one, and another rate
only scales the arrival times.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from functools import cache

from .trace import CallSpec, ProgramSpec

WORKLOADS = ("sharegpt", "bfcl", "lats", "mixed")
MAX_CONTEXT = 8192  # a common max_model_len for 8B chat serving; history is truncated


@cache
def _power_law(max_n: int, mean: float) -> tuple[list[int], list[float]]:
    """Support and cumulative weights of P(n) ~ n^-a on 1..max_n with the given mean."""
    support = list(range(1, max_n + 1))

    def mean_for(a: float) -> float:
        w = [n**-a for n in support]
        return sum(n * x for n, x in zip(support, w, strict=True)) / sum(w)

    lo, hi = 0.0, 5.0  # mean_for decreases in a
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_for(mid) > mean else (lo, mid)
    weights = [n**-lo for n in support]
    cumulative, total = [], 0.0
    for w in weights:
        total += w
        cumulative.append(total)
    return support, cumulative


def _calls(rng: random.Random, max_n: int, mean: float) -> int:
    support, cumulative = _power_law(max_n, mean)
    return rng.choices(support, cum_weights=cumulative)[0]


def _lognormal(rng: random.Random, mean: float, sigma: float, lo: int, hi: int) -> int:
    mu = math.log(mean) - sigma * sigma / 2
    return int(min(hi, max(lo, round(rng.lognormvariate(mu, sigma)))))


def _chain(
    rng: random.Random, pid: str, n: int, system: int, new: float, decode: float,
    decode_sigma: float, gap: float,
) -> tuple[CallSpec, ...]:
    """A single-threaded conversation: each call follows the previous one."""
    calls, history = [], system
    for j in range(n):
        prompt = min(MAX_CONTEXT, history + _lognormal(rng, new, 0.9, 4, 2048))
        out = _lognormal(rng, decode, decode_sigma, 1, 1024)
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
    return _chain(rng, pid, _calls(rng, 80, 6.66), 0, 256, 277, 0.8, 0.0)


def bfcl(rng: random.Random, pid: str) -> tuple[CallSpec, ...]:
    """A ReAct tool-use episode: long system prompt with tool specs, short outputs."""
    return _chain(rng, pid, _calls(rng, 70, 10.75), 400, 60, 34, 0.6, 0.5)


def lats(rng: random.Random, pid: str) -> tuple[CallSpec, ...]:
    """A LATS tree search: each iteration forks k children (generate, then value)
    in parallel threads and joins them into a reflection call on the main thread."""
    width = 5
    iterations = _lognormal(rng, 14.5, 0.6, 1, 40)
    calls = [CallSpec(f"{pid}.root", _lognormal(rng, 72, 0.5, 4, 512), 350)]
    last_main = calls[0].id
    for it in range(iterations):
        path = 350 + 40 * (it // 2 + 1)
        values = []
        for j in range(width):
            thread = f"i{it}.t{j}"
            gen = CallSpec(
                f"{pid}.i{it}.g{j}", _lognormal(rng, 72, 0.5, 4, 512), path,
                thread=thread, parent_thread="main", after=(last_main,),
            )
            value = CallSpec(
                f"{pid}.i{it}.v{j}", _lognormal(rng, 72, 0.5, 4, 512), path + gen.decode_tokens,
                thread=thread, parent_thread="main", after=(gen.id,),
                tool_gap=rng.expovariate(1 / 0.05),
            )
            calls += [gen, value]
            values.append(value.id)
        reflect = CallSpec(
            f"{pid}.i{it}.r", _lognormal(rng, 72, 0.5, 4, 512), path + 100, after=tuple(values)
        )
        calls.append(reflect)
        last_main = reflect.id
    return tuple(calls)


_GENERATORS: dict[str, Callable[[random.Random, str], tuple[CallSpec, ...]]] = {
    "sharegpt": sharegpt,
    "bfcl": bfcl,
    "lats": lats,
}


def generate(workload: str, programs: int, rate: float, seed: int = 0) -> list[ProgramSpec]:
    """``programs`` programs of ``workload`` with Poisson arrivals at ``rate`` per second."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r} (choose from {', '.join(WORKLOADS)})")
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if programs < 1:
        raise ValueError(f"need at least one program, got {programs}")
    content = random.Random(f"{workload}/{seed}/content")
    arrivals = random.Random(f"{workload}/{seed}/arrivals")
    out, t = [], 0.0
    mix: list[str] = []
    for i in range(programs):
        if workload == "mixed":
            if not mix:  # an equal mix, shuffled in blocks of three
                mix = ["sharegpt", "bfcl", "lats"]
                content.shuffle(mix)
            kind = mix.pop()
        else:
            kind = workload
        pid = f"{kind}-{i}"
        out.append(ProgramSpec(pid, t / rate, _GENERATORS[kind](content, pid), kind=kind))
        t += arrivals.expovariate(1.0)
    return out


def at_rate(programs: list[ProgramSpec], scale: float) -> list[ProgramSpec]:
    """The same programs with arrival times multiplied by ``scale``."""
    return [ProgramSpec(p.program_id, p.arrival * scale, p.calls, p.kind) for p in programs]
