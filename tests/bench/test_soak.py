"""``autellix bench soak``: its forgery check, and a short run end to end.

The end-to-end run starts ``autellix serve`` with two tiny engines, so it takes
two engine starts plus the killed engine's restart: about 4 minutes on 2 busy
cores, 1 to 2 on a quiet machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import aiohttp
import pytest
from aiohttp import web
from autellix_vllm.bench.soak_mallory import FORGED_SERVICE, EngineTables, Tally
from autellix_vllm.engine.reaper import group_members
from autellix_vllm.protocol.paths import ENGINE_TABLE_PATH
from local_http import serving

ENGINE_KEY = "soak-test-engine-key"


async def test_the_table_scan_catches_a_forged_prior_service_on_any_engine():
    """The check behind ``forged_accepted`` can fail: a program whose record on an
    engine shows the forged service is caught; honest ones only raise the maximum."""
    tables = {
        "a": [{"program_id": "honest", "attained_service": 41.5}],
        "b": [{"program_id": "victim", "attained_service": FORGED_SERVICE}],
    }
    seen_keys: Counter[str] = Counter()

    async def table(request: web.Request) -> web.Response:
        seen_keys[request.headers.get("Authorization", "")] += 1
        return web.json_response({"programs": tables[request.match_info["engine"]]})

    app = web.Application()
    app.router.add_get("/{engine}" + ENGINE_TABLE_PATH, table)
    async with serving(web.AppRunner(app)) as url, aiohttp.ClientSession() as http:
        scan = EngineTables(http, {0: f"{url}/a", 1: f"{url}/b"}, ENGINE_KEY)
        await scan.scan()
    assert scan.forged == {"victim"}
    assert scan.largest_service == 41.5
    assert seen_keys == {f"Bearer {ENGINE_KEY}": 2}


def test_a_tally_reports_every_answer_it_did_not_expect():
    tally = Tally(("400 invalid_json", "400 400"))
    for got in ("400 invalid_json", "400 400", "500 internal_error", "500 internal_error"):
        tally.record(got)
    assert tally.summary() == {
        "expected": "400 invalid_json or 400 400",
        "sent": 4,
        "unexpected": {"500 internal_error": 2},
    }


@pytest.mark.engine
def test_a_short_soak_loses_nothing_accepts_no_forgery_and_leaves_nothing_behind():
    run = subprocess.run(
        [sys.executable, "-m", "autellix_vllm", "bench", "soak", "--minutes", "0.25", "--json"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.stdout, run.stderr[-5000:]
    result = json.loads(run.stdout)
    assert run.returncode == 0, (
        result["failed_checks"], result["misbehaviour"], run.stderr[-5000:]
    )  # fmt: skip
    assert result["passed"] and result["programs"] >= 10
    assert result["programs_lost"] == 0 and result["forged_accepted"] == 0
    assert result["programs_completed"] + sum(result["failures"].values()) == result["programs"]
    # The killed engine: out of rotation at once, its group reaped, restarted, back.
    kill = result["kill"]
    assert result["engine_deaths"] == 1 and result["engine_restarts"] == 1
    assert kill["out_of_rotation_s"] < 5 and kill["group_reaped_s"] < 5
    assert kill["back_in_rotation_s"] is not None
    # Every kind of misbehaviour was tried and got its expected answer.
    for kind, tally in result["misbehaviour"].items():
        assert tally["sent"] >= 1 and not tally["unexpected"], (kind, tally)
    assert result["engine_table_scans"] >= 3 and result["engine_table_lookups"] >= 1
    assert 0 < result["largest_honest_service"] < 1e6
    health = result["health"]
    assert health["probes"] > 50 and not health["not_200"]
    assert health["max_ms"] == result["max_health_ms"] == health["slowest"][0]["ms"]
    assert 0 < health["max_router_on_cpu_ms"] <= 1000 * result["seconds"]
    assert 0 < result["router_rss_mb"] < 500
    # Nothing left running: serve, and every engine group it had.
    assert not os.path.exists(f"/proc/{result['serve_pid']}")
    for group in result["engine_groups"]:
        assert not group_members(group), group
