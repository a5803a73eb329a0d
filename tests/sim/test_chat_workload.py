"""The chat workload: conversations shaped on LMSYS-Chat-1M and WildChat."""

import json
import statistics
import subprocess
import sys

from autellix_vllm.workloads import WORKLOAD_SPECS, generate, load_trace, write_trace
from autellix_vllm.workloads.chat_logs import CHAT_MAX_CONTEXT

CONVERSATIONS = generate("chat", 4000, rate=1.0, seed=0)


def test_conversations_follow_the_published_figures():
    turns = [len(p.calls) for p in CONVERSATIONS]
    assert 0.63 < sum(n == 1 for n in turns) / len(turns) < 0.69  # two thirds one turn
    assert 2.05 < statistics.mean(turns) < 2.25  # LMSYS-Chat-1M 2.0, WildChat 2.35-2.52

    def share(least: int) -> float:
        return sum(n >= least for n in turns) / len(turns)

    # WildChat's tail: 26.2% at 3 turns or more, 12.4% at 5, 2.7% at 10.
    assert 0.22 < share(3) < 0.26 and 0.10 < share(5) < 0.135 and 0.013 < share(10) < 0.03
    assert 15 < max(turns) <= 50  # a geometric tail to a few dozen
    firsts = [p.calls[0] for p in CONVERSATIONS]
    calls = [c for p in CONVERSATIONS for c in p.calls]
    # Log-normal fits of WildChat's per-turn means and deviations: user 295.6
    # (1,609) tokens, model 441.3 (411).
    assert 45 < statistics.median(c.prompt_tokens for c in firsts) < 62  # median 53
    assert 300 < statistics.median(c.decode_tokens for c in calls) < 345  # median 323
    assert 400 < statistics.mean(c.decode_tokens for c in calls) < 480
    # Heavy tails: a few prompts are pasted documents a hundred times the median.
    assert sum(c.prompt_tokens > 5000 for c in firsts) / len(firsts) > 0.005
    think = [c.tool_gap for c in calls if c.after]
    assert 25 < statistics.median(think) < 35  # seconds to minutes between turns
    assert max(think) <= 600 and all(c.tool_gap == 0 for c in firsts)


def test_each_turn_carries_the_conversation_and_no_call_passes_the_context():
    program = next(p for p in CONVERSATIONS if len(p.calls) > 3)
    for before, turn in zip(program.calls, program.calls[1:], strict=False):
        assert turn.after == (before.id,)
        assert turn.prompt_tokens > before.prompt_tokens + before.decode_tokens
    calls = [c for p in CONVERSATIONS for c in p.calls]
    assert max(c.prompt_tokens + c.decode_tokens for c in calls) <= CHAT_MAX_CONTEXT
    assert WORKLOAD_SPECS["chat"].max_context == CHAT_MAX_CONTEXT
    small = generate("chat", 300, rate=1.0, seed=0, max_context=2048)
    longest = max(c.prompt_tokens + c.decode_tokens for p in small for c in p.calls)
    assert 1500 < longest <= 2048


def test_conversations_are_seeded_and_survive_a_trace_file(tmp_path):
    again = generate("chat", 50, rate=4.0, seed=0)
    assert [p.calls for p in again] == [p.calls for p in CONVERSATIONS[:50]]
    other = generate("chat", 50, rate=1.0, seed=1)
    assert [p.calls for p in other] != [p.calls for p in again]
    path = tmp_path / "chat.jsonl"
    write_trace(CONVERSATIONS[:20], path)
    assert load_trace(path) == CONVERSATIONS[:20]


def _simulate_run(*extra: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "autellix_vllm", "simulate", "run", "--workload", "chat",
         "--programs", "60", "--rate", "2", "--preset", "a100-llama8b-kv", "--json", *extra],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_simulate_run_replays_chat_whose_clients_never_end_their_programs():
    held, ended = _simulate_run("--no-program-end"), _simulate_run()
    calls = sum(len(p.calls) for p in generate("chat", 60, rate=2.0, seed=0))
    assert held["workload"] == "chat" and held["calls_completed"] == calls
    # A client that never ends its conversation leaves its last context to expire
    # on the engine; one that ends it frees it at once.
    assert ended["holds_expired"] < 60 <= held["holds_expired"]
