"""KV residency on a vLLM engine: the policy core's rules applied to vLLM's block pool.

:mod:`autellix_vllm.policy.residency` decides; this module only connects it to
vLLM (through the adapter), for a KV-aware policy (``autellix``, the default):

* **holds**: when a program's call finishes and none of its calls runs, the
  finished request's prefix-cached blocks get a reference (the hold), so vLLM
  cannot evict them; the hold's reference is dropped when the program's next
  call starts running (vLLM has taken its own reference on the blocks it hit),
  when the hold expires, when the client ends the program, or when a better
  ranked call needs the blocks. A hold lasts the call's retention hint if the
  client sent one (``autellix_retention_ttl_s``), else the core's estimate
  from the program's tool gaps; within the residency bounds either way;
* **working set**: the waiting queue shows vLLM only the calls the rule
  admits (:meth:`EngineResidency.admissible`): a call of a program with no hold
  and no running call must fit its whole sequence in the free blocks beside the
  headroom; others wait (cutting short other owners' holds past their fair
  share, ``Residency.cut_for``) and calls behind them go first;
* **KV pressure**: before each step, holds of programs in the worst running
  call's level or worse (worst first) are released while the running calls'
  next tokens need more blocks than are free, so vLLM preempts a running call
  only when no such hold is left to give up; and the running calls are put
  in the core's victim order (the worst level, then the fewest computed
  tokens, which vLLM would recompute on resume), so the call vLLM then
  preempts is the core's victim.

A program is one context here (vLLM's prefix cache finds every shared prefix by
content, so a program's threads need no context of their own). With vLLM's host
KV tier (``--kv-offloading-size``), which writes every block through to host
memory, a context is taken as reloadable: a preempted call's undo cost is a
reload's. Its hold is as long as without the tier (``ResidencyConfig.ttl_gaps``).
While the tier can keep every live program's context, the rules step aside
(``Residency.engaged``): no holds, every call admitted, vLLM evicts and reloads.
The host tier is a GPU feature of vLLM: on the CPU build the rules always apply.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from autellix_vllm.engine import _vllm_adapter as adapter
from autellix_vllm.engine._vllm_adapter import Request, Scheduler
from autellix_vllm.policy import Call, ProgramScheduler, Rank
from autellix_vllm.policy.residency import Residency, undo_cost


class EngineResidency:
    """The holds of one vLLM scheduler and its working-set rule."""

    def __init__(self, scheduler: Scheduler, core: ProgramScheduler) -> None:
        self.scheduler = scheduler
        self.core = core
        self.rules = Residency(
            core.config.residency,
            adapter.total_kv_blocks(scheduler),
            core.program_level,
            core.waiting.owners,
            tier_blocks=adapter.host_tier_blocks(scheduler),
            retention=core.policy.make_retention(),
        )
        self.engaged = True  # the rules apply (Residency.engaged), as of this step
        self._blocks: dict[str, list[object]] = {}  # held program -> its referenced blocks
        self._running: set[str] = set()  # programs with a running call, as of this step
        self._largest = 0  # blocks of the largest resident context, as of this step
        self.reloadable = adapter.has_host_kv_tier(scheduler)

    # ---- holds --------------------------------------------------------------------

    def arrived(self, call: Call) -> None:
        """A call arrived: a hold of its program lasts until the call runs; its prompt
        is its program's context now."""
        program_id = call.program.program_id
        blocks = adapter.kv_blocks_needed(self.scheduler, call.payload)
        self.rules.waiting(program_id, program_id, blocks)

    def started(self, call: Call) -> None:
        """The call runs: vLLM references the blocks it hit, so the hold can go."""
        program_id = call.program.program_id
        self._running.add(program_id)
        if self.rules.take(program_id):
            self._unreference(program_id)

    def finishing(self, request: Request, call: Call, aborted: bool) -> None:
        """The core has finished ``call`` and vLLM is about to free its request: hold
        its cached blocks if its program has no other call in flight."""
        program = call.program
        program_id = program.program_id
        if aborted or program.ended or program.active_calls or not self.engaged:
            return
        blocks = adapter.cached_blocks(self.scheduler, request)
        if program_id in self._blocks:  # an earlier call's hold: the new one replaces it
            self.rules.release(program_id)
            self._unreference(program_id)
        hint_s = call.identity.retention_ttl_s  # the client's, if any
        displaced = self.rules.hold(program_id, program, len(blocks), time.time(), hint_s)
        for ended in displaced:
            self._unreference(ended)
        if program_id in self.rules:
            adapter.reference_blocks(self.scheduler, blocks)
            self._blocks[program_id] = blocks

    def end_program(self, program_id: str) -> None:
        """The client ended the program: its hold goes at once."""
        for ended in self.rules.release_program(program_id):
            self._unreference(ended)

    def _unreference(self, program_id: str) -> None:
        blocks = self._blocks.pop(program_id, None)
        if blocks:
            adapter.release_blocks(self.scheduler, blocks)

    # ---- each step -----------------------------------------------------------------

    def before_step(self, running: Iterable[Request], calls: dict[str, Call]) -> None:
        """Expire holds; release the worst-ranked ones while the running calls' next
        tokens need more blocks than are free; remember which programs run; order
        vLLM's KV-pressure victims as the core would."""
        for ended in self.rules.expired(time.time()):
            self._unreference(ended)
        self.engaged = self.rules.engaged(self.core.table)
        if not self.engaged:
            for ended in self.rules.release_all():
                self._unreference(ended)
        running = list(running)
        self._running = {calls[r.request_id].program.program_id for r in running}
        if self.rules.retention.cheap_victims:
            self._order_victims(running, calls)
        scheduler = self.scheduler
        block = adapter.block_size(scheduler)
        self._largest = max(
            [-(-r.num_tokens // block) for r in running]
            + [h.blocks for h in self.rules.holds.values()],
            default=0,
        )
        if not self.rules.holds:
            return  # nothing to give up: skip the per-request block count
        demand = sum(adapter.kv_blocks_to_grow(scheduler, r) for r in running)
        standing = self.core.standing
        worst_running = max((standing(calls[r.request_id]) for r in running), default=-1)
        if demand > adapter.free_kv_blocks(scheduler):
            # An idle context of the worst running call's own level gives way first.
            self._break(worst_running - 1, demand)

    def _order_victims(self, running: list[Request], calls: dict[str, Call]) -> None:
        """vLLM preempts by its own rule when a running call cannot get blocks; make
        its choice the core's (``Residency.victim``), first victim first."""
        rank = self.core.rank

        def cost(call: Call) -> float:
            computed = adapter.computed_tokens(call.payload)
            return undo_cost(computed, computed if self.reloadable else 0)

        def key(request: Request) -> tuple[int, int, float, Rank]:
            return Residency.victim_key(calls[request.request_id], rank, cost)

        adapter.set_kv_victim_order(sorted(running, key=key, reverse=True))

    def admissible(self, call: Call) -> bool:
        """The working-set rule for a waiting call. An idle engine (nothing running)
        first gives up holds for the best waiter; a starving call for itself; any
        other that waits has other owners' holds past their fair share cut short."""
        program_id = call.program.program_id
        if not self.engaged or program_id in self._running or program_id in self.rules:
            return True
        if not self.rules.admits(call.program):
            return False  # paused by a peer's rule
        need = adapter.kv_blocks_needed(self.scheduler, call.payload)
        if not self.rules.working_set:
            # vLLM admits it if its blocks can be had: holds the rule lets the call
            # break give them up first.
            self._break(self.core.standing(call) if self._running else -1, need)
            return True
        if self._fits(need):
            return True
        if not self._running or call.promotions or self.rules.overdue(call, time.time()):
            self._break(-1 if not self._running else self.core.standing(call), need)
            return self._fits(need)
        free = adapter.free_kv_blocks(self.scheduler)
        self.rules.cut_for(call.program.owner, time.time(), need, free, self._largest)
        return False

    def kv_blocks_needed(self, call: Call) -> int:
        """New blocks the waiting ``call`` needs to compute its whole sequence: its
        program's held blocks that start the sequence are hits, not new blocks (and,
        referenced, they are not among the free ones either)."""
        request = call.payload
        need = adapter.kv_blocks_needed(self.scheduler, request)
        held = self._blocks.get(call.program.program_id)
        if held:
            need -= adapter.prefix_hit_blocks(self.scheduler, request, held)
        return need

    def _fits(self, need: int) -> bool:
        free = adapter.free_kv_blocks(self.scheduler)
        return self.rules.fits(need, free, self._largest)

    def _break(self, level: int, need: int) -> None:
        """Release holds of programs worse than ``level`` (-1: any), worst first,
        until ``need`` blocks are free beside the headroom."""
        for program_id in self.rules.breakable(level):
            if self._fits(need):
                return
            self.rules.break_hold(program_id)
            self._unreference(program_id)

    def snapshot(self) -> dict[str, int]:
        """Counters for the engine's table."""
        rules = self.rules
        return {
            "held_programs": len(rules.holds),
            "held_blocks": rules.held_blocks,
            **rules.counters(),
        }
