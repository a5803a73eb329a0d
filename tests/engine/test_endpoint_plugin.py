"""The engine's own endpoints and metrics, without an engine behind them."""

import pytest

pytest.importorskip("vllm")

from autellix_vllm.engine.endpoint_plugin import build_router  # noqa: E402
from autellix_vllm.engine.metrics import TableCollector  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

PATHS = [("get", "/autellix/v1/engine/table"), ("delete", "/autellix/v1/engine/programs/p")]


def client(key):
    app = FastAPI()
    app.include_router(build_router(key))
    app.state.autellix_engine_client = None  # no engine: past the key check, a 503
    return TestClient(app)


@pytest.mark.parametrize(("method", "path"), PATHS)
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "engine-key"])
def test_an_engine_with_a_key_answers_401_without_it(method, path, authorization):
    headers = {"Authorization": authorization} if authorization else {}
    response = getattr(client("engine-key"), method)(path, headers=headers)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.json() == {
        "error": {
            "message": "the engine key is needed: Authorization: Bearer <key>",
            "type": "authentication_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


@pytest.mark.parametrize(("method", "path"), PATHS)
def test_the_key_holder_and_any_caller_of_an_engine_without_a_key_get_through(method, path):
    keyed = getattr(client("engine-key"), method)(
        path, headers={"Authorization": "Bearer engine-key"}
    )
    open_engine = getattr(client(None), method)(path)
    assert keyed.status_code == open_engine.status_code == 503
    assert keyed.json()["error"]["code"] == "no_engine"


def test_limit_and_failure_counters_are_labelled_metrics():
    snapshot = {
        "programs": [],
        "queue_depth": [0],
        "calls_over_limit": {"max_fork_depth": 16},
        "hook_failures": {"base": 3, "charge": 1},
        "waiter_preemptions": {"seat": 2, "kv_blocks": 1, "token_budget": 0},
    }
    families = {family.name: family for family in TableCollector(lambda: snapshot).collect()}
    over = families["autellix_calls_over_limit"].samples
    failures = families["autellix_hook_failures"].samples
    waiters = families["autellix_waiter_preemptions"].samples
    assert [(s.labels, s.value) for s in over] == [({"limit": "max_fork_depth"}, 16)]
    assert {s.labels["hook"]: s.value for s in failures} == {"base": 3, "charge": 1}
    assert {s.labels["reason"]: s.value for s in waiters} == snapshot["waiter_preemptions"]


def test_the_holds_are_gauges_and_one_counter_by_event():
    residency = {"held_programs": 2, "held_blocks": 40, "holds_granted": 5, "holds_broken": 1}
    snapshot = {"programs": [], "queue_depth": [0], "residency": residency}
    families = {family.name: family for family in TableCollector(lambda: snapshot).collect()}
    assert families["autellix_held_blocks"].samples[0].value == 40
    assert families["autellix_held_programs"].samples[0].value == 2
    events = families["autellix_holds"].samples
    assert {s.labels["event"]: s.value for s in events} == {"granted": 5, "broken": 1}
    assert {s.name for s in events} == {"autellix_holds_total"}


def test_every_family_is_described_before_the_first_snapshot():
    collector = TableCollector(dict)  # no snapshot fetched yet
    described = {family.name for family in collector.describe()}
    assert {"autellix_holds", "autellix_held_blocks", "autellix_queue_depth"} <= described
    assert list(collector.collect()) == []
