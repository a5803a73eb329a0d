"""``autellix ray-serve`` as a user runs it (a local Ray cluster, one tiny-model engine
replica, named keys): a program's calls reach the engine under its key's owner, a
call without the SDK's headers joins a derived program as through the router, and
SIGTERM stops every process the command started. The engine's table is read
straight from the engine, with the key its replica gave it. A few minutes on two
cores, most of it the engine starting; the tests run in order, the last stops it."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("ray")
pytest.importorskip("vllm")
psutil = pytest.importorskip("psutil")

from autellix_vllm.engine.launcher import REAPER_MODULE  # noqa: E402
from autellix_vllm.protocol.paths import (  # noqa: E402
    CHAT_COMPLETIONS_PATH,
    ENGINE_TABLE_PATH,
    PROGRAMS_PATH,
)
from autellix_vllm.router.keys import KeyRing, load_api_keys  # noqa: E402
from ray_serve_process import STOP_TIMEOUT_S, RayServed, start_ray_serve, stop_ray_serve  # noqa: E402

pytestmark = pytest.mark.engine

ALICE, BOB = "sk-alice-ray-test-1", "sk-bob-ray-test-2"


class Served:
    """The running command and its keys file."""

    def __init__(self, command: RayServed, keys: Path) -> None:
        self.command = command
        self.keys = keys

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.command.url, timeout=120, headers={"Authorization": f"Bearer {key}"}
        )

    def owner_of(self, key: str) -> str:
        """The owner id the ingress gives ``key``'s programs."""
        client = KeyRing.build(None, load_api_keys(self.keys)).client_for(f"Bearer {key}")
        assert client is not None
        return client.owner

    def engine_rows(self, program_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The engine's own table rows of ``program_ids``, asked of the engine with
        the key its replica started it with."""
        [(url, key)] = self.command.engines()
        answer = httpx.post(
            url + ENGINE_TABLE_PATH,
            json={"program_ids": program_ids},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        answer.raise_for_status()
        return {row["program_id"]: row for row in answer.json()["programs"]}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("ray-serve")
    keys = folder / "keys"
    keys.write_text(f"alice: {ALICE}\nbob: {BOB}\n")
    command = start_ray_serve(
        folder, "--model", "tiny", "--replicas", "1", "--api-keys-file", str(keys),
        "--max-num-seqs", "4", "--max-model-len", "512", "--chars-per-token", "1",
        ready_key=ALICE,
    )  # fmt: skip
    try:
        yield Served(command, keys)
    finally:
        stop_ray_serve(command)  # nothing left to stop once the last test ran


def chat(client: httpx.Client, headers: dict[str, str] | None = None, **body: Any) -> dict:
    model = client.get("/v1/models").json()["data"][0]["id"]
    payload = {"model": model, "max_tokens": 4,
               "messages": [{"role": "user", "content": "hello"}], **body}  # fmt: skip
    answer = client.post(CHAT_COMPLETIONS_PATH, json=payload, headers=headers or {})
    assert answer.status_code == 200, answer.text
    return answer.json()


def listed(client: httpx.Client, calls: int) -> dict[str, dict[str, Any]]:
    """The caller's programs once ``calls`` calls of theirs have been reported."""
    deadline = time.monotonic() + 10
    while True:
        rows = client.get(PROGRAMS_PATH, params={"limit": 1000}).json()["programs"]
        done = sum(r["calls_completed"] + r["calls_failed"] for r in rows)
        if done >= calls or time.monotonic() > deadline:
            return {row["program_id"]: row for row in rows}
        time.sleep(0.1)


def test_a_programs_calls_reach_the_engine_under_its_keys_owner(served):
    with served.client(ALICE) as alice:
        pid = alice.post(PROGRAMS_PATH, json={"name": "owned"}).json()["program_id"]
        chat(alice, {"X-Autellix-Program-Id": pid, "X-Autellix-Call-Id": "c1"})
        # A forged owner is not the client's to state.
        chat(alice, {"X-Autellix-Program-Id": pid, "X-Autellix-Owner": "someone-else"})
        assert listed(alice, 2)[pid]["calls_completed"] == 2
    row = served.engine_rows([pid])[pid]
    assert row["owner"] == served.owner_of(ALICE) != served.owner_of(BOB)
    assert row["calls_completed"] == 2


def test_a_call_without_the_sdks_headers_joins_a_derived_program(served):
    with served.client(ALICE) as alice, served.client(BOB) as bob:
        chat(alice, prompt_cache_key="task-1")
        chat(alice, prompt_cache_key="task-1")
        chat(bob, prompt_cache_key="task-1")
        derived = [
            row for row in listed(alice, 4).values() if row["name"] == "prompt_cache_key=task-1"
        ]
        [bobs] = [r for r in listed(bob, 1).values() if r["name"] == "prompt_cache_key=task-1"]
    [row] = derived
    assert row["program_id"].startswith("derived-") and row["calls_completed"] == 2
    assert bobs["program_id"] != row["program_id"]
    on_engine = served.engine_rows([row["program_id"], bobs["program_id"]])
    assert on_engine[row["program_id"]]["owner"] == served.owner_of(ALICE)
    assert on_engine[bobs["program_id"]]["owner"] == served.owner_of(BOB)


def engine_among(command: RayServed, timeout_s: float = 300) -> list[psutil.Process]:
    """The command's processes, with every process of its engines' process groups
    (an engine's reaper heads one; a process whose parent died is no longer a
    descendant), once an engine core is among them. Serve replaces a replica whose
    engine failed three health checks (a loaded machine), and the new engine takes
    a while to start its core."""
    deadline = time.monotonic() + timeout_s
    while True:
        started = {p.pid: p for p in command.started()}
        groups = set()
        for process in started.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                if REAPER_MODULE in process.cmdline():
                    groups.add(os.getpgid(process.pid))
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                if os.getpgid(process.pid) in groups:
                    started.setdefault(process.pid, process)
        names = set()
        for process in started.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                names.add(process.name())
        if any("EngineCor" in name for name in names):  # comm keeps 15 characters
            return list(started.values())
        if time.monotonic() > deadline:
            tail = command.output.read_text(errors="replace")[-3000:]
            pytest.fail(f"no engine core among {sorted(names)}; the command's output:\n{tail}")
        time.sleep(1)


def test_sigterm_stops_every_process_the_command_started(served):
    started = engine_among(served.command)
    served.command.process.send_signal(signal.SIGTERM)
    assert served.command.process.wait(STOP_TIMEOUT_S) == 0

    def alive() -> list[str]:
        found = []
        for process in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    found.append(f"{process.pid} {process.name()}")
        return found

    deadline = time.monotonic() + 10  # the kernel finishing what was killed
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive() == []
