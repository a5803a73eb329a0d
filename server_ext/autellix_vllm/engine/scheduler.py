"""vLLM schedulers that order calls by their program's attained service.

    --scheduler-cls autellix_vllm.engine.scheduler.AutellixScheduler       (CPU, or no async)
    --scheduler-cls autellix_vllm.engine.scheduler.AutellixAsyncScheduler  (GPU default)
    --scheduling-policy priority

Every decision comes from :class:`autellix_vllm.policy.ProgramScheduler` (the
"core"): the process table, levels, charging, anti-starvation and the choice
of victims. This module only connects the core to vLLM's scheduler:

* ``add_request`` registers the call with the core: its
  :class:`~autellix_vllm.protocol.identity.CallIdentity`, read from the
  ``vllm_xargs`` the middleware wrote (else the session id) by the router's
  reader, is handed over whole; a call without a program id, one that would
  grow its program past the limits, or one whose identity is malformed (the
  middleware was bypassed) is its own one-call program; the call's prior
  service and owner count only where :mod:`~autellix_vllm.protocol.trust`'s
  rule allows (an engine with a key);
* vLLM's ``waiting`` queue is a :class:`ProgramRequestQueue`, a view of the
  core's wait queue, so vLLM admits calls in the core's order;
* before each step, running calls are preempted when a better-level call waits
  and the batch is full (seats, KV blocks or token budget): stock vLLM never
  preempts for a waiting request;
* after each step is scheduled, every scheduled call is charged its service;
  after it ran, the core's clock advances (anti-starvation, idle eviction);
* ``_free_request`` (every finish: stop, length, abort) completes the call;
* under a KV-aware policy (``autellix``, the default), :mod:`autellix_vllm.engine.block_holds`
  holds a finished program's blocks for its next call, and the waiting queue
  shows vLLM only the calls its working-set rule admits.

A failure in any of these hooks stays with its call: it is counted in the
core's ``faults`` (``hook_failures`` in the table, on ``/metrics``), the first
of each kind is logged, and the call goes on with a safe answer (it runs alone,
is not charged for the step, keeps vLLM's order); it never reaches vLLM's
EngineCore, whose death would end every call on the engine.

vLLM internals are reached only through :mod:`autellix_vllm.engine._vllm_adapter`.

Configuration comes from the ``AUTELLIX_*`` environment variables, since vLLM
builds the scheduler itself (:mod:`autellix_vllm.engine.settings` lists them).
They are read before vLLM builds anything: a bad value stops the engine with
one :class:`~autellix_vllm.engine.settings.SettingError` naming the variable.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from autellix_vllm.engine import _vllm_adapter as adapter
from autellix_vllm.engine._vllm_adapter import (
    AsyncScheduler,
    Request,
    RequestQueue,
    Scheduler,
    SchedulerOutput,
)
from autellix_vllm.engine.block_holds import EngineResidency
from autellix_vllm.engine.settings import SchedulerSettings
from autellix_vllm.policy import ALONE_PREFIX, Call, CallState, ProgramScheduler, Rank
from autellix_vllm.policy.faults import Hook
from autellix_vllm.policy.residency import SKIPPED_WAITERS
from autellix_vllm.protocol.identity import NO_IDENTITY
from autellix_vllm.protocol.trust import accepted

logger = logging.getLogger(__name__)


class WaiterPreemptionReason(StrEnum):
    """Why a running call was preempted for a better-level waiter: no free seat, or
    the best waiter's KV blocks or tokens do not fit this step. The value names it
    in the table's ``waiter_preemptions`` and on ``/metrics``."""

    SEAT = "seat"
    KV_BLOCKS = "kv_blocks"
    TOKEN_BUDGET = "token_budget"


__all__ = [
    "ALONE_PREFIX",
    "AutellixAsyncScheduler",
    "AutellixScheduler",
    "AutellixSchedulerMixin",
    "ProgramRequestQueue",
    "core_from_env",
]


def core_from_env(
    environ: Mapping[str, str] = os.environ, seats: int | None = None
) -> ProgramScheduler:
    """The policy core, configured by ``AUTELLIX_*`` variables (see module doc),
    for an engine of ``seats`` sequences."""
    return SchedulerSettings.from_env(environ).core(seats)


class ProgramRequestQueue(RequestQueue):
    """vLLM's ``waiting`` queue as a view of the core's wait queue.

    vLLM puts a request back through ``add_request`` (arrival),
    ``prepend_request`` (after a preemption) or ``prepend_requests`` (popped
    but skipped this pass); which one it was is told by the call's state, so
    all three go through :meth:`_wait`.
    """

    def __init__(
        self,
        core: ProgramScheduler,
        calls: dict[str, Call],
        admissible: Callable[[Call], bool] | None = None,
    ) -> None:
        self.core = core
        self.calls = calls  # request id -> call, owned by the scheduler
        # The working-set rule of a KV-aware policy: vLLM sees only the calls it
        # admits, best first; the others keep waiting in the core's queue.
        self.admissible = admissible
        # What peek_request last showed: vLLM pops that request after allocating its
        # blocks, when the rule may no longer admit it.
        self._peeked: Call | None = None

    def head(self) -> Call | None:
        """The best waiting call vLLM may admit now."""
        if self.admissible is None:
            return self.core.peek()
        return next(
            (c for c in self.core.waiting.best(SKIPPED_WAITERS + 1) if self.admissible(c)), None
        )

    def add_request(self, request: Request) -> None:
        self._wait(request)

    def prepend_request(self, request: Request) -> None:
        self._wait(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self._wait(request)

    def pop_request(self) -> Request:
        # The call keeps waiting (its wait clock runs) until the step charges it.
        if self.admissible is None:
            return self.core.pop().payload
        call = self._peeked if self._peeked is not None and self._peeked.queued else self.head()
        self._peeked = None
        if call is None:
            raise IndexError("pop from an empty queue")
        self.core.remove(call)
        return call.payload

    def peek_request(self) -> Request:
        call = self._peeked = self.head()
        if call is None:
            raise IndexError("peek from an empty queue")
        return call.payload

    def remove_request(self, request: Request) -> None:
        # A request that stopped while preempted is freed (and its call finished)
        # before vLLM removes it from `waiting`.
        call = self.calls.get(request.request_id)
        if call is not None:
            self.core.remove(call)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.remove_request(request)

    def __bool__(self) -> bool:
        if self.admissible is None:
            return bool(self.core.waiting)
        return self.head() is not None

    def __len__(self) -> int:
        return len(self.core.waiting)

    def __iter__(self) -> Iterator[Request]:
        return (call.payload for call in self.core.waiting)

    def _wait(self, request: Request) -> None:
        call = self.calls[request.request_id]
        if call.state is CallState.RUNNING:
            self.core.preempt(call)
        elif call.state is CallState.WAITING:
            # Popped, then skipped this pass (e.g. its grammar is still compiling).
            self.core.requeue(call)
        else:
            self.core.enqueue(call)


# mypy reads the mixin as a vLLM ``Scheduler`` (the class it is mixed into), so its
# `super()` calls and `self` passed as the scheduler are checked against vLLM's API;
# at run time it is a plain mixin, and the MRO is the concrete classes' below.
if TYPE_CHECKING:
    _MixinBase = Scheduler
else:
    _MixinBase = object


class AutellixSchedulerMixin(_MixinBase):
    """The Autellix logic, mixed into vLLM's ``Scheduler`` or ``AsyncScheduler``."""

    waiting: ProgramRequestQueue  # vLLM's, replaced in __init__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        settings = SchedulerSettings.from_env(os.environ)  # before vLLM builds anything
        super().__init__(*args, **kwargs)
        self.core = settings.core(seats=adapter.batch_seats(self))
        self.trusts_router_fields = settings.trusts_router_fields
        self.calls: dict[str, Call] = {}  # request id -> call, while the request lives
        self.residency = EngineResidency(self, self.core) if self.core.policy.kv_aware else None
        admissible = self.residency.admissible if self.residency is not None else None
        self.waiting = ProgramRequestQueue(self.core, self.calls, admissible)
        self.calls_without_identity = 0
        self.kv_preemptions = 0  # vLLM's own: a running call found no free KV blocks
        # Ours, for better-level waiters, by what the best waiter lacked.
        self.waiter_preemptions = dict.fromkeys(WaiterPreemptionReason, 0)
        # Time-unit service: when each step was scheduled (to split its duration).
        self._step_started: dict[int, tuple[float, dict[str, int]]] = {}
        logger.info(
            "Autellix scheduler active: policy %s, service in %s, %d levels, beta %s",
            self.core.policy.name,
            self.core.meter.unit,
            len(self.core.levels),
            self.core.config.beta,
        )

    # ---- arrival and completion ---------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id not in self.requests:  # not a streaming continuation
            try:
                self._register(request)
            except Exception as error:
                self.core.faults.record(Hook.ADD_REQUEST, error, "the call runs alone")
                self.calls[request.request_id] = self.core.add_call(
                    NO_IDENTITY,
                    time.time(),
                    request_id=request.request_id,
                    payload=request,
                    alone_id=_alone(request),
                )
            if self.residency is not None:
                call = self.calls[request.request_id]
                self._residency_hook(Hook.RESIDENCY_ARRIVED, self.residency.arrived, call)
        super().add_request(request)

    def _register(self, request: Request) -> None:
        identity = adapter.call_identity(request)
        if identity.program_id is None:
            if self.calls_without_identity == 0:
                logger.warning(
                    "A call arrived without a program id (no autellix_program_id in"
                    " vllm_xargs, no session id); it is scheduled as its own program."
                    " Further ones are counted in calls_without_identity."
                )
            self.calls_without_identity += 1
        identity = accepted(identity, self.trusts_router_fields)
        self.calls[request.request_id] = self.core.add_call(
            identity,
            time.time(),
            request_id=request.request_id,
            prompt_tokens=adapter.prompt_tokens(request),
            payload=request,
            alone_id=_alone(request),
        )

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        call = self.calls.pop(request.request_id, None)
        if call is not None:
            aborted = adapter.was_aborted(request)
            try:
                self.core.finish(call, time.time(), aborted=aborted)
            except Exception as error:
                self.core.faults.record(Hook.FINISH, error, "the call's program is not charged")
            # After the charge, so a hold ranks with the program's service as it is
            # now; before vLLM frees the blocks the hold keeps.
            if self.residency is not None:
                self._residency_hook(
                    Hook.RESIDENCY_FINISHING, self.residency.finishing, request, call, aborted
                )
        return super()._free_request(request, delay_free_blocks)

    # ---- each step ------------------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        # vLLM walks `running` in order for the token budget: keep it in the core's
        # order (nearly sorted from the last step, so this is close to linear). Its
        # own KV-pressure victim is the worst (priority, arrival): the level (set
        # when charged), or under a KV-aware policy the residency's victim order.
        if self.residency is not None:
            hook = self.residency.before_step
            self._residency_hook(Hook.RESIDENCY_BEFORE_STEP, hook, self.running, self.calls)
        try:
            self.running.sort(key=self._rank)
            self._preempt_for_waiters(time.time())
        except Exception as error:
            self.core.faults.record(
                Hook.PREEMPTION, error, "this step runs without (further) preemptions"
            )
        preemptions = self.core.counters.preemptions
        output = super().schedule(throttle_prefills)
        self.kv_preemptions += self.core.counters.preemptions - preemptions
        return output

    def _rank(self, request: Request) -> Rank:
        return self.core.rank(self.calls[request.request_id])

    def _preempt_for_waiters(self, now: float) -> None:
        """Make room for better-level waiting calls when the batch is full."""
        head = self.waiting.head()
        if head is None or not self.running:
            return
        # The common case, and O(1): the best waiter does not outrank the worst
        # running call (last, once sorted), so no waiter outranks any running call.
        if not self.core.outranks(head, self.calls[self.running[-1].request_id]):
            return
        running = [self.calls[r.request_id] for r in self.running]
        free_seats = adapter.batch_seats(self) - len(running)
        for victim in self.core.victims(running, free_seats, self.waiting.admissible):
            if self._preempt(victim, now):
                running.remove(victim)
                self.waiter_preemptions[WaiterPreemptionReason.SEAT] += 1
        # Seats may be free while KV blocks or the token budget are not: the best
        # waiter then displaces the worst displaceable running call, still only
        # across levels.
        while (head := self.waiting.head()) is not None:
            reason = self._head_blocked(head)
            displaceable = self.core.displaceable(running)
            if reason is None or not displaceable:
                break
            victim = self.core.worst(displaceable)
            if not self.core.outranks(head, victim) or not self._preempt(victim, now):
                break
            running.remove(victim)
            self.waiter_preemptions[reason] += 1

    def _head_blocked(self, head: Call) -> WaiterPreemptionReason | None:
        """What keeps the best waiter out of this step: KV blocks, the token
        budget, or nothing (None)."""
        scheduler: Scheduler = self
        if self.residency is not None:  # its held blocks are not free, but it hits them
            need = self.residency.kv_blocks_needed(head)
        else:
            need = adapter.kv_blocks_needed(scheduler, head.payload)
        if need > adapter.free_kv_blocks(scheduler):
            return WaiterPreemptionReason.KV_BLOCKS
        demand = sum(adapter.tokens_to_compute(r) for r in self.running)
        if demand >= adapter.token_budget(scheduler):
            return WaiterPreemptionReason.TOKEN_BUDGET
        return None

    def _preempt(self, call: Call, now: float) -> bool:
        # vLLM returns the request to `waiting`, i.e. to ProgramRequestQueue._wait,
        # which tells the core (core.preempt).
        return adapter.preempt_running(self, call.payload, now)

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        # Before vLLM advances num_computed_tokens: split_scheduled_tokens needs it.
        tokens = adapter.scheduled_tokens(scheduler_output)
        by_time = self.core.meter.unit == "time"
        for request_id, num_tokens in tokens.items():
            try:
                self._start_and_charge(self.calls[request_id], num_tokens)
            except Exception as error:
                self.core.faults.record(Hook.CHARGE, error, "the call is not charged for the step")
        if by_time and tokens:
            self._step_started[id(scheduler_output)] = (time.monotonic(), dict(tokens))
        super()._update_after_schedule(scheduler_output)

    def _start_and_charge(self, call: Call, num_tokens: int) -> None:
        if call.state is not CallState.RUNNING:
            self.core.start(call)
            if self.residency is not None:
                self.residency.started(call)
        # Under the time unit this charges no service (the step's seconds are
        # charged once it ran), but the core counts the decoded tokens.
        decode, prefill = adapter.split_scheduled_tokens(call.payload, num_tokens)
        self.core.charge(call, decode_tokens=decode, prefill_tokens=prefill)
        if self.residency is None:  # else the residency orders vLLM's victims
            call.payload.priority = self.core.standing(call)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: Any
    ) -> Any:
        step = self._step_started.pop(id(scheduler_output), None)
        if step is not None:  # time unit: split the step's duration by tokens
            started, tokens = step
            elapsed = time.monotonic() - started
            total = sum(tokens.values())
            for request_id, num_tokens in tokens.items():
                call = self.calls.get(request_id)
                if call is None:
                    continue
                try:
                    self.core.charge(call, seconds=elapsed * num_tokens / total)
                except Exception as error:
                    self.core.faults.record(
                        Hook.CHARGE, error, "the call is not charged for the step"
                    )
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        # A step ran: the wait clock moves (starving calls are promoted, idle
        # programs are evicted).
        try:
            self.core.advance(time.time(), steps=1.0)
        except Exception as error:
            self.core.faults.record(Hook.ADVANCE, error, "no promotion or eviction this step")
        return outputs

    # ---- the table (engine-core utility methods, see engine_plugin) -----------------

    def autellix_snapshot(self, program_ids: list[str] | None = None) -> dict[str, Any]:
        """The table (``ProgramScheduler.snapshot``): every program's row, or only
        those of ``program_ids`` (none for ``[]``)."""
        now = time.time()
        self.core.table.evict_idle(now)  # an idle engine runs no steps to do it
        snapshot = self.core.snapshot(now, program_ids)
        if self.residency is not None:
            snapshot["residency"] = self.residency.snapshot()
        snapshot.update(
            enabled=True,
            scheduler=type(self).__name__,
            running=len(self.running),
            seats=adapter.batch_seats(self),
            calls_without_identity=self.calls_without_identity,
            kv_preemptions=self.kv_preemptions,
            waiter_preemptions={r.value: n for r, n in self.waiter_preemptions.items()},
            prior_service_trusted=self.trusts_router_fields,
        )
        return snapshot

    def autellix_end_program(self, program_id: str) -> bool:
        if self.residency is not None:
            self._residency_hook(Hook.RESIDENCY_END_PROGRAM, self.residency.end_program, program_id)
        return self.core.end_program(program_id)

    def _residency_hook(self, name: Hook, hook: Callable[..., None], *args: Any) -> None:
        """Run a residency hook; a failure only costs the call its hold (counted)."""
        try:
            hook(*args)
        except Exception as error:
            self.core.faults.record(name, error, "no hold for this call")


def _alone(request: Request) -> str:
    """The program id of ``request`` when it runs alone (unique: vLLM's request id)."""
    return ALONE_PREFIX + request.request_id


class AutellixScheduler(AutellixSchedulerMixin, Scheduler):
    """For the CPU backend and ``--no-async-scheduling``."""


class AutellixAsyncScheduler(AutellixSchedulerMixin, AsyncScheduler):
    """For GPUs, where vLLM schedules step N+1 while step N runs."""
