"""The routing rule and the router's tables, with fake load signals (no HTTP, no engine)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from autellix_vllm.policy.config import ProgramLimits, TableBounds
from autellix_vllm.policy.routing import Balancer, EngineLoad, Route, least_loaded, make_balancer
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.router.calls import Call
from autellix_vllm.router.config import RouterConfig
from autellix_vllm.router.dispatch import Dispatcher
from autellix_vllm.router.engines import Engine, EnginePool
from autellix_vllm.router.errors import ApiError
from autellix_vllm.router.keys import Client
from autellix_vllm.router.metrics import RouterMetrics
from autellix_vllm.router.programs import (
    CallIdReused,
    ProgramEnded,
    ProgramLimitExceeded,
    ProgramNotFound,
    ProgramTable,
    TooManyPrograms,
)

MODEL = "m"
THRESHOLD = 100


def make_dispatcher(balancer: str | Balancer = "locality", engines: int = 2) -> Dispatcher:
    urls = tuple(f"http://127.0.0.1:{9000 + i}" for i in range(engines))
    chosen = make_balancer(balancer, THRESHOLD) if isinstance(balancer, str) else balancer
    config = RouterConfig(upstreams=urls, locality_threshold=THRESHOLD)
    metrics = RouterMetrics()
    pool = EnginePool(
        urls, session=None, metrics=metrics, interval_s=1, timeout_s=1, failures_to_drop=1
    )  # type: ignore[arg-type]
    for engine in pool.engines:
        engine.models = {MODEL: {"id": MODEL}}
        pool.mark_up(engine)
    programs = ProgramTable(TableBounds(idle_ttl_s=600, ended_ids_kept=10), on_drop=chosen.forget)
    dispatcher = Dispatcher(config, None, pool, programs, chosen, metrics)  # type: ignore[arg-type]
    pool.on_down = dispatcher.engine_down
    return dispatcher


def call(program: str | None, tokens: int, model: str = MODEL) -> Call:
    return Call(
        path="/v1/completions",
        body={},
        raw=b"{}",
        model=model,
        stream=False,
        identity=CallIdentity(program),
        prompt_tokens=tokens,
    )


def route(d: Dispatcher, program: str | None, tokens: int, exclude=()) -> Engine:
    """Route one call of ``program`` and finish it (without service), as ``handle`` does."""
    record = d.programs.call_arrived(CallIdentity(program)) if program else None
    engine = None
    try:
        engine = d.choose(call(program, tokens), program or "anonymous", record, exclude)
        return engine
    finally:
        if record is not None:
            name = engine.name if engine else None
            d.programs.call_finished(record, None, engine=name, service=None, completed=True)


def set_load(d: Dispatcher, in_flight: list[int], waiting: list[int] | None = None) -> None:
    for engine, busy, queued in zip(
        d.pool.engines, in_flight, waiting or [0] * len(in_flight), strict=True
    ):
        engine.in_flight, engine.waiting = busy, queued


def test_short_calls_go_to_the_least_loaded_engine():
    d = make_dispatcher()
    set_load(d, [3, 1])
    assert route(d, "p", THRESHOLD).name == "engine-1"  # at the threshold: still "short"
    set_load(d, [0, 1])
    assert route(d, "p", 10).name == "engine-0"
    assert d.programs.get("p").engine is None  # short calls bind nothing


def test_load_signal_is_in_flight_plus_the_engines_waiting_queue():
    d = make_dispatcher()
    set_load(d, in_flight=[1, 3], waiting=[4, 0])
    assert [e.load for e in d.pool.engines] == [5, 3]
    assert route(d, None, 10).name == "engine-1"


def test_long_calls_bind_on_first_use_then_stick_despite_load():
    d = make_dispatcher()
    set_load(d, [2, 0])
    assert route(d, "p", THRESHOLD + 1).name == "engine-1"
    set_load(d, [0, 9])
    assert route(d, "p", 5000).name == "engine-1"
    assert route(d, "p", 10).name == "engine-0"  # a short call of the same program spreads
    assert d.programs.get("p").engine == "engine-1"
    assert route(d, "q", 5000).name == "engine-0"  # another program binds elsewhere


def test_a_dead_engine_loses_its_programs_which_rebind_on_their_next_long_call():
    d = make_dispatcher()
    set_load(d, [0, 1])
    assert route(d, "p", 500).name == "engine-0"
    d.pool.mark_down(d.pool.engines[0], "killed")
    assert [e.name for e in d.pool.healthy()] == ["engine-1"]
    assert route(d, "p", 500).name == "engine-1"
    record = d.programs.get("p")
    assert record.engine == "engine-1" and record.rebinds == 1
    d.pool.mark_up(d.pool.engines[0])  # back: the program stays where it rebound
    set_load(d, [0, 5])
    assert route(d, "p", 500).name == "engine-1"


def test_a_retry_excludes_the_engine_that_failed():
    d = make_dispatcher()
    first = route(d, "p", 500)
    second = route(d, "p", 500, exclude=[first])
    assert second is not first
    assert d.programs.get("p").engine == second.name
    with pytest.raises(ApiError) as error:
        route(d, "p", 500, exclude=d.pool.engines)
    assert error.value.status == 502 and error.value.code == "engine_unreachable"
    for engine in d.pool.engines:
        d.pool.mark_down(engine, "gone")
    with pytest.raises(ApiError) as error:
        route(d, "p", 500)
    assert error.value.status == 503 and error.value.code == "no_healthy_engine"


def test_only_engines_serving_the_model_are_candidates():
    d = make_dispatcher()
    d.pool.engines[0].models = {"other": {"id": "other"}}
    set_load(d, [0, 7])
    assert d.choose(call(None, 1), "k", None).name == "engine-1"
    with pytest.raises(ApiError):
        d.choose(call(None, 1, model="missing"), "k", None)


def test_round_robin_alternates_and_consistent_hash_is_stable():
    rr = make_dispatcher("round-robin")
    assert [route(rr, "p", 5000).name for _ in range(4)] == ["engine-0", "engine-1"] * 2
    ch = make_dispatcher("consistent-hash", engines=3)
    owners = {f"prog-{i}": route(ch, f"prog-{i}", 1).name for i in range(30)}
    assert len(set(owners.values())) == 3  # spread over all engines
    set_load(ch, [9, 0, 0])
    assert all(route(ch, p, 1).name == owner for p, owner in owners.items())  # ignores load


def test_the_routing_reason_is_counted_per_engine():
    d = make_dispatcher()
    route(d, "p", 500)
    route(d, "p", 500)
    route(d, "p", 5)
    text = d.metrics.render().decode()
    assert 'autellix_router_calls_total{engine="engine-0",reason="bind"} 1.0' in text
    assert 'autellix_router_calls_total{engine="engine-0",reason="sticky"} 1.0' in text
    assert 'reason="least-loaded"} 1.0' in text


def test_issued_ids_are_unguessable_and_unique():
    table = ProgramTable(TableBounds(idle_ttl_s=600, ended_ids_kept=10))
    ids = {table.issue().program_id for _ in range(1000)}
    assert len(ids) == 1000
    token = next(iter(ids)).removeprefix("prog-")
    assert len(token) * 6 >= 128  # url-safe base64: 6 bits per character


def test_unknown_ids_open_programs_and_ended_ids_are_refused_within_a_bound():
    table = ProgramTable(TableBounds(idle_ttl_s=600, ended_ids_kept=3))
    assert table.call_arrived(CallIdentity("sdk-local-id")).issued is False
    for i in range(5):
        table.call_arrived(CallIdentity(f"p{i}"))
        assert table.end(f"p{i}") is not None
    with pytest.raises(ProgramEnded):
        table.call_arrived(CallIdentity("p4"))
    assert table.is_ended("p2") and not table.is_ended("p1")  # the oldest are forgotten
    with pytest.raises(ProgramEnded):
        table.end("p4")
    with pytest.raises(ProgramNotFound):
        table.end("never")


def test_service_sums_over_engines_and_failed_calls_are_charged_their_work():
    table = ProgramTable(TableBounds(idle_ttl_s=600, ended_ids_kept=3))
    for engine, call_id in (("engine-0", "c1"), ("engine-1", "c2"), ("engine-1", "c3")):
        record = table.call_arrived(CallIdentity("p", thread_id="main", call_id=call_id))
        table.call_finished(record, call_id, engine=engine, service=10.0, completed=True)
    record = table.call_arrived(CallIdentity("p", thread_id="side", call_id="c4"))
    table.call_finished(record, "c4", engine=None, service=None, completed=False)  # no engine
    record = table.call_arrived(
        CallIdentity("p", thread_id="side", call_id="c4")
    )  # its retry: allowed
    table.call_finished(record, "c4", engine="engine-0", service=2.5, completed=False)  # dropped
    assert record.service == 32.5
    assert record.calls_per_engine == {"engine-0": 1, "engine-1": 2}
    assert (record.calls_completed, record.calls_failed, len(record.threads)) == (3, 2, 2)


def test_idle_programs_are_evicted_but_not_ended():
    now = [1000.0]
    table = ProgramTable(TableBounds(idle_ttl_s=60, ended_ids_kept=3), clock=lambda: now[0])
    busy, idle = table.call_arrived(CallIdentity("busy")), table.call_arrived(CallIdentity("idle"))
    table.call_finished(idle, "c1", engine="engine-0", service=1.0, completed=True)
    now[0] += 61
    assert table.evict_idle() == ["idle"]
    assert table.get("busy") is busy and not table.is_ended("idle")
    assert table.call_arrived(CallIdentity("idle")) is not idle  # a later call opens it again


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="loopback"):
        RouterConfig(upstreams=("http://10.1.2.3:8000",), api_key="k")
    RouterConfig(upstreams=("http://10.1.2.3:8000",), api_key="k", allow_remote_upstreams=True)
    RouterConfig(upstreams=("http://localhost:8000", "http://[::1]:8001"), api_key="k")
    RouterConfig(upstreams=("http://h:1",), locality_threshold=0)  # every program bound
    for bad in (
        {"upstreams": ()},
        {"upstreams": ("ftp://x",)},
        {"upstreams": ("http://h:1/v1",)},
        {"upstreams": ("http://h:1", "http://h:1/")},
        {"upstreams": ("http://h:1",), "balancer": "random"},
        {"upstreams": ("http://h:1",), "max_body_bytes": 0},
        {"upstreams": ("http://h:1",), "locality_threshold": -1},
    ):
        with pytest.raises(ValueError):
            RouterConfig(**bad)


def test_a_program_that_leaves_the_table_leaves_the_balancer_too():
    d = make_dispatcher()
    route(d, "ended", 500)
    route(d, "idle", 500)
    assert set(d.balancer.bindings) == {"ended", "idle"}
    d.programs.end("ended")
    d.programs.clock = lambda: 1e12  # far in the future: everything idle is dropped
    d.programs.evict_idle()
    assert d.balancer.bindings == {}


class Pinning(Balancer):
    """Pins each program to the least-loaded engine on first use; ``binds`` is a parameter
    and the reasons are ones the router has never heard of."""

    def __init__(self, binds: bool, reason: str) -> None:
        self.binds, self.reason = binds, reason
        self.pinned: dict[str, str] = {}

    def choose(self, program_id: str, prompt_tokens: int, engines: Sequence[EngineLoad]) -> Route:
        names = [e.name for e in engines]
        if self.pinned.get(program_id) not in names:
            self.pinned[program_id] = names[least_loaded(engines)]
        return Route(names.index(self.pinned[program_id]), self.reason, binds=self.binds)

    def forget(self, program_id: str) -> None:
        self.pinned.pop(program_id, None)


def test_a_binding_route_binds_whatever_its_reason_and_rebinds_after_engine_loss():
    d = make_dispatcher(Pinning(binds=True, reason="pinned-here"))
    set_load(d, [0, 1])
    assert route(d, "p", 1).name == "engine-0"
    assert d.programs.get("p").engine == "engine-0"
    d.pool.mark_down(d.pool.engines[0], "killed")
    assert "p" not in d.balancer.pinned  # the balancer was told to forget the binding
    d.pool.mark_up(d.pool.engines[0])  # back, but its KV is gone: no reason to return there
    set_load(d, [5, 0])
    assert route(d, "p", 1).name == "engine-1"
    record = d.programs.get("p")
    assert record.engine == "engine-1" and record.rebinds == 1
    assert record.calls_per_engine == {"engine-0": 1, "engine-1": 1}


def test_a_route_that_does_not_bind_records_no_binding_even_if_its_reason_says_bind():
    d = make_dispatcher(Pinning(binds=False, reason="bind"))
    assert route(d, "p", 1).name == "engine-0"
    assert d.programs.get("p").engine is None
    d.pool.mark_down(d.pool.engines[0], "killed")
    assert d.balancer.pinned == {"p": "engine-0"}  # not bound, so nothing to forget
    assert d.programs.get("p").rebinds == 0


def test_a_routed_engine_is_listed_before_the_call_completes():
    d = make_dispatcher()
    record = d.programs.call_arrived(CallIdentity("p"))
    engine = d.choose(call("p", 500), "p", record)
    assert record.calls_per_engine == {engine.name: 0}  # ending the program reaches it
    assert record.calls_active == 1


# ---- owners, bounds and limits of the table ------------------------------------------

ALICE, BOB = Client("key-a", "alice"), Client("key-b", "bob")
ADMIN = Client("key-admin", "admin", admin=True)


def test_the_table_is_capped_per_owner_and_in_all_after_dropping_idle_programs():
    now = [0.0]
    bounds = TableBounds(idle_ttl_s=60, ended_ids_kept=10, max_programs=5, max_programs_per_key=3)
    table = ProgramTable(bounds, clock=lambda: now[0])
    for _ in range(3):
        table.issue(caller=ALICE)
    with pytest.raises(TooManyPrograms, match="this key has 3"):
        table.issue(caller=ALICE)
    with pytest.raises(TooManyPrograms):
        table.call_arrived(
            CallIdentity("alice-local"), caller=ALICE
        )  # a call's new program counts too
    table.issue(caller=BOB)
    table.issue(caller=BOB)
    with pytest.raises(TooManyPrograms, match="holds 5 programs"):
        table.issue(caller=ADMIN)
    now[0] += 61  # every program is idle now: dropped to make room
    assert table.issue(caller=ALICE).owner == "key-a" and len(table) == 1


def test_pages_follow_the_opening_order_through_removals():
    table = ProgramTable(
        TableBounds(idle_ttl_s=600, ended_ids_kept=10, max_programs_per_key=10_000)
    )
    opened = [table.issue(caller=ALICE).program_id for _ in range(3000)]
    bob = table.issue(caller=BOB).program_id
    for program_id in opened[::2]:  # half of them end: the order compacts once
        table.end(program_id, ALICE)
    kept, after = [], None
    while True:
        page = table.page(ALICE, after, 400)
        kept += [r.program_id for r in page.records]
        assert page.total == 1500
        if page.next_after is None:
            break
        after = page.next_after
    assert kept == opened[1::2]
    assert [r.program_id for r in table.page(BOB, None, 10).records] == [bob]
    assert table.page(ADMIN, None, 10_000).total == 1501
    assert table.page(Client("key-c", "carol"), None, 10).records == []


def test_another_owners_program_is_not_found_and_its_end_is_not_revealed():
    table = ProgramTable(TableBounds(idle_ttl_s=600, ended_ids_kept=10))
    program_id = table.issue(caller=ALICE).program_id
    for act in (lambda: table.call_arrived(CallIdentity(program_id), caller=BOB),
                lambda: table.end(program_id, BOB)):  # fmt: skip
        with pytest.raises(ProgramNotFound):
            act()
    table.call_arrived(CallIdentity(program_id), caller=ADMIN)  # the admin may
    table.end(program_id, ALICE)
    with pytest.raises(ProgramEnded):
        table.call_arrived(CallIdentity(program_id), caller=ALICE)
    with pytest.raises(ProgramNotFound):
        table.call_arrived(CallIdentity(program_id), caller=BOB)


def test_thread_depth_counts_forks_below_main_and_limits_refuse_before_any_change():
    limits = ProgramLimits(max_threads=5, max_fork_depth=2, max_live_calls=2)
    table = ProgramTable(TableBounds(idle_ttl_s=600, ended_ids_kept=10, limits=limits))
    record = table.call_arrived(CallIdentity("p", thread_id="main"))
    table.call_arrived(
        CallIdentity("p", thread_id="t2", parent_thread_id="t1")
    )  # t1 named first: a fork of main
    assert record.threads == {"main": 0, "t1": 1, "t2": 2}
    with pytest.raises(ProgramLimitExceeded, match="max_live_calls"):
        table.call_arrived(CallIdentity("p", thread_id="t3", parent_thread_id="main"))
    for _ in range(2):
        table.call_finished(record, None, engine="engine-0", service=None, completed=True)
    with pytest.raises(ProgramLimitExceeded, match="max_fork_depth") as deep:
        table.call_arrived(CallIdentity("p", thread_id="t3", parent_thread_id="t2"))
    assert deep.value.code == "fork_too_deep"
    table.call_arrived(CallIdentity("p", thread_id="t3"))  # no parent: a fork of main
    table.call_arrived(CallIdentity("p", thread_id="t4", parent_thread_id="t3"))
    assert record.threads["t4"] == 2 and record.calls_active == 2
    for _ in range(2):
        table.call_finished(record, None, engine="engine-0", service=None, completed=True)
    with pytest.raises(ProgramLimitExceeded, match="max_threads"):
        table.call_arrived(CallIdentity("p", thread_id="t5"))
    assert len(record.threads) == 5 and record.calls_active == 0


def test_a_call_id_is_refused_while_in_flight_and_after_completion_not_after_failure():
    table = ProgramTable(TableBounds(idle_ttl_s=600, ended_ids_kept=10))
    record = table.call_arrived(CallIdentity("p", call_id="c1"))
    with pytest.raises(CallIdReused, match="in flight"):
        table.call_arrived(CallIdentity("p", call_id="c1"))
    table.call_finished(record, "c1", engine=None, service=None, completed=False)
    table.call_arrived(CallIdentity("p", call_id="c1"))  # a retry of an attempt that failed
    table.call_finished(record, "c1", engine="engine-0", service=4.0, completed=True)
    with pytest.raises(CallIdReused, match="has completed") as reused:
        table.call_arrived(CallIdentity("p", call_id="c1"))
    assert (reused.value.status, reused.value.code) == (409, "call_id_reused")
    assert record.service == 4.0 and record.calls_active == 0
