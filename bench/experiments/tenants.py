"""Priority classes and the fair share between keys, against issue 40's targets.

Every key's programs come from ``--workload`` at a rate in multiples of the
pool's capacity (``--capacity``, programs/s the pool completes when flooded);
each of the three cases spans ``--window`` seconds of arrivals. Per seed:

* **classes**: an interactive key at ``--interactive-load`` x capacity, alone
  and beside a batch key's flood at ``--flood`` x capacity in band 1 (the
  batch key's class, ``TenantConfig.bands``). Target: the interactive key's
  P95 program latency with the flood within 1.2x of alone. Shown beside it:
  the same flood without classes (both keys one owner: today's order), and
  with classes and the router's gate (``_gated``: batch calls held at the
  router while the pool is saturated, ``policy.flow_control``).
* **throughput**: the batch key's flood beside a little interactive load
  (``--little-load``); the batch key's throughput (its decode tokens over the
  span from its first arrival to its last completion) with classes over
  without, and with classes and the gate over without. Target: >= 0.9.
* **split**: two keys of equal weight, each at half of ``--flood``; key ``a``
  runs its agents as programs, key ``b`` sends every call as a program of its
  own, in one of two ways: a client that waits for its answers as its agent
  does (``closed``: each call is sent, as a new program, when the calls it
  follows returned and its tool gap passed), and one whose calls arrive
  open-loop, when each would start on an idle pool (its program's arrival
  plus the tool gaps and the preset's unloaded call times before it), so it
  does not slow down under load: a harder flood. Service is the decode tokens
  of the programs each key completed by the time the first key completed all
  of its own (the keys' programs differ, so ``behave_service_ratio``, the
  same figure when both run programs, is the floor to read it against).
  Targets: b's service within 10% of a's, and a's P95 program latency within
  1.1x of the run where both keys run programs. Shown beside each
  (``_today``): the same with one owner for both (today's order, no share).
  And ``weighted``: both keys run programs, the agents' key weighs 2; its
  service over the other's (``weighted_service_ratio``, read against the
  inverse of the floor).

``--flow-control``: ``both`` (default) runs the classes cases with and without
the gate, ``on`` or ``off`` only one way (the other's columns are then left
out); ``--no-split`` leaves out the split cases.

    python bench/experiments/tenants.py --seeds 10,11,12,13,14
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any, NamedTuple

from autellix_vllm.policy import DEFAULT_POLICY, PolicyConfig, TenantConfig
from autellix_vllm.policy.flow_control import FlowControlConfig
from autellix_vllm.sim.presets import PRESETS
from autellix_vllm.sim.run import SimResult, simulate
from autellix_vllm.stats import percentile
from autellix_vllm.workloads import ProgramSpec, generate

INTERACTIVE, BATCH = "interactive", "batch"
AGENTS, SPLITTER = "a", "b"
# The agents' key's weight in the weighted case (the splitter's key, behaving, weighs 1).
WEIGHT = 2.0
# The owner every program has when a run shows today's order (no classes, no share).
ONE_OWNER = "everyone"


def programs_of(args: argparse.Namespace, key: str, load: float, seed: int) -> list[ProgramSpec]:
    """``key``'s programs: ``load`` x capacity over the window, ids prefixed by the key."""
    count = max(1, round(load * args.capacity * args.window))
    generated = generate(args.workload, count, load * args.capacity, seed)
    return [replace(p, program_id=f"{key}:{p.program_id}", owner=key) for p in generated]


def split(programs: Iterable[ProgramSpec], preset: str) -> list[ProgramSpec]:
    """Each call as a program of its own, arriving when it would start on an idle
    pool (open-loop: see the module docstring)."""
    engine = PRESETS[preset]
    out = []
    for program in programs:
        ends: dict[str, float] = {}
        for call in program.calls:  # in dependency order, as traces list them
            start = max((ends[a] for a in call.after), default=0.0) + call.tool_gap
            unloaded = engine.per_prefill * call.prompt_tokens
            ends[call.id] = start + unloaded + engine.step_base * call.decode_tokens
            alone = replace(call, after=(), tool_gap=0.0, thread="main", parent_thread=None,
                            context=None)  # fmt: skip
            out.append(replace(program, program_id=f"{program.program_id}/{call.id}",
                               arrival=program.arrival + start, calls=(alone,)))  # fmt: skip
    return sorted(out, key=lambda p: p.arrival)


class Case(NamedTuple):
    """One simulation's programs and how they are served."""

    programs: list[ProgramSpec]
    # Each program keeps its key as owner (False: one owner, today's order).
    owned: bool = True
    # The router's gate holds the batch key's calls.
    gated: bool = False
    # The splitter's client sends each call as a program of its own.
    splitting: bool = False
    # The agents' key weighs ``WEIGHT`` (the others 1).
    weighted: bool = False


def run(job: tuple[Case, argparse.Namespace]) -> dict[str, Any]:
    """One simulation. Returns per key: P95 program latency, throughput and
    (end, tokens) per program."""
    case, args = job
    programs = case.programs
    gate = None
    if case.gated:
        gate = FlowControlConfig(args.seat_share, args.reserve_share, args.linger_s)
    key_of = {p.program_id: p.owner for p in programs}
    if not case.owned:
        programs = [replace(p, owner=ONE_OWNER) for p in programs]
    tenants = TenantConfig(
        bands={BATCH: 1},
        band_aging_s=args.band_aging_s,
        weights={AGENTS: WEIGHT} if case.weighted else {},
    )
    splitting = [p for p, key in key_of.items() if case.splitting and key == SPLITTER]
    result: SimResult = simulate(
        sorted(programs, key=lambda p: p.arrival), args.policy, preset=args.preset,
        max_num_seqs=args.max_num_seqs, config=PolicyConfig(tenants=tenants),
        flow_control=gate, splitting_programs=splitting,
    )  # fmt: skip
    per_key: dict[str, dict[str, Any]] = {}
    for p in programs:
        entry = per_key.setdefault(
            key_of[p.program_id], {"latency": [], "done": [], "first": p.arrival}
        )
        latency = result.program_latency[p.program_id]
        entry["latency"].append(latency)
        entry["done"].append((p.arrival + latency, p.decode_tokens))
        entry["first"] = min(entry["first"], p.arrival)
    out = {}
    for key, entry in per_key.items():
        last = max(end for end, _ in entry["done"])
        tokens = sum(t for _, t in entry["done"])
        out[key] = {
            "p95": percentile(sorted(entry["latency"]), 95),
            "throughput": tokens / (last - entry["first"]),
            "last": last,
            "done": entry["done"],
        }
    return out


def served_by(keys: dict[str, Any]) -> dict[str, int]:
    """Decode tokens each key completed by the time the first key completed all."""
    until = min(k["last"] for k in keys.values())
    return {key: sum(t for end, t in k["done"] if end <= until) for key, k in keys.items()}


def cases_of(seed: int, args: argparse.Namespace) -> dict[str, Case]:
    interactive = programs_of(args, INTERACTIVE, args.interactive_load, seed)
    little = programs_of(args, INTERACTIVE, args.little_load, seed)
    flood = programs_of(args, BATCH, args.flood, seed + 1000)
    cases: dict[str, Case] = {
        "alone": Case(interactive),
        "flood_today": Case(interactive + flood, owned=False),
        "little_today": Case(little + flood, owned=False),
    }
    if args.split:
        agents = programs_of(args, AGENTS, args.flood / 2, seed + 2000)
        splitter = programs_of(args, SPLITTER, args.flood / 2, seed + 3000)
        splitting = split(splitter, args.preset)
        cases["behave"] = Case(agents + splitter)
        cases["weighted"] = Case(agents + splitter, weighted=True)
        cases["split_closed"] = Case(agents + splitter, splitting=True)
        cases["split_closed_today"] = Case(agents + splitter, owned=False, splitting=True)
        cases["split_share"] = Case(agents + splitting)
        cases["split_today"] = Case(agents + splitting, owned=False)
    if args.flow_control in ("off", "both"):
        cases["flood_classes"] = Case(interactive + flood)
        cases["little_classes"] = Case(little + flood)
    if args.flow_control in ("on", "both"):
        cases["flood_gated"] = Case(interactive + flood, gated=True)
        cases["little_gated"] = Case(little + flood, gated=True)
    return cases


def compare(args: argparse.Namespace) -> dict[str, Any]:
    names = list(cases_of(args.seeds[0], args))
    cases = [(cases_of(seed, args)[name], args) for seed in args.seeds for name in names]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(run, cases))
    rows = []
    for k, seed in enumerate(args.seeds):
        r = dict(zip(names, results[k * len(names) : (k + 1) * len(names)], strict=True))
        alone = r["alone"][INTERACTIVE]["p95"]
        row: dict[str, Any] = {
            "seed": seed,
            "interactive_p95_alone": alone,
            "interactive_p95_ratio_today": r["flood_today"][INTERACTIVE]["p95"] / alone,
        }
        for suffix, flood, little in (("", "flood_classes", "little_classes"),
                                      ("_gated", "flood_gated", "little_gated")):  # fmt: skip
            if flood in r:
                row[f"interactive_p95_ratio{suffix}"] = r[flood][INTERACTIVE]["p95"] / alone
                row[f"batch_throughput_ratio{suffix}"] = (
                    r[little][BATCH]["throughput"] / r["little_today"][BATCH]["throughput"]
                )
        if args.split:
            share, today = served_by(r["split_share"]), served_by(r["split_today"])
            behave = r["behave"][AGENTS]["p95"]
            # The keys run different programs: their service when both behave is
            # the floor the split cases' ratios are read against.
            behaving = served_by(r["behave"])
            row["behave_service_ratio"] = behaving[SPLITTER] / behaving[AGENTS]
            weighted = served_by(r["weighted"])
            row["weighted_service_ratio"] = weighted[AGENTS] / weighted[SPLITTER]
            closed, closed_today = served_by(r["split_closed"]), served_by(r["split_closed_today"])
            row["closed_split_service_ratio"] = closed[SPLITTER] / closed[AGENTS]
            row["closed_split_service_ratio_today"] = closed_today[SPLITTER] / closed_today[AGENTS]
            row["closed_agents_p95_ratio"] = r["split_closed"][AGENTS]["p95"] / behave
            row["closed_agents_p95_ratio_today"] = r["split_closed_today"][AGENTS]["p95"] / behave
            row["split_service_ratio"] = share[SPLITTER] / share[AGENTS]
            row["split_service_ratio_today"] = today[SPLITTER] / today[AGENTS]
            row["agents_p95_ratio"] = r["split_share"][AGENTS]["p95"] / behave
            row["agents_p95_ratio_today"] = r["split_today"][AGENTS]["p95"] / behave
        rows.append(row)
    names = (
        "interactive_p95_ratio",
        "interactive_p95_ratio_gated",
        "agents_p95_ratio",
        "closed_agents_p95_ratio",
    )
    summary = {f"worst_{name}": max(row[name] for row in rows) for name in names if name in rows[0]}
    for name in ("batch_throughput_ratio", "batch_throughput_ratio_gated"):
        if name in rows[0]:
            summary[f"worst_{name}"] = min(row[name] for row in rows)
    if args.split:
        summary["worst_split_service_gap"] = max(abs(r["split_service_ratio"] - 1) for r in rows)
        summary["worst_closed_split_service_gap"] = max(
            abs(r["closed_split_service_ratio"] - 1) for r in rows
        )
        summary["mean_split_service_ratio_today"] = statistics.fmean(
            r["split_service_ratio_today"] for r in rows
        )
    return {"seeds": rows, **summary}


def _seeds(text: str) -> list[int]:
    return [int(seed) for seed in text.split(",")]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--workload", default="bfcl", help="(default: %(default)s)")
    add("--preset", default="a100-llama8b", help="(default: %(default)s)")
    add("--policy", default=DEFAULT_POLICY, help="(default: %(default)s)")
    add("--max-num-seqs", type=int, default=None, help="seats (default: the preset's)")
    add(
        "--capacity",
        type=float,
        default=3.5,
        help="programs/s of the workload the pool completes when flooded (default: %(default)s)",
    )
    add("--window", type=float, default=60.0, help="seconds of arrivals (default: %(default)s)")
    add("--interactive-load", type=float, default=0.3, help="x capacity (default: %(default)s)")
    add("--little-load", type=float, default=0.05, help="x capacity (default: %(default)s)")
    add("--flood", type=float, default=2.0, help="x capacity (default: %(default)s)")
    add(
        "--band-aging-s",
        type=float,
        default=TenantConfig.band_aging_s,
        help="(default: %(default)s)",
    )
    add(
        "--no-split",
        dest="split",
        action="store_false",
        help="leave out the split cases (the gate does not act on them: one band)",
    )
    add(
        "--flow-control",
        choices=("off", "on", "both"),
        default="both",
        help="the router's gate in the classes cases (default: %(default)s)",
    )
    add(
        "--seat-share",
        type=float,
        default=FlowControlConfig.seat_share,
        help="the gate's FlowControlConfig.seat_share (default: %(default)s)",
    )
    add(
        "--reserve-share",
        type=float,
        default=FlowControlConfig.reserve_share,
        help="the gate's FlowControlConfig.reserve_share (default: %(default)s)",
    )
    add(
        "--linger-s",
        type=float,
        default=FlowControlConfig.linger_s,
        help="the gate's FlowControlConfig.linger_s (default: %(default)s)",
    )
    add("--seeds", type=_seeds, default=[0, 1, 2, 3, 4], help="SEED,... (default: 0,1,2,3,4)")
    add("--workers", type=int, default=2, help="(default: %(default)s)")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    print(json.dumps(compare(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
