"""Scheduler overhead: what the Autellix scheduler adds to each ``schedule()``.

Model-free (see ``autellix_vllm.engine.model_free``): the same requests go
through stock vLLM's scheduler (FCFS, vLLM's default) and through
``AutellixScheduler``, and every step is timed. The batch is full (``running``
calls decoding) and ``waiting`` calls queue behind it, from programs at worse
levels than the running ones, so the measured steps are the steady state:
every step re-checks preemption, charges every running call and keeps the
order, but nothing is preempted. The two schedulers take turns, step by step.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest.mock import patch

from autellix_vllm.protocol.bearer import ENGINE_KEY_VARIABLE
from autellix_vllm.stats import percentile

if TYPE_CHECKING:
    from autellix_vllm.engine._vllm_adapter import Scheduler
    from autellix_vllm.engine.model_free import SchedulerPolicy

BLOCK_SIZE = 16
PROMPT_TOKENS = 32


def measure(
    running: int = 256, waiting: int = 1000, steps: int = 200, warmup: int = 20
) -> dict[str, Any]:
    """Time ``steps`` steps of both schedulers, alternating step by step so that
    background load on the machine hits both alike."""
    from autellix_vllm.engine import _vllm_adapter as adapter
    from autellix_vllm.engine import model_free
    from autellix_vllm.engine.scheduler import AutellixScheduler

    model_dir = model_free.write_config_only_model(Path(tempfile.mkdtemp()) / "model")
    # The waiting programs' prior service puts them in worse levels; an engine
    # honours prior service only with an engine key (engine.settings.engine_key).
    cases: tuple[tuple[str, type[Scheduler], SchedulerPolicy], ...] = (
        ("vllm_fcfs", adapter.Scheduler, "fcfs"),
        ("autellix", AutellixScheduler, "priority"),
    )
    with patch.dict(os.environ, {ENGINE_KEY_VARIABLE: "bench-scheduler"}):
        schedulers = {
            name: model_free.model_free_scheduler(
                cls,
                model_dir,
                max_num_seqs=running,
                num_blocks=running * (warmup + steps + PROMPT_TOKENS) // BLOCK_SIZE * 2 + 1024,
                max_num_batched_tokens=max(8192, running * PROMPT_TOKENS),
                max_model_len=4096,
                block_size=BLOCK_SIZE,
                policy=policy,
            )
            for name, cls, policy in cases
        }
    for scheduler in schedulers.values():
        _fill(scheduler, running, waiting, warmup)
    schedule_s: dict[str, list[float]] = {name: [] for name in schedulers}
    step_s: dict[str, list[float]] = {name: [] for name in schedulers}
    for _ in range(steps):
        for name, scheduler in schedulers.items():
            start = time.perf_counter()
            output = scheduler.schedule()
            scheduled = time.perf_counter()
            model_free.finish_step(scheduler, output)
            done = time.perf_counter()
            assert not output.preempted_req_ids and len(output.num_scheduled_tokens) == running
            schedule_s[name].append(scheduled - start)
            step_s[name].append(done - start)
    result: dict[str, Any] = {"running": running, "waiting": waiting, "steps": steps}
    for name in schedulers:
        result[name] = {
            "schedule_ms_median": 1000 * statistics.median(schedule_s[name]),
            "schedule_ms_p95": 1000 * percentile(schedule_s[name], 95),
            "step_ms_median": 1000 * statistics.median(step_s[name]),
        }
    stock, ours = result["vllm_fcfs"], result["autellix"]
    result["added_schedule_ms"] = ours["schedule_ms_median"] - stock["schedule_ms_median"]
    result["added_step_ms"] = ours["step_ms_median"] - stock["step_ms_median"]
    return result


def _fill(scheduler: Any, running: int, waiting: int, warmup: int) -> None:
    """A full batch of fresh programs, then ``waiting`` calls of older programs."""
    from autellix_vllm.engine import model_free

    def add(i: int, prior_service: float) -> None:
        xargs = {"autellix_program_id": f"p{i}", "autellix_prior_service": prior_service}
        scheduler.add_request(
            model_free.new_request(
                f"r{i}",
                [1 + i % 90] * PROMPT_TOKENS,
                max_tokens=4000 - PROMPT_TOKENS,
                extra_args=xargs,
                arrival_time=float(i),
                block_size=BLOCK_SIZE,
            )
        )

    for i in range(running):  # fresh programs: the best level
        add(i, 0.0)
    for _ in range(warmup):  # admit and prefill them
        model_free.finish_step(scheduler, scheduler.schedule())
    assert len(scheduler.running) == running, "the batch did not fill"
    for i in range(running, running + waiting):  # programs with history: worse levels
        add(i, 1000.0 * (1 + i % 5))
