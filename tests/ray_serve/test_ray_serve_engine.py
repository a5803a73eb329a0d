"""The Ray Serve application end to end: a local Ray cluster, two tiny-model engine
replicas, two ingress replicas, the directory with its flow-control gate and the
program-aware router; then one replica killed while programs run. Starts and stops
everything itself (a few minutes on two cores: most of it is the two engines
starting). Every call but the flow-control test's batch calls is interactive
(band 0), which the gate never holds."""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time

import httpx
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("vllm")

from autellix_vllm.policy.flow_control import FlowControlConfig  # noqa: E402
from autellix_vllm.ray_serve.app import RayServeConfig, build_app  # noqa: E402
from ray import serve  # noqa: E402

pytestmark = pytest.mark.engine

APP = "autellix"
ENGINE = {"model": "tiny", "max_num_seqs": 4, "max_model_len": 512, "kv_cache_gib": 1,
          "engines_on_host": 2}  # fmt: skip
SEATS = 2 * ENGINE["max_num_seqs"]
# A reserve of the whole pool: one interactive call in flight holds every batch call.
GATE = FlowControlConfig(seat_share=1.0, reserve_share=1.0, linger_s=1.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def base_url():
    port = free_port()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        # Threshold 0: every call is long, so every program binds (sticky). Two
        # ingress replicas: a program's calls enter through either (Serve's proxy
        # picks), so the table and the bindings they share are the directory's.
        config = RayServeConfig(
            engine=ENGINE, replicas=2, ingress_replicas=2, locality_threshold=0, flow_control=GATE
        )
        serve.run(build_app(config), name=APP, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def model(http) -> str:
    return http.get("/v1/models").json()["data"][0]["id"]


def chat(http, model, program_id, call_id, stream=False, max_tokens=8, priority=None, **options):
    body = {"model": model, "messages": [{"role": "user", "content": f"hello {call_id}"}],
            "max_tokens": max_tokens, "stream": stream}  # fmt: skip
    headers = {"X-Autellix-Program-Id": program_id, "X-Autellix-Call-Id": call_id}
    if priority is not None:
        headers["X-Autellix-Priority"] = priority
    return http.post("/v1/chat/completions", json=body, headers=headers, **options)


def program(http, pid) -> dict:
    rows = http.get("/autellix/v1/programs", params={"limit": 1000}).json()["programs"]
    return next(row for row in rows if row["program_id"] == pid)


def settled(http, pid, calls) -> dict:
    """The program's row once the reports of its ``calls`` have reached the directory."""
    deadline = time.monotonic() + 10
    while True:
        row = program(http, pid)
        if row["calls_completed"] + row["calls_failed"] >= calls or time.monotonic() > deadline:
            return row
        time.sleep(0.1)


def test_a_programs_calls_stick_to_one_replica_and_its_service_adds_up(http, model):
    pid = http.post("/autellix/v1/programs", json={"name": "ray-test"}).json()["program_id"]
    for i in range(6):
        answer = chat(http, model, pid, f"c{i}")
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] is not None
    row = settled(http, pid, 6)
    assert row["calls_completed"] == 6 and len(row["engines"]) == 1, row
    assert row["engine"] in row["engines"] and row["service"] > 0


def test_a_stream_is_relayed_with_its_events_and_done(http, model):
    pid = http.post("/autellix/v1/programs").json()["program_id"]
    answer = chat(http, model, pid, "s1", stream=True)
    assert answer.status_code == 200
    events = [line for line in answer.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 2
    # The usage chunk the ingress asked for is not passed on.
    assert all('"usage"' not in e or '"choices":[{' in e for e in events[:-1])
    assert settled(http, pid, 1)["calls_completed"] == 1


def test_errors_are_the_routers_bodies(http, model):
    unknown = http.post("/v1/chat/completions", json={"model": "nope", "messages": []})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    pid = http.post("/autellix/v1/programs").json()["program_id"]
    assert http.delete(f"/autellix/v1/programs/{pid}").json() == {"program_id": pid, "ended": True}
    late = chat(http, model, pid, "late")
    assert late.status_code == 404 and late.json()["error"]["code"] == "program_ended"
    assert http.get("/nowhere").json()["error"]["code"] == "not_found"
    bad_page = http.get("/autellix/v1/programs", params={"limit": 0})
    assert bad_page.status_code == 400 and bad_page.json()["error"]["param"] == "limit"
    broken = http.post("/v1/chat/completions", content=b"{", headers={"Content-Type": "x"})
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"


def eventually(read, wanted, timeout_s=60.0):
    """``read()`` once ``wanted`` of it holds (failing with the last value after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not wanted(value := read()):
        assert time.monotonic() < deadline, value
        time.sleep(0.1)
    return value


def test_a_batch_flood_waits_at_the_directory_while_an_interactive_call_goes(http, model):
    """The test takes an interactive seat at the directory itself, as a long
    interactive call would, so that the flood is held for as long as the test
    needs on a loaded machine; the gate is the directory's, over both ingress
    replicas."""
    directory = serve.get_deployment_handle("ProgramDirectory", APP)

    def flow() -> dict:
        return directory.flow.remote().result()

    programs = [http.post("/autellix/v1/programs").json()["program_id"] for _ in range(6)]
    *flood, gone = programs
    assert directory.enter.remote("test-seat", 0, "test").result() is not None
    with concurrent.futures.ThreadPoolExecutor(len(programs)) as pool:
        batch = [pool.submit(chat, http, model, pid, "b1", priority="batch") for pid in flood]
        eventually(flow, lambda now: now["held"] == {"batch": len(flood)})
        # A client that leaves while its call is held: the call leaves the queue.
        leaving = pool.submit(chat, http, model, gone, "g1", priority="batch", timeout=5.0)
        eventually(flow, lambda now: now["held"] == {"batch": len(programs)})
        with pytest.raises(httpx.ReadTimeout):
            leaving.result()
        eventually(flow, lambda now: now["held"] == {"batch": len(flood)})
        # An interactive call goes at once, past the held ones.
        agent = http.post("/autellix/v1/programs").json()["program_id"]
        assert chat(http, model, agent, "i1").status_code == 200
        assert flow()["held"] == {"batch": len(flood)}
        assert all(not call.done() for call in batch)
        directory.leave.remote(["test-seat"]).result()
        assert [call.result().status_code for call in batch] == [200] * len(flood)
    # Nothing held is lost, and every call that went has ended: no seat is kept.
    eventually(flow, lambda now: now == {"held": {}, "in_flight": 0})
    left = settled(http, gone, 1)
    assert (left["calls_completed"], left["calls_failed"], left["engines"]) == (0, 1, {})
    assert all(settled(http, pid, 1)["calls_completed"] == 1 for pid in flood)


def test_killing_a_replica_mid_run_loses_no_program(http, model):
    programs = [http.post("/autellix/v1/programs").json()["program_id"] for _ in range(4)]
    for pid in programs:
        assert chat(http, model, pid, "c0").status_code == 200
    bound = {pid: settled(http, pid, 1)["engine"] for pid in programs}
    victim = max(set(bound.values()), key=list(bound.values()).count)

    killed = threading.Event()

    def run(pid: str) -> list[int]:
        # Calls go on until the kill has happened and two more have been made, so
        # every program has calls after its replica died (a fast engine could
        # otherwise finish a fixed count before the kill).
        statuses, after_kill = [], 0
        while after_kill < 2:
            after_kill += killed.is_set()
            statuses.append(
                chat(http, model, pid, f"c{len(statuses) + 1}", max_tokens=16).status_code
            )
        return statuses

    with concurrent.futures.ThreadPoolExecutor(len(programs)) as pool:
        runs = {pid: pool.submit(run, pid) for pid in programs}
        time.sleep(1.0)
        replica = next(
            a for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].endswith(victim) and "EngineReplica" in a["name"]
        )  # fmt: skip
        ray.kill(ray.get_actor(replica["name"], namespace=replica["namespace"]))
        killed.set()
        statuses = {pid: future.result() for pid, future in runs.items()}
    assert all(set(s) == {200} for s in statuses.values()), statuses
    moved = [pid for pid in programs if bound[pid] == victim]
    for pid in moved:
        calls = 1 + len(statuses[pid])
        row = settled(http, pid, calls)
        assert row["calls_completed"] == calls and row["engine"] != victim, row
