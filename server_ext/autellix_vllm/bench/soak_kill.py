"""The soak's engine kill: SIGKILL one engine's API server, then follow the engine
out of rotation and back, and its old process group until it is reaped.

Part of ``autellix bench soak`` (:mod:`autellix_vllm.bench.soak`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass

import aiohttp

from autellix_vllm.bench.soak_serve import Served, say
from autellix_vllm.engine.reaper import group_members, server_of
from autellix_vllm.protocol.paths import ENGINES_PATH


@dataclass
class Kill:
    engine: int
    api_server_pid: int
    group: int
    at_s: float
    out_of_rotation_s: float | None = None
    back_in_rotation_s: float | None = None
    group_reaped_s: float | None = None


async def kill_and_watch(
    served: Served,
    http: aiohttp.ClientSession,
    admin_key: str,
    at: float,
    began: float,
    engine: int,
    timeout_s: float,
) -> Kill:
    """SIGKILL ``engine``'s API server at ``at``; follow it out of rotation and back,
    until serve has also reported the restart."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    group = served.engine_groups[engine]
    server = server_of(group)
    restarts = served.restarts
    os.kill(server, signal.SIGKILL)
    killed = time.monotonic()
    kill = Kill(engine, server, group, round(killed - began, 1))
    say(f"killed engine {engine}'s API server (pid {server}) at {kill.at_s:.0f} s")
    name = f"engine-{engine}"
    while time.monotonic() - killed < timeout_s:
        async with http.get(
            served.url + ENGINES_PATH, headers={"Authorization": f"Bearer {admin_key}"}
        ) as answer:
            healthy = {row["name"]: row["healthy"] for row in (await answer.json())["engines"]}
        since = round(time.monotonic() - killed, 2)
        if kill.group_reaped_s is None and not group_members(group):
            kill.group_reaped_s = since
        if not healthy[name] and kill.out_of_rotation_s is None:
            kill.out_of_rotation_s = since
        elif (
            healthy[name] and kill.out_of_rotation_s is not None and kill.back_in_rotation_s is None
        ):
            kill.back_in_rotation_s = since
            say(f"engine {engine} back in rotation {since:.0f} s after the kill")
        if kill.back_in_rotation_s is not None and served.restarts > restarts:
            break
        await asyncio.sleep(0.2)
    return kill
