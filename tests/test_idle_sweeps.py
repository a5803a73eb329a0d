"""Idle sweeps are bounded per call, and both owners sweep again until none is left.

A flood of programs going idle at once must not be dropped in one go (that
would block the router's event loop, or the engine's step, for as long as the
flood is large): each sweep drops at most ``SWEEP_BATCH``, and the engine's
scheduler and the router sweep again until a sweep drops fewer.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from autellix_vllm.policy.bounded import SWEEP_BATCH, IdleTable, swept_all
from autellix_vllm.policy.config import PolicyConfig, TableBounds
from autellix_vllm.policy.core import ProgramScheduler
from autellix_vllm.policy.policies import PLAS
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.router.keys import ANONYMOUS
from autellix_vllm.router.programs import ProgramTable


def Entry(last_active_s: float, busy: bool = False) -> SimpleNamespace:  # noqa: N802
    """What IdleTable reads of an entry."""
    return SimpleNamespace(last_active_s=last_active_s, busy=busy)


def test_a_sweep_drops_at_most_its_limit_least_recently_active_first():
    table: IdleTable[SimpleNamespace] = IdleTable(idle_ttl_s=10.0)
    for i in range(7):
        table.add(f"k{i}", Entry(float(i)))
    table.add("busy", Entry(0.0, busy=True))
    table.add("fresh", Entry(100.0))
    first = table.drop_idle(now_s=100.0, limit=3)
    assert first == ["k0", "k1", "k2"] and not swept_all(first, limit=3)
    second = table.drop_idle(now_s=100.0, limit=3)
    assert second == ["k3", "k4", "k5"] and not swept_all(second, limit=3)
    last = table.drop_idle(now_s=100.0, limit=3)
    assert last == ["k6"] and swept_all(last, limit=3)  # busy is kept, fresh is not idle
    assert [key for key in ("busy", "fresh") if key in table] == ["busy", "fresh"]
    with pytest.raises(ValueError):
        table.drop_idle(now_s=100.0, limit=0)


def test_the_default_sweep_is_bounded():
    table: IdleTable[SimpleNamespace] = IdleTable(idle_ttl_s=1.0)
    for i in range(SWEEP_BATCH + 5):
        table.add(f"k{i}", Entry(0.0))
    assert len(table.drop_idle(now_s=10.0)) == SWEEP_BATCH
    assert len(table.drop_idle(now_s=10.0)) == 5 and len(table) == 0


def test_the_engine_scheduler_sweeps_each_step_until_the_flood_is_gone():
    core = ProgramScheduler(PLAS(), PolicyConfig(table=TableBounds(idle_ttl_s=10.0)))
    flood = 2 * SWEEP_BATCH + 10
    for i in range(flood):
        core.table.open(f"p{i}", now_s=0.0)
    core.advance(now_s=100.0)
    assert len(core.table) == flood - SWEEP_BATCH  # one batch per step
    core.advance(now_s=100.0)  # the next step sweeps again, without waiting the interval
    assert len(core.table) == 10
    core.advance(now_s=100.0)
    assert len(core.table) == 0
    core.table.open("late", now_s=0.0)
    core.advance(now_s=100.0)  # swept all last time: the next sweep waits its interval
    assert "late" in core.table


def test_the_router_sweeps_batches_in_the_background_between_requests():
    now = [0.0]
    table = ProgramTable(TableBounds(idle_ttl_s=60, ended_ids_kept=3), clock=lambda: now[0])
    flood = 3 * SWEEP_BATCH + 1
    for i in range(flood):
        record = table.call_arrived(CallIdentity(f"p{i}", call_id="c"))
        table.call_finished(record, "c", engine=None, service=None, completed=True)
    busy = table.call_arrived(CallIdentity("busy"))
    now[0] += 61
    assert len(table.evict_idle()) == SWEEP_BATCH  # one call, one batch

    async def sweep_and_watch() -> list[int]:
        sizes: list[int] = []

        async def watch() -> None:  # runs between the sweeper's batches
            while len(table) > 1:
                sizes.append(len(table))
                await asyncio.sleep(0)

        sweeper = asyncio.create_task(table.sweep_forever(interval_s=0.0))
        await asyncio.wait_for(watch(), timeout=10)
        sweeper.cancel()
        return sizes

    sizes = asyncio.run(sweep_and_watch())
    assert table.get("busy") is busy and len(table) == 1
    # The loop ran between batches: it saw the table shrink a batch at a time.
    left = flood + 1 - SWEEP_BATCH
    assert sorted(set(sizes), reverse=True)[:2] == [left, left - SWEEP_BATCH]


def test_a_sweep_that_compacts_the_opening_order_counts_each_program_once():
    # Dropping a batch used to tell the opening order of each program one by one:
    # the first compaction already removed the whole batch, the rest were counted
    # again, and the owner's order was deleted while it still had programs
    # (KeyError on the next sweep or end, a 500 for whoever opened a program).
    now = [0.0]
    table = ProgramTable(TableBounds(idle_ttl_s=60, ended_ids_kept=3), clock=lambda: now[0])
    for i in range(3000):
        record = table.call_arrived(CallIdentity(f"p{i}", call_id="c"))
        table.call_finished(record, "c", engine=None, service=None, completed=True)
    now[0] += 30
    kept = [table.call_arrived(CallIdentity(f"q{i}")) for i in range(3)]  # busy, newer
    now[0] += 31
    while not swept_all(table.evict_idle()):
        pass
    assert len(table) == 3
    page = table.page(ANONYMOUS, None, 10)
    assert (page.records, page.total, page.next_after) == (kept, 3, None)
    table.end("q0")
    assert table.page(ANONYMOUS, None, 10).total == 2
