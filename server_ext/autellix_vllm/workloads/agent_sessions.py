"""Long-context agent sessions that fork subagents (agent).

Shaped on public 2026 figures for coding-agent traffic (vLLM's AgentX and
Mooncake posts on Codex and SWE-bench-Pro traces, the vLLM router's Progress-TTL
RFC): a median of 43 turns per session, heavy-tailed; a context of ~80k tokens
by turn 30, some sessions past 180k; each turn adds a few hundred to a few
thousand tokens; input:output about 131:1; 86% of a session's next calls within
1 s of the previous response and 95% within 10 s; subagents in 44% of sessions.

A session is a chain of calls on the main thread, each prompted with the whole
context so far: the system prompt and task, then per turn the model's output
and the tool's result. It ends after its drawn number of turns, or before a call
that would not fit the model's context (``max_context``: Llama-3.1-8B's 128k by
default, which about three sessions at their longest fill on an A100-80GB). A
session with subagents forks them after some of its turns: each is a thread with
a fresh context of its own (its own prompt, its own ``context`` in the prefix
cache) that runs a shorter session of the same kind; the main thread's next turn
waits for all of them and adds their final outputs to the main context.
"""

from __future__ import annotations

import math
import random
from statistics import NormalDist

from .sampling import lognormal_median
from .trace import CallSpec

AGENT_MAX_CONTEXT = 131_072  # Llama-3.1-8B's context length

TURNS_MEDIAN, TURNS_SIGMA, TURNS_MAX = 43, 0.8, 400
SYSTEM_MEDIAN = 8000  # system prompt, tool specs and task
TOOL_RESULT_MEDIAN = 1100  # tokens a tool adds to the context per turn
OUTPUT_MEDIAN = 230  # a turn's output: mostly a tool call, sometimes code
SUBAGENT_SHARE = 0.44
SUBAGENT_TURNS_MEDIAN = 8
SUBAGENT_SYSTEM_MEDIAN = 4000
# Tool gaps: a log-normal through P(< 1 s) = 0.86 and P(< 10 s) = 0.95, capped at
# five minutes (a long build or test run).
_Z = NormalDist().inv_cdf
GAP_SIGMA = math.log(10) / (_Z(0.95) - _Z(0.86))
GAP_MU = -_Z(0.86) * GAP_SIGMA
GAP_MAX_S = 300.0


def _gap(rng: random.Random) -> float:
    return min(GAP_MAX_S, rng.lognormvariate(GAP_MU, GAP_SIGMA))


def _output(rng: random.Random) -> int:
    return lognormal_median(rng, OUTPUT_MEDIAN, 1.0, 4, 4096)


def _tool_result(rng: random.Random) -> int:
    return lognormal_median(rng, TOOL_RESULT_MEDIAN, 1.1, 20, 16_000)


def _subagent(
    rng: random.Random, pid: str, thread: str, after: str, max_context: int
) -> list[CallSpec]:
    """A subagent: a short session on its own thread and context, started by ``after``."""
    turns = lognormal_median(rng, SUBAGENT_TURNS_MEDIAN, 0.7, 1, 60)
    context = min(lognormal_median(rng, SUBAGENT_SYSTEM_MEDIAN, 0.4, 500, 16_000), max_context // 2)
    calls: list[CallSpec] = []
    for j in range(turns):
        out = _output(rng)
        if j == 0:
            out = min(out, max_context - context)
        elif context + out > max_context:
            break
        calls.append(
            CallSpec(
                f"{pid}.{thread}.c{j}", out, context, thread=thread, parent_thread="main",
                after=(calls[-1].id if calls else after,), tool_gap=_gap(rng), context=thread,
            )
        )  # fmt: skip
        context += out + _tool_result(rng)
    return calls


def agent(
    rng: random.Random, pid: str, max_context: int = AGENT_MAX_CONTEXT
) -> tuple[CallSpec, ...]:
    """One session: its main thread's turns and the subagents it forks."""
    turns = lognormal_median(rng, TURNS_MEDIAN, TURNS_SIGMA, 1, TURNS_MAX)
    forks: dict[int, int] = {}  # main turn -> subagents it starts
    if turns > 1 and rng.random() < SUBAGENT_SHARE:
        # Early turns, where an agent explores and plans, before the context is full.
        for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
            forks[rng.randrange(min(turns - 1, 30))] = rng.choice((1, 1, 2, 3))
    context = min(lognormal_median(rng, SYSTEM_MEDIAN, 0.3, 2000, 24_000), max_context // 2)
    calls: list[CallSpec] = []
    after: tuple[str, ...] = ()
    gap = 0.0
    for j in range(turns):
        out = _output(rng)
        if j == 0:
            out = min(out, max_context - context)
        elif context + out > max_context:
            break  # the session ran out of context
        call = CallSpec(f"{pid}.m{j}", out, context, after=after, tool_gap=gap)
        calls.append(call)
        context += out
        gap = _gap(rng)
        if j in forks:
            ends = []
            for k in range(forks[j]):
                sub = _subagent(rng, pid, f"sub{j}.{k}", call.id, max_context)
                calls += sub
                ends.append(sub[-1])
            after = tuple(c.id for c in ends)
            context += sum(c.decode_tokens for c in ends)  # their reports
        else:
            after = (call.id,)
            context += _tool_result(rng)
    return tuple(calls)
