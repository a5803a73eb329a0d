"""The global process table for many ingress replicas (``ray_serve.directory``), without Ray."""

import pickle

from autellix_vllm.policy.config import ProgramLimits, TableBounds
from autellix_vllm.policy.routing import Route
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.protocol.paths import CHAT_COMPLETIONS_PATH, RESPONSES_PATH
from autellix_vllm.ray_serve.directory import ProgramDirectory
from autellix_vllm.ray_serve.messages import (
    Admission,
    Arrival,
    CallReport,
    Refusal,
    ReportBatch,
)
from autellix_vllm.router.keys import ANONYMOUS, Client

ALICE = Client(owner="key-a", name="alice")
BOB = Client(owner="key-b", name="bob")
ADMIN = Client(owner="key-admin", name="admin", admin=True)
BINDS = Route(0, "bind", binds=True)


def arrival(program_id, call_id=None) -> Arrival:
    return Arrival(CallIdentity(program_id, call_id=call_id))


def report(program_id, call_id, service, replica="r1", route=BINDS, completed=True):
    return CallReport(program_id, call_id, replica, route, service, completed)


def test_service_reported_by_one_ingress_is_the_prior_service_another_ingress_gets():
    directory = ProgramDirectory()
    pid = directory.issue("agent", ALICE)["program_id"]
    first = directory.admit(arrival(pid, call_id="c1"), ALICE)
    # The engine is told the program's owner, and no prior service before it has any.
    owned = CallIdentity(pid, call_id="c1", owner=ALICE.owner)
    assert first == Admission(owned, prior_service=None, bound_replica=None)
    # Ingress A's batch travels with ingress B's next admission of any program.
    batch = ReportBatch()
    batch.add(report(pid, "c1", 120.0, replica="r2"))
    second = directory.admit(arrival(pid, call_id="c2"), ALICE, batch.take())
    assert (second.prior_service, second.bound_replica) == (120.0, "r2")
    assert len(batch) == 0


def test_reports_apply_in_order_and_a_route_that_does_not_bind_leaves_the_binding():
    directory = ProgramDirectory()
    pid = directory.issue(None, ALICE)["program_id"]
    for call in ("c1", "c2"):
        directory.admit(arrival(pid, call_id=call), ALICE)
    directory.apply(
        [report(pid, "c1", 10.0, "r1"), report(pid, "c2", 5.0, "r2", Route(1, "least-loaded"))]
    )
    admission = directory.admit(arrival(pid, call_id="c3"), ALICE)
    assert (admission.prior_service, admission.bound_replica) == (15.0, "r1")
    row = directory.page(ALICE, None, 10)["programs"][0]
    assert row["engines"] == {"r1": 1, "r2": 1} and row["calls_active"] == 1


def test_the_engine_is_told_the_band_the_key_allows_and_the_owners_weight():
    """The router's admission rules, on the Ray path too (``router.admission``)."""
    nightly = Client(owner="key-n", name="nightly", band=1, best_band=1, weight=3.0)
    directory = ProgramDirectory()
    asked = Arrival(CallIdentity("evals", call_id="c1", priority=0))  # better than its key
    admitted = directory.admit(asked, nightly)
    assert admitted.identity == CallIdentity(
        "evals", call_id="c1", owner="key-n", priority=1, weight=3.0
    )
    directory.apply([report("evals", "c1", 30.0)])
    listing = directory.page(nightly, None, 10)
    assert listing["programs"][0]["class"] == "batch"
    assert listing["keys"] == [{"name": "nightly", "class": "batch", "weight": 3.0,
                                "service": 30.0, "share": 10.0, "programs": 1}]  # fmt: skip


def test_the_prior_service_is_clamped_to_the_limit():
    directory = ProgramDirectory(bounds=TableBounds(limits=ProgramLimits(max_prior_service=50.0)))
    pid = directory.issue(None, ALICE)["program_id"]
    directory.admit(arrival(pid, call_id="c1"), ALICE, [])
    directory.apply([report(pid, "c1", 80.0)])
    assert directory.admit(arrival(pid, call_id="c2"), ALICE).prior_service == 50.0


def test_refusals_are_the_routers_own_as_data():
    directory = ProgramDirectory(bounds=TableBounds(max_programs_per_key=1))
    pid = directory.issue(None, ALICE)["program_id"]
    assert directory.admit(arrival(pid), BOB) == Refusal(
        404, f"no program {pid!r}", "program_not_found", "X-Autellix-Program-Id"
    )
    full = directory.issue(None, ALICE)
    assert isinstance(full, Refusal) and (full.status, full.code) == (429, "too_many_programs")
    directory.admit(arrival(pid, call_id="c1"), ALICE)
    reused = directory.admit(arrival(pid, call_id="c1"), ALICE)
    assert isinstance(reused, Refusal) and reused.code == "call_id_reused"
    assert directory.end(pid, BOB) == Refusal(
        404, f"no program {pid!r}", "program_not_found", "program_id"
    )
    ended = directory.end(pid, ALICE)
    assert ended["ended"] and ended["replicas"] == []
    late = directory.admit(arrival(pid), ALICE)
    assert isinstance(late, Refusal) and late.code == "program_ended"
    # Refusals cross process boundaries (Ray pickles them).
    assert pickle.loads(pickle.dumps(late)) == late


def test_a_report_after_its_program_ended_changes_nothing():
    directory = ProgramDirectory()
    pid = directory.issue(None, ANONYMOUS)["program_id"]
    directory.admit(arrival(pid, call_id="c1"), ANONYMOUS)
    directory.end(pid, ANONYMOUS)
    directory.apply([report(pid, "c1", 3.0)])
    assert directory.page(ANONYMOUS, None, 10)["total"] == 0


def test_listing_is_owner_scoped_and_the_admin_sees_all():
    directory = ProgramDirectory()
    directory.issue("a", ALICE)
    directory.issue("b", BOB)
    assert [r["name"] for r in directory.page(ALICE, None, 10)["programs"]] == ["a"]
    assert directory.page(ADMIN, None, 10)["total"] == 2


def test_idle_programs_leave_the_table():
    now = [0.0]
    directory = ProgramDirectory(bounds=TableBounds(idle_ttl_s=10.0), clock=lambda: now[0])
    directory.issue(None, ALICE)
    now[0] = 11.0
    assert directory.evict_idle() == 1


# ---- programs for clients without the SDK, as the router derives them ------------------


def unnamed(body, headers=None, path=CHAT_COMPLETIONS_PATH) -> Arrival:
    return Arrival(CallIdentity(), path, body, headers or {})


def test_a_call_without_a_program_joins_the_one_its_key_and_cache_key_name():
    directory = ProgramDirectory()
    first = directory.admit(unnamed({"prompt_cache_key": "task-7"}), ALICE)
    again = directory.admit(unnamed({"prompt_cache_key": "task-7"}), ALICE)
    other_key = directory.admit(unnamed({"prompt_cache_key": "task-7"}), BOB)
    pid = first.identity.program_id
    assert pid.startswith("derived-") and again.identity.program_id == pid
    assert other_key.identity.program_id != pid and other_key.identity.owner == BOB.owner
    assert first.identity.owner == ALICE.owner
    [row] = directory.page(ALICE, None, 10)["programs"]
    assert (row["program_id"], row["name"]) == (pid, "prompt_cache_key=task-7")


def test_a_session_header_names_a_program_and_a_call_with_nothing_runs_as_its_caller():
    directory = ProgramDirectory()
    by_header = directory.admit(unnamed({}, {"session-id": "s-1"}), ALICE)
    assert by_header.identity.program_id.startswith("derived-")
    plain = directory.admit(unnamed({"model": "m"}), ALICE)
    assert plain == Admission(CallIdentity(owner=ALICE.owner), None, None)
    off = ProgramDirectory(derived_programs=False)
    assert off.admit(unnamed({"prompt_cache_key": "k"}), ALICE).identity.program_id is None


def test_a_reported_response_id_brings_the_next_call_into_its_program():
    directory = ProgramDirectory()
    body = {"input": "hi", "user": "u-1"}
    pid = directory.admit(unnamed(body, path=RESPONSES_PATH), ALICE).identity.program_id
    done = CallReport(pid, None, "r1", BINDS, 3.0, True, RESPONSES_PATH, "resp_1")
    directory.apply([done])
    follow = unnamed({"input": "more", "previous_response_id": "resp_1"}, path=RESPONSES_PATH)
    assert directory.admit(follow, ALICE).identity.program_id == pid


def test_an_idle_derived_program_is_ended_as_its_owner_would():
    now = [0.0]
    directory = ProgramDirectory(derived_idle_end_s=30.0, clock=lambda: now[0])
    pid = directory.admit(unnamed({"user": "u-1"}), ALICE).identity.program_id
    directory.apply([report(pid, None, 1.0)])
    now[0] = 31.0
    fresh = directory.admit(unnamed({"user": "u-2"}), ALICE).identity.program_id
    assert [r["program_id"] for r in directory.page(ALICE, None, 10)["programs"]] == [fresh]
    later = directory.admit(unnamed({"user": "u-1"}), ALICE).identity.program_id
    assert later not in (pid, fresh)
