"""What knowing the distribution of program sizes could gain: the limit of
learning it from the programs that ended.

The SRPT oracle knows each program's remaining work; a server can at best learn
how large programs tend to be. This ranks programs by what that distribution
says about each, given the decode tokens it has produced so far (its attained
service): the Gittins index over the sizes of all programs (``gittins``), over
those of its own kind (``gittins-kind``: the workload generator's name, as a
client could state it), and the mean remaining size (``mean-residual``). The
distribution is taken from the same generator with another seed (3,000
programs), so it is known exactly, as a server learning it would know it at
best. Like the oracle these orders are KV-blind and simulator only, but for
``autellix-gittins-kind``: the default's order and KV rules, programs ranked
first by their kind's index on a coarse grid. Each seed's highest rate within
the SLO is swept beside the given policies.

    python bench/experiments/size_bound.py --workload mixed --seeds 0
"""

from __future__ import annotations

import argparse
import bisect
import functools
import json
import math
from collections import defaultdict
from typing import Any

from autellix_vllm.policy.policies import POLICIES, Autellix, Policy
from autellix_vllm.policy.table import Call, Program, Rank
from autellix_vllm.sim import run
from autellix_vllm.sim.sweep import sweep
from autellix_vllm.workloads import generate

SAMPLE = 3000  # programs drawn to know the distribution
SAMPLE_SEED_OFFSET = 1000  # the distribution's seed is the run's plus this
GRID = 1.03  # attained service is looked up on a geometric grid (3% apart)
ALL = "*"

# Kind -> sorted program sizes (decode tokens); set before the sweep forks its workers.
SIZES: dict[str, list[int]] = {}


def kind_of(program_id: str) -> str:
    """The generator's name for a program (``lats-12``: ``lats``)."""
    return program_id.rsplit("-", 1)[0]


def learn(workload: str, seed: int) -> None:
    """Fill :data:`SIZES` from another draw of the workload's generator."""
    by_kind: dict[str, list[int]] = defaultdict(list)
    for spec in generate(workload, SAMPLE, 1.0, seed + SAMPLE_SEED_OFFSET, None):
        by_kind[ALL].append(spec.decode_tokens)
        by_kind[kind_of(spec.program_id)].append(spec.decode_tokens)
    know(by_kind)


def know(sizes_by_kind: dict[str, list[int]]) -> None:
    """Rank by these program sizes (decode tokens) per kind, :data:`ALL` for every kind."""
    SIZES.clear()
    SIZES.update({kind: sorted(sizes) for kind, sizes in sizes_by_kind.items()})
    gittins_index.cache_clear()
    mean_residual.cache_clear()


def _grid(attained: float) -> int:
    return 0 if attained < 1 else int(math.log(attained) / math.log(GRID)) + 1


def _attained(step: int) -> float:
    return 0.0 if step == 0 else GRID ** (step - 1)


@functools.cache
def gittins_index(kind: str, step: int) -> float:
    """The Gittins index of a program of ``kind`` that has attained grid ``step``:
    the best, over how much more to serve it, of the chance it ends within that
    over the service that takes (higher: serve first)."""
    sizes, attained = SIZES[kind], _attained(step)
    first = bisect.bisect_right(sizes, attained)
    alive = len(sizes) - first
    if alive == 0:  # larger than any seen: as if about to end
        return 1.0 / max(attained, 1.0)
    best = served = 0.0
    for j in range(first, len(sizes)):
        served += sizes[j] - attained
        if j + 1 < len(sizes) and sizes[j + 1] == sizes[j]:
            continue
        ended = j - first + 1
        work = served + (alive - ended) * (sizes[j] - attained)
        if work > 0:
            best = max(best, ended / work)
    return best


@functools.cache
def mean_residual(kind: str, step: int) -> float:
    """The mean size still to come of a program of ``kind`` at grid ``step``."""
    sizes, attained = SIZES[kind], _attained(step)
    alive = [s for s in sizes if s > attained]
    return sum(alive) / len(alive) - attained if alive else 1.0


class _ReadsProgress:
    """Reads each program's decode tokens so far from the simulator."""

    clairvoyant = True  # reads the simulator's count of each program's tokens

    def __init__(self, remaining: Any) -> None:
        # The simulator's remaining-work callback; its owner knows each program's
        # decode tokens so far (total less remaining), which an engine counts itself.
        self.runs = remaining.__self__.runs

    @classmethod
    def build(cls, atlas_variant: Any, remaining: Any) -> Any:
        return cls(remaining)

    def _step(self, program: Program) -> int:
        progress = self.runs[program.program_id]
        return _grid(progress.decode_total - progress.remaining_work)

    def rerank_on_progress(self, program: Program) -> bool:
        return True


class _SizeAware(_ReadsProgress, Policy):
    """Ranks programs by :meth:`key` of the decode tokens each has produced."""

    uses_levels = False

    def key(self, program: Program) -> float:
        raise NotImplementedError

    def base(self, call: Call) -> float:
        return 0.0

    def rank(self, call: Call) -> Rank:
        return (self.key(call.program), call.seq)

    def outranks(self, waiter: Call, victim: Call) -> bool:
        return self.key(waiter.program) < self.key(victim.program) * 0.9  # no thrash at ties


class Gittins(_SizeAware):
    def key(self, program: Program) -> float:
        return -gittins_index(ALL, self._step(program))


class GittinsKind(_SizeAware):
    def key(self, program: Program) -> float:
        return -gittins_index(kind_of(program.program_id), self._step(program))


class MeanResidual(_SizeAware):
    def key(self, program: Program) -> float:
        return mean_residual(ALL, self._step(program))


BUCKET = 2.0  # within the default: indices within this factor tie


class AutellixGittinsKind(_ReadsProgress, Autellix):
    """The default's order and KV rules, programs ranked first by their kind's
    Gittins index on a coarse grid (indices within :data:`BUCKET` tie), then
    as the default ranks them."""

    def bucket(self, program: Program) -> int:
        index = gittins_index(kind_of(program.program_id), self._step(program))
        return -math.floor(math.log(max(index, 1e-12)) / math.log(BUCKET))

    def rank(self, call: Call) -> Rank:
        return (self.bucket(call.program), *super().rank(call))

    def outranks(self, waiter: Call, victim: Call) -> bool:
        ahead, behind = self.bucket(waiter.program), self.bucket(victim.program)
        return ahead < behind or (ahead == behind and super().outranks(waiter, victim))


ORDERS: dict[str, type[Policy]] = {
    "gittins": Gittins, "gittins-kind": GittinsKind, "mean-residual": MeanResidual,
    "autellix-gittins-kind": AutellixGittinsKind,
}  # fmt: skip
for _name, _order in ORDERS.items():
    _order.name = _name  # after the class is made: not registered on import


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    out.add_argument("--workload", default="mixed", help="(default: %(default)s)")
    out.add_argument("--preset", default="a100-llama8b", help="(default: %(default)s)")
    out.add_argument("--kv-offload-gib", type=float, default=None,
                     help="a host KV tier (default: the preset's)")  # fmt: skip
    out.add_argument("--seeds", default="0", help="comma-separated (default: %(default)s)")
    out.add_argument("--policies", default="vllm-opt,autellix,srpt",
                     help="swept beside the size-aware orders (default: %(default)s)")  # fmt: skip
    out.add_argument("--orders", default=",".join(ORDERS), help="(default: %(default)s)")
    out.add_argument("--programs", type=int, default=None,
                     help="a fixed count per run instead of the workload's window")  # fmt: skip
    out.add_argument("--workers", type=int, default=2, help="(default: %(default)s)")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    orders = args.orders.split(",")
    policies = args.policies.split(",") + orders
    # Registered for this run only (the sweep's workers fork with them).
    added = {name: ORDERS[name] for name in orders}
    POLICIES.update(added)
    run.SIM_POLICIES.update({name: (name, True) for name in added})
    try:
        for seed in (int(s) for s in args.seeds.split(",")):
            learn(args.workload, seed)
            rates = sweep(
                args.workload, policies, preset=args.preset, seed=seed,
                kv_offload_gib=args.kv_offload_gib, programs=args.programs, workers=args.workers,
            )[0]["max_rate"]  # fmt: skip
            base = rates[policies[0]]
            print(json.dumps({
                "workload": args.workload, "preset": args.preset,
                "kv_offload_gib": args.kv_offload_gib, "seed": seed, "max_rate": rates,
                "ratio": {p: rate / base if base else None for p, rate in rates.items()},
            }), flush=True)  # fmt: skip
    finally:
        for name in added:
            POLICIES.pop(name, None)
            run.SIM_POLICIES.pop(name, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
