"""The engine benchmark's workload, prompts, replayer and result, and one short
three-way run (stock FCFS, the default, a peer) on the tiny model; the full
comparison is `autellix bench engine`, too slow for the test suite."""

import json
import re

import aiohttp
import pytest
from autellix_vllm.bench.replay import (
    BenchSettings,
    ChatWords,
    ProgramResult,
    PromptVocabulary,
    build_workload,
    call_requests,
    engine_config,
    format_engine_bench,
    plot_engine_bench,
    prompts,
    ratios,
    replay,
    scaled_levels,
    spread,
    summarize,
)
from autellix_vllm.bench.subprocesses import ROUTER_READY, router_command, running
from autellix_vllm.bench.vllm_counters import counted_between, read_counters
from autellix_vllm.cli import main
from autellix_vllm.engine.tiny_model import SPECIAL_TOKENS
from autellix_vllm.protocol.paths import (
    CHAT_COMPLETIONS_PATH,
    COMPLETIONS_PATH,
    ENGINE_PROGRAM_PATH,
    ENGINE_TABLE_PATH,
)
from autellix_vllm.router.admin_client import fetch_table
from autellix_vllm.workloads.trace import CallSpec, ProgramSpec, write_trace
from polling import eventually


def test_workload_is_seeded_and_fits_the_model():
    settings = BenchSettings.quick()
    programs = build_workload(settings)
    assert programs == build_workload(settings)
    assert programs != build_workload(BenchSettings.quick(seed=1))
    assert len(programs) == 16
    for program in programs:
        for call in program.calls:
            assert settings.min_decode <= call.decode_tokens <= settings.max_decode
            assert call.prompt_tokens + call.decode_tokens <= settings.max_model_len - 8
            if call.after:
                assert call.tool_gap > 0
    # The mix has multi-threaded programs (fan-out) and single-threaded ones.
    assert {p.threads > 1 for p in programs} == {True, False}


def test_agent_sessions_end_where_the_scaled_context_does():
    """Sessions grow each prompt from the one before; scaled to the CPU model they end
    at its context instead of being cut, so every turn still extends the last."""
    settings = BenchSettings(workload="agent", programs=14, max_model_len=2560)
    programs = build_workload(settings)
    longest = max(c.prompt_tokens + c.decode_tokens for p in programs for c in p.calls)
    assert 2000 < longest <= settings.max_model_len - 8
    for program in programs:
        main = [c for c in program.calls if c.thread is None]
        prompts = [c.prompt_tokens for c in main]
        assert prompts == sorted(prompts) and len(set(prompts)) == len(prompts)
        assert all(c.tool_gap <= settings.max_tool_gap_s for c in program.calls)


def test_a_trace_keeps_its_arrivals_and_gaps_and_is_cut_to_the_context(tmp_path):
    calls = (
        CallSpec("a1", 900, 40),
        CallSpec("a2", 10, 5000, after=("a1",), tool_gap=0.7),  # longer than the context
    )
    trace = tmp_path / "trace.jsonl"
    write_trace([ProgramSpec("late", 3.0, calls), ProgramSpec("early", 1.0, calls[:1])], trace)
    settings = BenchSettings(trace=trace, programs=None, token_scale=1.0, max_model_len=1024)
    early, late = build_workload(settings)
    assert (early.program_id, early.arrival, late.arrival) == ("early", 1.0, 3.0)
    first, second = late.calls
    assert (first.decode_tokens, first.prompt_tokens) == (508, 40)  # decode: half the context
    assert (second.decode_tokens, second.prompt_tokens) == (10, 1006)
    assert second.tool_gap == 0.7 and second.after == ("a1",)
    first_only = build_workload(BenchSettings(trace=trace, programs=1))
    assert [p.program_id for p in first_only] == ["early"]
    # A rate rescales the arrivals: 2 programs at 0.5/s, the last at 4 s.
    paced = build_workload(BenchSettings(trace=trace, programs=None, rate=0.5))
    assert [p.arrival for p in paced] == pytest.approx([4 / 3, 4.0])
    halved = build_workload(BenchSettings(trace=trace, programs=None, token_scale=0.5))
    assert halved[1].calls[0].prompt_tokens == 20


def test_prompts_are_exact_token_ids_that_extend_their_context():
    vocabulary = PromptVocabulary.for_model("tiny")
    assert not set(range(len(SPECIAL_TOKENS))) & set(vocabulary.ids)  # no <s>, </s>, ...
    program = ProgramSpec(
        "p",
        0.0,
        (
            CallSpec("c1", 4, 30),
            CallSpec("c2", 4, 70, after=("c1",)),
            CallSpec("sub", 4, 50, thread="t", parent_thread="main", context="helper"),
        ),
    )
    prompt = prompts(program, vocabulary)
    assert [len(prompt[c.id]) for c in program.calls] == [30, 70, 50]
    assert prompt["c2"][:30] == prompt["c1"]  # the later call extends the earlier one
    assert prompt["sub"][:30] != prompt["c1"]  # a subagent's context is its own
    assert set(prompt["c2"]) <= set(vocabulary.ids)
    other = prompts(ProgramSpec("q", 0.0, program.calls[:1]), vocabulary)
    assert other["c1"] != prompt["c1"] and prompts(program, vocabulary) == prompt


# Two agents without the SDK: p's main conversation (three turns) and its
# subagent's (two), and q's (two). Prompts fit the shared test engine's context.
DERIVED_PROGRAMS = [
    ProgramSpec(
        "p",
        0.0,
        (
            CallSpec("p1", 4, 60),
            CallSpec("p2", 4, 120, after=("p1",), tool_gap=0.01),
            CallSpec("p3", 4, 200, after=("p2",), tool_gap=0.01),
            CallSpec("s1", 4, 40, thread="s", parent_thread="main", context="sub", after=("p1",)),
            CallSpec("s2", 4, 90, thread="s", parent_thread="main", context="sub", after=("s1",)),
        ),
    ),
    ProgramSpec(
        "q", 0.0, (CallSpec("q1", 4, 50), CallSpec("q2", 4, 110, after=("q1",), tool_gap=0.01))
    ),
]


def test_derived_calls_are_growing_chat_conversations_without_autellix_headers():
    words = ChatWords.for_model("tiny")
    program = DERIVED_PROGRAMS[0]
    derived = call_requests(program, "m", "derived", words=words)
    for request in derived.values():
        assert request.path == CHAT_COMPLETIONS_PATH and request.headers == {}
        assert "prompt" not in request.body and request.body["ignore_eos"]
    messages = {call_id: request.body["messages"] for call_id, request in derived.items()}
    # Each turn repeats the previous call's messages and appends a reply and a user turn.
    assert [m["role"] for m in messages["p1"]] == ["system", "user"]
    assert messages["p2"][:2] == messages["p1"] and len(messages["p2"]) == 4
    assert messages["p3"][:4] == messages["p2"] and messages["p3"][4]["role"] == "assistant"
    assert messages["s1"][0] != messages["p1"][0]  # the subagent's conversation is its own
    # One character a token in the tiny model: each message's text is its share
    # of the prompt less the template's tokens, so a prompt is about as long as sent.
    text = sum(len(m["content"]) for m in messages["p3"])
    assert 200 - 6 * 5 <= text < 200
    assert set("".join(m["content"] for m in messages["p3"])) <= set(words.pieces)
    sent = call_requests(program, "m", "sent", vocabulary=PromptVocabulary.for_model("tiny"))
    assert sent["p2"].path == COMPLETIONS_PATH
    assert sent["p2"].headers["X-Autellix-Program-Id"] == "p"


def test_an_unknown_identity_is_refused():
    with pytest.raises(ValueError, match="identity must be one of sent, derived"):
        BenchSettings(identity="guessed")


def test_the_real_models_vocabulary_comes_from_its_tokenizer(tmp_path):
    tokenizer = {
        "model": {"type": "BPE", "vocab": {"<|endoftext|>": 0, "a": 1, "b": 2, "ab": 3}},
        "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True}],
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert PromptVocabulary.of_model(tmp_path).ids == (1, 2, 3)
    with pytest.raises(ValueError, match="cannot read the model's tokenizer"):
        PromptVocabulary.of_model(tmp_path / "missing")


def test_spread_sets_the_arrival_window_from_the_probed_speed():
    programs = build_workload(BenchSettings.quick())
    tokens = sum(p.decode_tokens for p in programs)
    spread_out = spread(programs, window=0.5, tokens_per_s=100.0)
    assert max(p.arrival for p in spread_out) == pytest.approx(0.5 * tokens / 100.0)
    assert [p.calls for p in spread_out] == [p.calls for p in programs]


def test_levels_scale_with_the_tokens():
    assert scaled_levels(BenchSettings(token_scale=0.125)) == "0,16,64,256,1024,4096"


def test_summary_is_latency_per_decoded_token():
    results = [ProgramResult(f"p{i}", 1, decode_tokens=10, latency_s=i + 1) for i in range(20)]
    summary = summarize(results, wall_s=20.0)
    assert summary["avg_latency_per_token_s"] == pytest.approx(1.05)
    assert summary["p95_latency_per_token_s"] == pytest.approx(1.9)
    assert summary["p99_latency_per_token_s"] == pytest.approx(2.0)
    assert summary["throughput_tokens_per_s"] == 10.0
    assert summary["latency_per_token_s_by_program"]["p19"] == 2.0


def test_summary_gives_the_program_latency_and_first_call_wait_tails():
    results = [
        ProgramResult(f"p{i}", 1, decode_tokens=10, latency_s=i + 1, first_call_wait_s=i / 10)
        for i in range(20)
    ]  # latencies 1 .. 20 s, waits 0 .. 1.9 s
    summary = summarize(results, wall_s=20.0)
    assert summary["p95_program_latency_s"] == 19.0  # index round(18.05) = 18
    assert summary["p99_program_latency_s"] == 20.0
    assert summary["avg_first_call_wait_s"] == pytest.approx(0.95)
    assert summary["p95_first_call_wait_s"] == pytest.approx(1.8)
    assert summary["program_latency_s_by_program"]["p19"] == 20.0


def test_a_programs_first_calls_are_streamed_to_time_its_first_token():
    program = DERIVED_PROGRAMS[0]
    sent = call_requests(program, "m", "sent", vocabulary=PromptVocabulary.for_model("tiny"))
    derived = call_requests(program, "m", "derived", words=ChatWords.for_model("tiny"))
    for requests in (sent, derived):
        streamed = {call_id for call_id, r in requests.items() if r.body.get("stream")}
        assert streamed == {"p1"}  # the one call that waits for no other
        assert requests["p1"].body["stream_options"] == {"include_usage": True}


def bench_result(*runs: tuple[str, str | None, float]) -> dict:
    """A result of run_engine_bench's shape: one run per (entry, policy, slowdown),
    8 programs each, the first the baseline."""

    def summary(entry, policy, slower):
        results = [
            ProgramResult(f"p{i}", 1, 10, (i + 1) * slower, first_call_wait_s=slower)
            for i in range(8)
        ]
        return {"entry": entry, "policy": policy, **summarize(results, wall_s=10.0)}

    baseline, *candidates = (summary(*run) for run in runs)
    settings = {"programs": 8, "workload": "mixed", "model": "tiny", "max_num_seqs": 4,
                "identity": "sent", "side_by_side": False, "probe_tokens_per_s": 60.0}  # fmt: skip
    return {
        "settings": settings,
        "baseline": baseline,
        "candidates": [{**c, "ratios": ratios(baseline, c)} for c in candidates],
    }


def test_the_engine_bench_plot_has_the_averages_beside_the_latency_cdf(tmp_path):
    result = bench_result(("fcfs", None, 2.0), ("autellix", "autellix", 1.0),
                          ("thunderagent", "thunderagent", 1.5))  # fmt: skip
    figure = plot_engine_bench(result, str(tmp_path / "bench.png"))
    assert len(figure.axes) == 2
    bars, cdf = figure.axes
    assert [t.get_text() for t in bars.get_xticklabels()] == ["average", "P95", "P99"]
    assert len(bars.patches) == 3 * 3  # three bars for each of the three runs
    labels = [line.get_label() for line in cdf.get_lines()]
    assert labels == ["baseline: fcfs", "autellix", "thunderagent"]
    assert (tmp_path / "bench.png").stat().st_size > 1000


def test_each_candidate_is_compared_with_the_baseline_in_the_table():
    result = bench_result(("vllm", None, 2.0), ("autellix", "autellix", 1.0),
                          ("autellix", "autellix", 4.0))  # fmt: skip
    faster, slower = (c["ratios"] for c in result["candidates"])
    assert faster["avg_latency_per_token_s"] == pytest.approx(2.0)
    assert faster["p95_program_latency_s"] == faster["avg_first_call_wait_s"] == 2.0
    assert slower["p99_latency_per_token_s"] == pytest.approx(0.5)
    lines = format_engine_bench(result).splitlines()
    assert lines[0] == (
        "8 programs of mixed on tiny, 4 seats, identity sent, one after another; probe 60 tokens/s"
    )
    header, *rows = (re.split(r"\s{2,}", line) for line in lines[2:])
    assert header[:3] == ["RUN", "POLICY", "AVG/TOKEN"] and "P95 FIRST WAIT" in header
    # The baseline without ratios; a repeated entry is numbered.
    assert [row[0] for row in rows] == ["baseline: vllm", "autellix", "autellix #3"]
    assert "(" not in lines[3] and "(2.00x)" in lines[4] and "(0.50x)" in lines[5]


def test_an_entry_is_a_scheduler_or_a_policy_the_autellix_scheduler_runs():
    settings = BenchSettings(policy="mori", schedulers=("fcfs", "autellix", "thunderagent"))
    configs = [engine_config(entry, settings, engines_on_host=3) for entry in settings.schedulers]
    assert [(c.scheduler, c.policy) for c in configs] == [
        ("fcfs", None), ("autellix", "mori"), ("autellix", "thunderagent")]  # fmt: skip
    assert {c.engines_on_host for c in configs} == {3}  # side by side: the cores split three ways
    with pytest.raises(ValueError, match="unknown scheduler or policy 'thunder'"):
        BenchSettings(schedulers=("fcfs", "thunder"))
    with pytest.raises(ValueError, match="two or more"):
        BenchSettings(schedulers=("autellix",))


@pytest.mark.parametrize("schedulers", ["vllm,thunder", "autellix", "vllm,,autellix"])
def test_a_bad_bench_entry_is_one_line_and_exit_code_2(schedulers, capsys):
    assert main(["bench", "engine", "--model", "tiny", "--schedulers", schedulers]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("autellix bench engine: error: ")


def test_summary_lists_each_calls_sent_and_answered_times():
    timed = ProgramResult("p", 2, decode_tokens=4, latency_s=3.0,
                          call_times={"a": (0.5, 1.25), "b": (2.0, 3.5004)})  # fmt: skip
    summary = summarize([timed], wall_s=4.0)
    assert summary["call_times_s_by_program"] == {"p": {"a": [0.5, 1.25], "b": [2.0, 3.5]}}


@pytest.mark.engine
async def test_replay_runs_dependent_and_parallel_calls_on_a_real_engine(engine):
    program = ProgramSpec(
        "bench-replay",
        0.0,
        (
            CallSpec("root", 5, 150),
            CallSpec("left", 3, 170, thread="l", parent_thread="main", after=("root",)),
            CallSpec("right", 4, 170, thread="r", parent_thread="main", after=("root",)),
            CallSpec("join", 2, 200, after=("left", "right"), tool_gap=0.05),
        ),
    )
    settings = BenchSettings(model="tiny")
    before = read_counters([engine.base_url])
    # The replay checks that the engine counted each prompt's tokens as sent.
    (result,) = await replay(
        engine.base_url, engine.served_model_name, [program], settings,
        end_path=ENGINE_PROGRAM_PATH,
    )  # fmt: skip
    assert result.calls == 4 and result.decode_tokens == 14
    assert result.latency_s > 0.05
    # Each call was sent after the calls it follows were answered.
    times = result.call_times
    assert set(times) == {"root", "left", "right", "join"}
    assert times["root"][1] <= min(times["left"][0], times["right"][0])
    assert max(times["left"][1], times["right"][1]) <= times["join"][0]
    # The root, streamed, timed its first token: after it was sent, before its end.
    assert 0 < result.first_call_wait_s < times["root"][1] - times["root"][0]
    # vLLM's own counters saw the four prompts, and found the children's and the
    # join's first block (the CPU build's 128 tokens, of the root's 150) cached.
    counted = counted_between(before, read_counters([engine.base_url]))
    assert counted["prefix_cache_queries"] == 150 + 170 + 170 + 200
    assert counted["prefix_cache_hits"] >= 3 * 128
    assert 0 < counted["prefix_cache_hit_rate"] < 1
    # And the program was ended after its last call, as the SDK ends one.
    async with aiohttp.ClientSession() as http:
        query = {"program_ids": ["bench-replay"]}
        async with http.post(engine.base_url + ENGINE_TABLE_PATH, json=query) as answer:
            assert (await answer.json())["programs"] == []


@pytest.mark.engine
async def test_derived_identity_groups_each_conversation_into_one_router_program(engine):
    """Calls without any autellix header, through a router: the router derives one
    program per conversation, with every call of that conversation."""
    settings = BenchSettings(model="tiny", identity="derived")
    with running(router_command([engine.base_url]), ROUTER_READY) as router:
        results = await replay(router.ready, engine.served_model_name, DERIVED_PROGRAMS, settings)
        # The router counts a streamed call once it has relayed the stream's end,
        # which the client may read first: wait for the seven calls to be counted.
        table = await eventually(
            lambda: fetch_table(router.ready, None),
            lambda t: sum(row["calls_completed"] for row in t["programs"]) >= 7,
            what="the router's table never counted all seven calls",
        )
    assert [r.calls for r in results] == [5, 2]
    assert all(r.first_call_wait_s > 0 for r in results)  # streamed through the router
    rows = table["programs"]
    assert all(row["program_id"].startswith("derived-") for row in rows)
    assert all(row["name"].startswith("conversation prefix") for row in rows)
    # p's main conversation, its subagent's and q's: three programs, every call in one.
    assert sorted(row["calls_completed"] for row in rows) == [2, 2, 3]
    assert all(row["calls_failed"] == 0 for row in rows)


@pytest.mark.engine
def test_a_three_way_bench_reports_each_candidate_against_stock_fcfs(capsys):
    """Stock vLLM, the default and a peer on the tiny model, side by side: three
    engines started at once, each with its share of the cores (under two minutes on
    a loaded 2-core machine; one after another, about four)."""
    code = main(["bench", "engine", "--model", "tiny", "--programs", "3", "--side-by-side",
                 "--json", "--schedulers", "vllm,autellix,thunderagent"])  # fmt: skip
    out, _ = capsys.readouterr()
    assert code == 0
    result = json.loads(out)
    assert result["settings"]["schedulers"] == ["vllm", "autellix", "thunderagent"]
    assert result["settings"]["side_by_side"] is True
    baseline, candidates = result["baseline"], result["candidates"]
    assert (baseline["entry"], baseline["scheduler"], baseline["policy"]) == ("vllm", "vllm", None)
    assert "ratios" not in baseline and baseline["programs"] == 3
    runs = [(c["entry"], c["scheduler"], c["policy"]) for c in candidates]
    assert runs == [("autellix", "autellix", "autellix"),
                    ("thunderagent", "autellix", "thunderagent")]  # fmt: skip
    for candidate in candidates:
        assert candidate["programs"] == 3
        assert candidate["decode_tokens"] == baseline["decode_tokens"]
        for key, ratio in candidate["ratios"].items():
            assert ratio == pytest.approx(baseline[key] / candidate[key])
        assert "promotions" in candidate  # the Autellix scheduler's table, which stock vLLM lacks
    assert "promotions" not in baseline
