"""The examples against the real thing: the router (``autellix serve --upstream``)
in front of the session's shared CPU engine (tests/conftest.py), both example
scripts run as users run them, at the same time, with small counts; then the
demo driver: its comparison on engines of its own (the tiny model), and
interrupted over the shared engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
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
        assert isinstance(report["answer"], str)  # a random model may answer ""
        assert report["program_id"].startswith("prog-")  # issued by the router
        # The router's table saw every call of the program, in the program's threads.
        server = report["server"]
        assert server is not None and server["program_id"] == report["program_id"]
        assert server["calls_completed"] == report["calls"] > 0
        # The engine also counts the main thread the search's branches fork from.
        assert server["threads"] == report["threads"] + (report is mcts)
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


SMALL_MIX = ["--react-agents", "2", "--mcts-programs", "1", "--max-steps", "1", "--width", "2",
             "--iterations", "1", "--react-every", "0.2", "--react-after", "0"]  # fmt: skip


def start_demo(*options: str) -> subprocess.Popen[str]:
    # SIGINT back to its default in the demo: a suite run as a background job (a
    # CI runner, `make test &`) inherits it ignored, and Python then keeps it so.
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / "demo.py"), *SMALL_MIX, *options],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def refuses_connections(url: str) -> bool:
    try:
        urllib.request.urlopen(url + "/health", timeout=5)
    except urllib.error.URLError as error:
        return isinstance(error.reason, ConnectionRefusedError)
    return False


def router_url_in(output: str) -> str:
    found = re.search(r"router ready at (\S+);", output)
    assert found is not None, output
    return found[1]


def test_the_demo_compares_stock_vllm_with_autellix_and_stops_everything():
    demo = start_demo("--model", "tiny", "--ps-every", "0.5", "--max-steps", "3",
                      "--iterations", "2", "--rounds", "1")  # fmt: skip
    try:
        output, _ = demo.communicate(timeout=900)
    finally:
        demo.kill()
    assert demo.returncode == 0, output
    assert output.count("router ready at") == 2  # one serve per scheduler, started at once
    round_1, round_2 = output.split("=== round 1 of 2: autellix scheduling ===")[1].split(
        "=== round 2 of 2: stock vLLM scheduling ==="
    )
    # The first round shows the agents' steps, ps and the tables; the second only counts.
    assert "--- autellix ps" in round_1 and "react-2 step 1:" in round_1
    assert "CRIT PATH" in round_1 and "react_agent: " in round_1
    assert "of 2 answered right" in round_1
    assert "prog-" not in round_2 and "mcts_agent: " in round_2 and "of 1 solved" in round_2
    assert "demo: over all 2 rounds: mcts_agent: " in round_2
    table = round_2.split("demo: program latency")[1].splitlines()
    assert table[1].split()[:2] == ["EXAMPLE", "PROGRAMS"]
    assert [row.split()[0] for row in table[2:5]] == ["mcts", "react", "all"]
    assert table[4].split()[1] == "3" and table[4].rstrip().endswith("x")
    # A "why slower" line names the examples whose average ratio is below 1x.
    ratios = {row.split()[0]: float(row.split()[-3].rstrip("x")) for row in table[2:4]}
    named: list[str] = []
    if " slower under autellix: " in table[5]:
        named = table.pop(5).removeprefix("demo: ").split(" slower")[0].split(", ")
    assert all(ratios[name] <= 1 for name in named)  # two decimals: 0.996 prints 1.00
    assert all(name in named for name, ratio in ratios.items() if ratio < 1)
    assert table[5].startswith("demo: avg ratio of each pair of rounds: ")
    assert table[6].startswith("demo: the machine was ")
    assert output.rstrip().splitlines()[-1].startswith("demo: all processes stopped")
    for url in re.findall(r"router ready at (\S+);", output):
        assert refuses_connections(url)


def test_ctrl_c_stops_the_demo_and_everything_it_started(engine):
    # The demo's own default load, so it is still running when Ctrl-C comes.
    # More than the tiny engine finishes before the signal, even on an idle machine
    # (4 expansions were done in 4 s there).
    demo = start_demo("--upstream", engine.base_url, "--react-agents", "16", "--max-steps", "6",
                      "--mcts-programs", "2", "--width", "3", "--iterations", "40")  # fmt: skip
    lines: list[str] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("=== round 1 of "):
                break
        time.sleep(1)  # the examples are starting their programs
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=120)
    finally:
        demo.kill()
    output = "".join(lines) + rest
    assert demo.returncode == 130, output
    assert "demo: interrupted; stopping everything" in output
    assert output.rstrip().splitlines()[-1].startswith("demo: all processes stopped")
    assert refuses_connections(router_url_in(output))
    kept = re.search(r"logs kept in (\S+)", output)
    assert kept is not None, output
    assert not processes_mentioning(kept[1])  # no example script is left running
    shutil.rmtree(kept[1])


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as cmdline:
            if text.encode() in cmdline.read():
                found.append(int(entry))
    return found
