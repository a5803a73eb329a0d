"""The examples against the real thing: the router (``autellix serve --upstream``)
in front of the session's shared CPU engine (tests/conftest.py), both example
scripts run as users run them, at the same time, with small counts."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from pathlib import Path

import pytest
from demo import EXAMPLES, Serve

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def router(engine):
    """A router process over the shared engine (no engine of its own)."""
    serve = Serve.start("--upstream", engine.base_url, "--chars-per-token", "1",
                        "--health-interval", "0.5")  # fmt: skip
    try:
        serve.wait_ready()
        yield serve
    finally:
        serve.stop()
    assert serve.process.returncode is not None


async def run_script(script: str, router: Serve, reports: Path, *options: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLES / script), "--base-url", router.url + "/v1",
        "--json", str(reports), *options,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout=600)
    finally:
        if process.returncode is None:  # timed out, or the other script failed first
            process.kill()
            await process.wait()
    text = output.decode(errors="replace")
    details = reports.read_text() if reports.is_file() else ""
    assert process.returncode == 0, text + details
    return text


def table(router: Serve) -> dict:
    with urllib.request.urlopen(router.url + "/autellix/v1/programs", timeout=10) as answer:
        return json.load(answer)


async def test_react_and_mcts_programs_run_together_on_the_router(router, tmp_path):
    react_json, mcts_json = tmp_path / "react.json", tmp_path / "mcts.json"
    react_out, mcts_out = await asyncio.gather(
        run_script("react_agent.py", router, react_json, "--agents", "2", "--max-steps", "2"),
        run_script("mcts_agent.py", router, mcts_json, "--programs", "1", "--width", "2",
                   "--iterations", "2"),
    )  # fmt: skip
    react, [mcts] = json.loads(react_json.read_text()), json.loads(mcts_json.read_text())
    assert len(react) == 2
    for report in [*react, mcts]:
        assert report["error"] is None
        assert report["answer"]
        assert report["program_id"].startswith("prog-")  # issued by the router
        # The router's table saw every call of the program, in the program's threads.
        server = report["server"]
        assert server is not None and server["program_id"] == report["program_id"]
        assert server["calls_completed"] == report["calls"] > 0
        assert server["threads"] == report["threads"]
        assert server["calls_failed"] == 0 and server["service"] > 0
        assert server["waiting_time"] >= 0
    assert all(report["threads"] == 1 for report in react)
    assert mcts["threads"] > 1  # every expansion forked --width threads
    assert int(mcts["columns"]["TREE"]) >= 1
    # The printed tables have a row per program with the server's numbers.
    assert react_out.count("react-") >= 2 and "WAIT" in react_out
    assert "mcts-1" in mcts_out and "CRIT PATH" in mcts_out
    # Every program was ended: none is left in the router's table.
    ids = {report["program_id"] for report in [*react, mcts]}
    assert not ids & {row["program_id"] for row in table(router)["programs"]}
