"""The named workloads and the seeded traces they generate.

The statistics of the first four follow the paper's Table 2:

=========  ================  ===============  ======================  ==================
workload   threads           calls/program    prompt (new) / decode   tool gap
=========  ================  ===============  ======================  ==================
sharegpt   single            mean 6.66, <=80  256 new/turn / 277      none
bfcl       single            mean 10.75, <=70 400 system + 60 / 34    exp, 0.5 s
lats       fork/join tree    mean ~160        350 + path / 72         exp, 0.05 s
mixed      an equal mix of the three
agent      main + subagents  median 42 turns  8k system + 1.5k / 230  86% < 1 s, <= 300 s
chat       single            66% 1, mean 2.15 53 new / 323 (medians)  think, median 30 s
=========  ================  ===============  ======================  ==================

``agent`` follows 2026 coding-agent traffic instead (module ``agent_sessions``):
its contexts grow to the model's maximum. ``chat`` follows public chat logs
(LMSYS-Chat-1M, WildChat; module ``chat_logs``): two thirds of its
conversations have one turn, and users think for seconds to minutes between
turns.

Calls per program follow a truncated power law (heavy-tailed, as in the paper's
distributions); token counts are log-normal. A call's prompt is its program's
history (earlier prompts' new tokens and outputs) plus its own new tokens, so a
program's later calls are long and worth a prefix-cache hit. Program arrivals
are Poisson. The content of program i depends only on the seed and i, not on
the rate or the count: a longer trace extends a shorter one, and another rate
only scales the arrival times.

A workload is a :class:`WorkloadSpec` in :data:`WORKLOAD_SPECS`: how one
program is generated (a function of the family modules ``conversations``,
``tree_search``, ``agent_sessions`` and ``chat_logs``, or a mix of other workloads) and the
defaults the commands use for it. Adding one there is all a new workload
needs; the CLIs, the sweep and the benchmarks take their choices and defaults
from it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from ..registry import lookup
from .agent_sessions import AGENT_MAX_CONTEXT, agent
from .chat_logs import CHAT_MAX_CONTEXT, chat
from .conversations import MAX_CONTEXT, bfcl, sharegpt
from .trace import CallSpec, ProgramSpec
from .tree_search import lats

__all__ = [
    "AGENT_MAX_CONTEXT",
    "CHAT_MAX_CONTEXT",
    "MAX_CONTEXT",
    "WORKLOADS",
    "WORKLOAD_SPECS",
    "ProgramGenerator",
    "WorkloadSpec",
    "agent",
    "at_rate",
    "bfcl",
    "chat",
    "generate",
    "get_workload",
    "lats",
    "sharegpt",
    "with_owners",
]

# One program's calls, drawn from the workload's content generator; the id
# prefixes its call ids. A workload with ``max_context`` also passes it the
# longest context a call may have, as a third argument.
ProgramGenerator = Callable[..., tuple[CallSpec, ...]]


@dataclass(frozen=True)
class WorkloadSpec:
    """A named workload: how its programs are made, and its defaults."""

    name: str
    description: str
    # Programs in an `autellix simulate run` trace unless --programs says otherwise.
    programs: int
    # Seconds of arrivals in each trace of `autellix simulate sweep` (--duration).
    sweep_seconds: float
    # One program of this workload; or, with ``mix``, none of its own.
    program: ProgramGenerator | None = None
    # An equal mix of these workloads: every block of len(mix) programs holds
    # one of each, in shuffled order.
    mix: tuple[WorkloadSpec, ...] = ()
    # For contexts that grow to the model's maximum: the default longest context
    # (prompt and output) of a call, which ``generate(max_context=...)`` overrides.
    max_context: int | None = None
    # Programs per second at which `simulate sweep` measures the unloaded latency
    # (None: 1/20 of the engines' nominal capacity). For workloads whose rate the KV,
    # not compute, bounds: at 1/20 of the compute capacity they already thrash.
    unloaded_rate: float | None = None

    def __post_init__(self) -> None:
        if (self.program is None) == (not self.mix):
            raise ValueError(f"workload {self.name!r}: give either a program generator or a mix")
        if any(part.mix for part in self.mix):
            raise ValueError(f"workload {self.name!r}: a mix cannot hold another mix")

    def parts(self, rng: random.Random) -> Iterator[WorkloadSpec]:
        """The workload of each successive program: this one, or its mix's parts."""
        if not self.mix:
            yield from itertools.repeat(self)
        while True:
            block = list(self.mix)
            rng.shuffle(block)
            yield from reversed(block)

    @property
    def context_limited(self) -> bool:
        """Whether its contexts grow to a model's maximum (``max_context`` applies)."""
        return any(part.max_context is not None for part in (*self.mix, self))

    def calls(
        self, rng: random.Random, program_id: str, max_context: int | None = None
    ) -> tuple[CallSpec, ...]:
        """One program's calls (a mix has none of its own: :meth:`parts` picks them)."""
        if self.program is None:
            raise TypeError(f"workload {self.name!r} is a mix: generate from its parts")
        if self.max_context is None:
            return self.program(rng, program_id)
        return self.program(rng, program_id, max_context or self.max_context)


_SINGLE_KIND = (
    WorkloadSpec(
        "sharegpt", "chat conversations, decode-heavy", programs=600, sweep_seconds=300.0,
        program=sharegpt,
    ),
    WorkloadSpec(
        "bfcl", "ReAct tool use: long system prompt, short outputs", programs=600,
        sweep_seconds=120.0, program=bfcl,
    ),
    WorkloadSpec(
        "lats", "tree search that forks and joins threads", programs=60, sweep_seconds=200.0,
        program=lats,
    ),
)  # fmt: skip
WORKLOAD_SPECS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        *_SINGLE_KIND,
        WorkloadSpec(
            "mixed", "an equal mix of sharegpt, bfcl and lats", programs=300,
            sweep_seconds=150.0, mix=_SINGLE_KIND,
        ),
        WorkloadSpec(
            "agent", "coding-agent sessions: contexts grow to the model's maximum, subagents",
            programs=40, sweep_seconds=6000.0, program=agent, max_context=AGENT_MAX_CONTEXT,
            unloaded_rate=0.001,
        ),
        WorkloadSpec(
            "chat", "chat logs: mostly one-turn conversations, think time between turns",
            programs=1000, sweep_seconds=150.0, program=chat, max_context=CHAT_MAX_CONTEXT,
        ),
    )
}  # fmt: skip
WORKLOADS = tuple(WORKLOAD_SPECS)


def get_workload(name: str) -> WorkloadSpec:
    return lookup(WORKLOAD_SPECS, name, "workload")


def generate(
    workload: str, programs: int, rate: float, seed: int = 0, max_context: int | None = None
) -> list[ProgramSpec]:
    """``programs`` programs of ``workload`` with Poisson arrivals at ``rate`` per second.

    ``max_context`` caps the contexts of a workload that grows them to the model's
    maximum (``agent``; None: its default).
    """
    spec = get_workload(workload)
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if programs < 1:
        raise ValueError(f"need at least one program, got {programs}")
    if max_context is not None:
        if not spec.context_limited:
            raise ValueError(f"workload {workload} has no context limit to set")
        if max_context < 2:
            raise ValueError(f"max_context must be at least 2 tokens, got {max_context}")
    content = random.Random(f"{workload}/{seed}/content")
    arrivals = random.Random(f"{workload}/{seed}/arrivals")
    parts = spec.parts(content)
    out, t = [], 0.0
    for i in range(programs):
        part = next(parts)
        pid = f"{part.name}-{i}"
        calls = part.calls(content, pid, max_context)
        out.append(ProgramSpec(pid, t / rate, calls, kind=part.name))
        t += arrivals.expovariate(1.0)
    return out


def at_rate(programs: list[ProgramSpec], scale: float) -> list[ProgramSpec]:
    """The same programs with arrival times multiplied by ``scale``."""
    return [replace(p, arrival=p.arrival * scale) for p in programs]


def with_owners(programs: list[ProgramSpec], owners: int) -> list[ProgramSpec]:
    """The same programs run by ``owners`` clients in turn: program i by
    ``owner-{i % owners}`` (as many clients, each with its own key, share a router)."""
    if owners < 1:
        raise ValueError(f"need at least one owner, got {owners}")
    return [replace(p, owner=f"owner-{i % owners}") for i, p in enumerate(programs)]
