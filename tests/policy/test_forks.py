"""The fork rule and the program limits: one rule, the engine's table and the router's."""

import pytest
from autellix_vllm.policy import PLAS, PolicyConfig, ProgramLimits, ProgramScheduler, TableBounds
from autellix_vllm.policy.forks import NewThread, limit_crossed, new_threads
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.router.programs import ProgramLimitExceeded, ProgramTable


def test_a_new_thread_forks_from_its_parent_else_main_else_is_a_root():
    assert new_threads(None, None, {}.get) == (NewThread("main", None, 0),)
    assert new_threads("t1", None, {}.get) == (NewThread("t1", None, 0),)
    assert new_threads("t1", None, {"main": 0}.get) == (NewThread("t1", "main", 1),)
    assert new_threads("t2", "t1", {"main": 0, "t1": 1}.get) == (NewThread("t2", "t1", 2),)
    # A parent named before it ran a call is created first, by the same rule.
    assert new_threads("t2", "t1", {"main": 0}.get) == (
        NewThread("t1", "main", 1),
        NewThread("t2", "t1", 2),
    )
    assert new_threads("t2", "t1", {}.get) == (NewThread("t1", None, 0), NewThread("t2", "t1", 1))
    assert new_threads("main", "main", {}.get) == (NewThread("main", None, 0),)
    assert new_threads("t1", None, {"t1": 3}.get) == ()


@pytest.mark.parametrize(
    ("limits", "threads", "live", "created", "limit", "code", "part"),
    [
        (ProgramLimits(max_live_calls=2), 1, 2, (), "max_live_calls", "too_many_live_calls",
         "program_id"),
        (ProgramLimits(max_threads=2), 1, 0, (NewThread("a", None, 0), NewThread("b", "a", 1)),
         "max_threads", "too_many_threads", "thread_id"),
        (ProgramLimits(max_fork_depth=1), 1, 0, (NewThread("b", "a", 2),), "max_fork_depth",
         "fork_too_deep", "parent_thread_id"),
    ],
)  # fmt: skip
def test_each_limit_names_itself_its_code_and_the_identity_part(
    limits, threads, live, created, limit, code, part
):
    crossed = limit_crossed(limits, threads, live, created)
    assert (crossed.limit, crossed.code, crossed.part) == (limit, code, part)
    assert limit in crossed.message
    assert limit_crossed(ProgramLimits(), threads, 0, created) is None


CALLS = [  # (thread, parent): programs that start with and without a main thread
    [("t1", None), ("t2", "t1"), ("main", None), ("t3", None), ("t5", "t4")],
    [("main", None), ("t2", "t1"), ("t3", "t2"), ("t4", None), ("t4", "t3")],
    [("a", "b"), ("c", "a"), ("d", "c"), ("e", "d"), ("f", "e")],
]


@pytest.mark.parametrize("calls", CALLS)
@pytest.mark.parametrize(
    "limits", [ProgramLimits(), ProgramLimits(max_fork_depth=2), ProgramLimits(max_threads=4)]
)
def test_the_engine_and_the_router_grow_and_refuse_a_program_alike(calls, limits):
    engine = ProgramScheduler(PLAS(), PolicyConfig(table=TableBounds(limits=limits)))
    router = ProgramTable(TableBounds(idle_ttl_s=600, ended_ids_kept=10, limits=limits))
    for i, (thread, parent) in enumerate(calls):
        try:
            record = router.call_arrived(
                CallIdentity("p", thread_id=thread, parent_thread_id=parent)
            )
            refused = None
        except ProgramLimitExceeded as error:
            refused = error.code
        call = engine.add_call(
            CallIdentity("p", thread_id=thread, parent_thread_id=parent, call_id=f"c{i}"), now_s=0.0
        )
        alone = call.program.program_id != "p"
        assert alone == (refused is not None), (thread, parent, refused)
    program = engine.table.get("p")
    assert record.threads == {tid: t.depth for tid, t in program.threads.items()}
