"""Calls per second the Ray Serve directory's table takes, in one process, without Ray.

Every call through ``autellix ray-serve`` is admitted by the one directory
(:meth:`ProgramDirectory.admit`), which first applies the reports of calls
that ended since (they ride along with the admission). This times that work
alone: ``--calls`` admissions spread round-robin over ``--programs`` live
programs, each admission carrying the reports of the ``--reports`` calls
before it (a call ended on ``--replicas`` replicas, bound on its first). It
excludes Ray's actor call (pickling, the hop between processes), which the
deployment adds to every admission: the result is the ceiling of the
directory's own Python, not of the ingress.

    python bench/experiments/directory_throughput.py
    python bench/experiments/directory_throughput.py --programs 10000 --calls 200000
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from autellix_vllm.policy.config import TableBounds
from autellix_vllm.policy.routing import Route
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.ray_serve.directory import ProgramDirectory
from autellix_vllm.ray_serve.messages import Admission, Arrival, CallReport
from autellix_vllm.router.keys import ANONYMOUS


def throughput(programs: int, calls: int, reports: int, replicas: int) -> dict[str, Any]:
    """Admit ``calls`` calls; calls per second of the directory's own work."""
    bounds = TableBounds(max_programs=max(programs, 1), max_programs_per_key=max(programs, 1))
    directory = ProgramDirectory(bounds=bounds)
    ids = []
    for _ in range(programs):
        issued = directory.issue(None, ANONYMOUS)
        assert isinstance(issued, dict), issued
        ids.append(issued["program_id"])
    route = Route(0, "bind", binds=True)
    pending: list[CallReport] = []
    started = time.perf_counter()
    for i in range(calls):
        program_id, call_id = ids[i % programs], f"call-{i}"
        carried = pending if len(pending) >= reports else None
        arrival = Arrival(CallIdentity(program_id, call_id=call_id))
        admission = directory.admit(arrival, ANONYMOUS, carried)
        if not isinstance(admission, Admission):
            raise RuntimeError(f"the directory refused call {i}: {admission}")
        if carried:
            pending = []
        replica = f"replica-{i % replicas}"
        pending.append(CallReport(program_id, call_id, replica, route, 100.0, True))
    elapsed = time.perf_counter() - started
    return {
        "programs": programs,
        "calls": calls,
        "reports_per_admission": reports,
        "seconds": elapsed,
        "calls_per_s": calls / elapsed,
    }


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    made.add_argument("--programs", type=int, default=1000, help="(default: %(default)s)")
    made.add_argument("--calls", type=int, default=100_000, help="(default: %(default)s)")
    made.add_argument("--reports", type=int, default=1,
                      help="reports each admission carries (default: %(default)s)")  # fmt: skip
    made.add_argument("--replicas", type=int, default=64, help="(default: %(default)s)")
    return made


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result = throughput(args.programs, args.calls, args.reports, args.replicas)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
