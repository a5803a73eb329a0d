"""What naming a program from a call's conversation costs the router per call.

Builds ``--programs`` live conversations in one ``ProgramDeriver`` (each an
agent loop: a system prompt, a task, then assistant replies with a tool call
and tool outputs of ``--chars`` characters), then times ``derive`` for the
next call of programs picked at random, each extending its conversation by a
reply and a tool output, as an agent's next step does. Prints the per-call
cost (median, p99, mean, in ms) and checks that every call found its program.

    .venv/bin/python bench/experiments/derived_identity_cost.py --programs 10000
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from autellix_vllm.protocol.paths import CHAT_COMPLETIONS_PATH
from autellix_vllm.router.derived import ProgramDeriver


def step(rng: random.Random, number: int, chars: int) -> list[dict[str, Any]]:
    """One agent step: the model's tool call and the tool's output."""
    call_id = f"call_{rng.getrandbits(64):x}"
    output = "".join(rng.choices("abcdefghij \n", k=chars))
    return [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "run", "arguments": json.dumps({"step": number})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]  # fmt: skip


def measure(programs: int, steps: int, calls: int, chars: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    deriver = ProgramDeriver(idle_end_s=300)
    system = {"role": "system", "content": "You are a coding agent. " * 40}
    conversations: list[list[dict[str, Any]]] = []
    owners: list[str] = []
    for number in range(programs):
        messages = [system, {"role": "user", "content": f"Task {number}: fix the failing test."}]
        first = deriver.derive(CHAT_COMPLETIONS_PATH, {"messages": messages}, {}, "key")
        assert first is not None
        owners.append(first.program_id)
        for turn in range(steps):
            messages = [*messages, *step(rng, turn, chars)]
            deriver.derive(CHAT_COMPLETIONS_PATH, {"messages": messages}, {}, "key")
        conversations.append(messages)
    found = 0
    costs = []
    for _ in range(calls):
        number = rng.randrange(programs)
        messages = conversations[number]
        body = {"messages": messages}
        started = time.perf_counter()
        derived = deriver.derive(CHAT_COMPLETIONS_PATH, body, {}, "key")
        costs.append(time.perf_counter() - started)
        assert derived is not None
        found += derived.program_id == owners[number]
        conversations[number] = [*messages, *step(rng, steps, chars)]
    costs_ms = sorted(cost * 1000 for cost in costs)
    return {
        "programs": programs,
        "messages_per_call": 2 + 2 * steps,
        "chars_per_tool_output": chars,
        "calls": calls,
        "found_its_program": found,
        "median_ms": round(statistics.median(costs_ms), 4),
        "p99_ms": round(costs_ms[int(0.99 * (len(costs_ms) - 1))], 4),
        "mean_ms": round(statistics.fmean(costs_ms), 4),
        "derived_programs": len(deriver),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=10_000, help="live conversations")
    parser.add_argument("--steps", type=int, default=10, help="agent steps each has taken")
    parser.add_argument("--calls", type=int, default=5_000, help="calls timed")
    parser.add_argument("--chars", type=int, default=2_000, help="characters per tool output")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.programs, args.steps, args.calls, args.chars, args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
