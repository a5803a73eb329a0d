"""How long the policy core takes per scheduling step (``autellix simulate bench-policy``).

The default case: 256 running and 1,000 waiting calls from 500 programs.
One step does what the engine's scheduler asks of the core every step: move the
wait clock (anti-starvation), charge every running call one decode token
(demotions), pick the calls a waiter should preempt, and replace the calls that
finished with the best waiting ones, while new calls keep the queue at 1,000.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from ..policy import DEFAULT_POLICY, PolicyConfig, ProgramScheduler, make_policy
from ..protocol.identity import CallIdentity
from ..stats import percentile


def bench_policy(
    running: int = 256,
    waiting: int = 1000,
    programs: int = 500,
    steps: int = 2000,
    finish_per_step: int = 4,
    policy: str = DEFAULT_POLICY,
    seed: int = 0,
) -> dict[str, Any]:
    rng = random.Random(seed)
    core = ProgramScheduler(make_policy(policy), PolicyConfig())
    ids = (f"c{i}" for i in range(10**9))
    now = 0.0

    def arrive() -> None:
        pid = f"p{rng.randrange(programs)}"
        identity = CallIdentity(pid, thread_id=f"t{rng.randrange(4)}", call_id=next(ids))
        call = core.add_call(identity, now)
        call.payload = rng.randint(16, 512)  # decode tokens it will run
        core.enqueue(call)

    for _ in range(running + waiting):
        arrive()
    batch = []
    for _ in range(running):
        call = core.pop()
        core.start(call)
        batch.append(call)

    times = []
    for _ in range(steps):
        now += 0.02
        t0 = time.perf_counter()
        core.advance(now)
        for call in batch:
            core.charge(call, decode_tokens=1)
        for victim in core.victims(batch, 0):
            batch.remove(victim)
            core.preempt(victim)
        done = [c for c in batch if c.service >= c.payload][:finish_per_step]
        for call in done:
            batch.remove(call)
            core.finish(call, now)
        while len(batch) < running and core.waiting:
            call = core.pop()
            core.start(call)
            batch.append(call)
        times.append(time.perf_counter() - t0)
        for _ in range(running + waiting - len(batch) - len(core.waiting)):
            arrive()  # outside the timed part: arrivals happen between steps
    return {
        "running": running,
        "waiting": len(core.waiting),
        "steps": steps,
        "policy": policy,
        "median_ms_per_step": statistics.median(times) * 1e3,
        "p99_ms_per_step": percentile(times, 99) * 1e3,
        "preemptions": core.counters.preemptions,
        "promotions": core.counters.promotions,
        "demotions": core.counters.demotions,
    }
