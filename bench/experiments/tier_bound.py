"""What bringing contexts back from a host KV tier ahead of their calls could gain.

A prefetch (write an idle context to host memory during its tool gap, load it
back before the program's expected return) saves a call the wait for its KV to
cross the host link, and nothing else: the context is in the tier either way.
Its upper bound is therefore a link that moves KV in no time. This sweeps each
policy's highest rate within the SLO on agent sessions with the preset's host
link (PCIe 4.0 x16) and with such an instant link, seed by seed, and prints
both and their ratio. A ratio of 1 means no prefetch can raise that policy's
highest rate in this setting.

    python bench/experiments/tier_bound.py --seeds 0,1,2 --gib 256
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from autellix_vllm.sim.presets import get_preset
from autellix_vllm.sim.sweep import sweep

PCIE = get_preset("a100-llama8b-kv")
# The same engine with a host link no transfer waits on.
INSTANT = replace(PCIE, name=f"{PCIE.name}-instant-link", host_bytes_per_s=1e18)


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    out.add_argument("--seeds", default="0,1,2", help="comma-separated (default: %(default)s)")
    out.add_argument("--gib", type=float, default=256.0, help="the host tier (default: 256)")
    out.add_argument(
        "--policies", default="vllm-opt,autellix", help="comma-separated (default: %(default)s)"
    )
    out.add_argument("--programs", type=int, default=None,
                     help="a fixed count per run instead of the workload's window")  # fmt: skip
    out.add_argument("--workers", type=int, default=2, help="(default: %(default)s)")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    policies = args.policies.split(",")
    for seed in (int(s) for s in args.seeds.split(",")):
        pcie, instant = (
            sweep(
                "agent", policies, preset=preset, seed=seed, kv_offload_gib=args.gib,
                programs=args.programs, workers=args.workers,
            )[0]["max_rate"]
            for preset in (PCIE, INSTANT)
        )  # fmt: skip
        gain = {p: instant[p] / pcie[p] if pcie[p] else None for p in policies}
        print(json.dumps({"seed": seed, "gib": args.gib, "pcie": pcie, "instant_link": instant,
                          "instant_over_pcie": gain}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
