"""The soak's honest agents (key ``alice``): SDK programs, single-threaded chains
and fork/join, started at a steady rate; a program is lost when it raises anything
but a documented outcome.

Part of ``autellix bench soak`` (:mod:`autellix_vllm.bench.soak`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from autellix import AsyncOpenAI, current_program, program

from autellix_vllm.protocol.openai_errors import MID_STREAM_FAILURE_CODE

CHAIN_STEPS = 3
FANOUT = 3
# Outcomes that are documented and that the run itself causes: not lost.
EXPECTED_FAILURES = frozenset({MID_STREAM_FAILURE_CODE})


def failure_kind(error: BaseException) -> str:
    """A short name for what a program raised: the error code when there is one."""
    code = getattr(error, "code", None)
    status = getattr(error, "status_code", None)
    parts = [str(part) for part in (status, code) if part is not None]
    return " ".join(parts) if parts else type(error).__name__


@dataclass
class HonestAgents:
    """Programs of key ``alice``, made with the SDK as an agent author would."""

    client: AsyncOpenAI
    model: str
    max_tokens: int
    started: Counter[str] = field(default_factory=Counter)
    completed: int = 0
    calls: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    # Failed programs: (seconds into the run, kind), to place them against the kill.
    failure_times: list[tuple[float, str]] = field(default_factory=list)
    # Ids of the programs running now: the misbehaving client's victims.
    live: set[str] = field(default_factory=set)
    # Reads a program's engine rows; called once per program, after its first
    # answer, when the engine has charged that call and the program has not ended.
    look_up: Callable[[list[str]], Awaitable[None]] | None = None
    looked_up: set[str] = field(default_factory=set)  # live programs already read

    async def wait_for_live(self, within_s: float) -> None:
        """Return once a program runs, or after ``within_s`` (the agents arrive one
        at a time, so a round of the misbehaving client may fall between two)."""
        deadline = time.monotonic() + within_s
        while not self.live and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def ask(self, prompt: str) -> str:
        answer = await self.client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=self.max_tokens,
        )
        self.calls += 1
        await self._look_up_once()
        return answer.choices[0].message.content or ""

    async def _look_up_once(self) -> None:
        program_id = current_program()
        if self.look_up is not None and program_id and program_id not in self.looked_up:
            self.looked_up.add(program_id)
            await self.look_up([program_id])

    async def ask_streamed(self, prompt: str) -> str:
        stream = await self.client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=self.max_tokens,
            stream=True,
        )
        text = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        self.calls += 1
        return "".join(text)

    async def chain(self, task: str) -> None:
        """One thread: each call continues from the answer before it."""
        text = task
        for step in range(CHAIN_STEPS):
            text = f"{task}, step {step}: {(await self.ask(text))[-64:]}"

    async def fork_join(self, task: str) -> None:
        """A plan, three child threads at once, then a streamed merge on the main thread."""
        plan = await self.ask(f"plan {task}")
        parts = await asyncio.gather(
            *(self.ask(f"{task}, part {i}: {plan[-32:]}") for i in range(FANOUT))
        )
        await self.ask_streamed(f"merge {task}: " + " | ".join(p[-16:] for p in parts))

    async def run_one(self, number: int, kind: str, began: float) -> None:
        body: Callable[[str], Awaitable[None]] = getattr(self, kind)

        async def agent(task: str) -> None:
            program_id = current_program()
            assert program_id is not None
            self.live.add(program_id)
            try:
                await body(task)
            finally:
                self.live.discard(program_id)
                self.looked_up.discard(program_id)

        self.started[kind] += 1
        try:
            await program(name=kind, client=self.client)(agent)(f"task {number}")
        except Exception as error:  # every kind is counted and reported
            kind_name = failure_kind(error)
            self.failures[kind_name] += 1
            self.failure_times.append((round(time.monotonic() - began, 1), kind_name))
        else:
            self.completed += 1

    async def arrive(
        self, duration_s: float, rate: float, rng: random.Random, began: float, drain_s: float
    ) -> int:
        """Start programs at ``rate`` per second for ``duration_s``, then wait for them;
        returns how many were still running after ``drain_s`` more (those are cancelled)."""
        running: set[asyncio.Task[None]] = set()
        number = 0
        while (due := began + number / rate) < began + duration_s:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            kind = rng.choice(("chain", "fork_join"))
            task = asyncio.create_task(self.run_one(number, kind, began))
            running.add(task)
            task.add_done_callback(running.discard)
            number += 1
        if not running:
            return 0
        _, unfinished = await asyncio.wait(set(running), timeout=drain_s)
        for task in unfinished:
            task.cancel()
        return len(unfinished)

    @property
    def programs(self) -> int:
        return sum(self.started.values())

    @property
    def lost(self) -> int:
        return sum(n for kind, n in self.failures.items() if kind not in EXPECTED_FAILURES)
