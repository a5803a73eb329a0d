"""Every command in the code blocks of README.md and docs/*.md runs as written, or
at least parses with the real parsers where running it needs a GPU, an engine,
another server or a long benchmark.

The commands are read from the files (``doc_code``), so a doc change is tested,
and each must be classified in :data:`DOC_COMMANDS`: a new or changed command
fails here until it is. ``test_doc_commands.py`` further plans every serve and
engine command on a GPU host.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from autellix_vllm.cli import build_parser
from doc_code import ROOT, DocCommand, doc_commands
from polling import wait_until

RUN = "run"  # runs here for real: seconds, no GPU or engine (ps: a router this test starts)
PARSE = "parse"  # parsed by the real parsers only; the reason says why it is not run
FORM = "form"  # a template: PLACEHOLDERS filled in, then parsed

_ENGINE = "starts an engine (minutes on a CPU)"
_GPU = "needs GPUs and a model folder"
_SWEEP = "a sweep of minutes"
_SERVER = "needs a running server"
_VLLM_MINUTE = "imports vLLM: a minute here"

# Every documented command, comments left out, by its text: how it is checked, and
# why it is not run (PARSE, FORM) or what its output must hold (RUN).
DOC_COMMANDS: dict[str, tuple[str, str]] = {
    # docs/benchmarks.md
    "autellix simulate matrix --seed 10": (PARSE, "hours on 2 cores"),
    "autellix simulate sweep --workload agent --preset a100-llama8b-kv --seed 10 --policies"
    " vllm-opt,plas-atlas,autellix,continuum,thunderagent --plot docs/img/agent-sessions.png": (
        PARSE, _SWEEP),
    "autellix simulate sweep --workload W --preset a100-llama8b-kv --seed N --policies"
    " vllm-opt,autellix,continuum,thunderagent,mori,lru-priority": (FORM, _SWEEP),
    "autellix bench engine --workload agent --programs 14 --max-num-seqs 8 --max-model-len 2560"
    " --kv-blocks 96 --json": (PARSE, _ENGINE),
    "autellix bench engine --workload agent --programs 14 --max-num-seqs 8 --max-model-len 2560"
    " --kv-blocks 96 --schedulers fcfs,autellix,thunderagent": (PARSE, _ENGINE),
    "autellix bench engine --workload agent --programs 14 --max-num-seqs 8 --max-model-len 2560"
    " --kv-blocks 96 --schedulers fcfs,autellix,thunderagent --json": (PARSE, _ENGINE),
    "autellix bench engine --workload agent --seed 1 --programs 24 --max-num-seqs 8"
    " --max-model-len 1536 --kv-blocks 64 --json": (PARSE, _ENGINE),
    "autellix bench engine --workload agent --programs 14 --max-num-seqs 8 --max-model-len 2560"
    " --kv-blocks 96 --schedulers fcfs,autellix,thunderagent,fcfs --side-by-side --json": (
        PARSE, _ENGINE),
    "autellix bench engine --workload agent --seed 1 --programs 24 --max-num-seqs 8"
    " --max-model-len 1536 --kv-blocks 64 --schedulers fcfs,autellix,thunderagent --json": (
        PARSE, _ENGINE),
    "autellix bench engine --workload agent --seed 3 --programs 16 --max-num-seqs 8"
    " --max-model-len 2048 --schedulers fcfs,autellix,thunderagent,fcfs --side-by-side --json": (
        PARSE, _ENGINE),
    "autellix bench engine --workload agent --seed 2 --programs 18 --max-num-seqs 8"
    " --max-model-len 2048 --kv-blocks 80 --identity derived --schedulers"
    " fcfs,autellix,thunderagent --json": (PARSE, _ENGINE),
    "autellix bench engine --workload agent --seed 2 --programs 18 --max-num-seqs 8"
    " --max-model-len 2048 --kv-blocks 80 --identity derived --json": (PARSE, _ENGINE),
    "autellix simulate bench-policy --policy plas-atlas --json": (RUN, "median_ms_per_step"),
    "autellix bench router-overhead --seconds 5 --json": (PARSE, "times the router: a minute"),
    "python -m autellix_vllm.bench.timeline_cost": (RUN, "span_record_us"),
    # README.md
    "make demo": (PARSE, _ENGINE),
    "make test": (PARSE, "the whole test suite"),
    "autellix serve": (PARSE, _ENGINE),
    "autellix serve --model tiny": (PARSE, _ENGINE),
    "autellix serve --model /models/llama-70b --engines 2 --tensor-parallel-size 4": (PARSE, _GPU),
    "autellix serve --engines 2 -- --max-num-batched-tokens 2048": (PARSE, _ENGINE),
    # docs/simulator.md
    "cat > figure2.jsonl <<'EOF'": (RUN, ""),
    "autellix simulate run --trace figure2.jsonl --preset unit --max-num-seqs 2 --policy vllm"
    " --json": (RUN, '"total_wait": 18.0'),
    "autellix simulate run --trace figure2.jsonl --preset unit --max-num-seqs 2 --policy plas"
    " --levels $(seq -s, 0 63) --beta 1e9 --prefill-weight 0 --json": (RUN, '"total_wait": 12.0'),
    "autellix simulate bench-policy --json": (RUN, "median_ms_per_step"),
    "cat > chats.jsonl <<'EOF'": (RUN, ""),
    "autellix simulate run --trace chats.jsonl --policy vllm-opt --json": (
        RUN, '"calls_completed": 6'),
    "autellix simulate run --trace chats.jsonl --policy autellix --json": (
        RUN, '"calls_completed": 6'),
    "autellix simulate sweep --workload agent --preset a100-llama8b-kv --policies"
    " vllm-opt,plas-atlas,autellix --json": (PARSE, _SWEEP),
    "autellix simulate sweep --workload agent --preset a100-llama8b-kv --kv-offload-gib 256"
    " --policies vllm-opt,autellix --json": (PARSE, _SWEEP),
    "autellix bench engine --workload agent --programs 14 --max-num-seqs 8 --max-model-len 2560"
    " --kv-blocks 96 --schedulers fcfs,fcfs --json": (PARSE, _ENGINE),
    "autellix bench engine --workload agent --programs 14 --max-num-seqs 8 --max-model-len 2560"
    " --kv-blocks 96 --identity derived --json": (PARSE, _ENGINE),
    "autellix bench engine --workload agent --programs 14 --max-num-seqs 8 --max-model-len 2560"
    " --kv-blocks 96 --identity derived --schedulers fcfs,fcfs --json": (PARSE, _ENGINE),
    # docs/frameworks.md
    'make agents-sdk ARGS="--agents 2"': (PARSE, _SERVER),
    'make langgraph ARGS="--agents 2"': (PARSE, _SERVER),
    'make pydantic-ai ARGS="--agents 2"': (PARSE, _SERVER),
    # docs/engine.md
    "autellix engine": (PARSE, _ENGINE),
    "autellix engine --model tiny": (PARSE, _ENGINE),
    "autellix engine --port 8001 --max-num-seqs 8": (PARSE, _ENGINE),
    "autellix engine --policy plas --beta 4": (PARSE, _ENGINE),
    "autellix engine --scheduler vllm": (PARSE, _ENGINE),
    "autellix bench engine --model tiny --programs 4 --schedulers vllm,autellix,thunderagent": (
        PARSE, _ENGINE),
    'autellix engine --api-key "$ENGINE_KEY"': (PARSE, _ENGINE),
    "autellix engine --model /models/llama-3.1-8b -- --max-num-batched-tokens 4096": (PARSE, _GPU),
    ".venv/bin/python -m pytest tests/engine -q": (PARSE, "test suites of their own"),
    '.venv/bin/python -m pytest tests/engine -q -m "not engine"': (PARSE, "a test suite"),
    # docs/gpu.md
    'python3 -m venv .venv && .venv/bin/pip install -e ".[gpu,dev]"': (
        PARSE, "installs vLLM's GPU build, for a CUDA machine (test_gpu_extra.py resolves it)"),
    "autellix serve --model /models/llama-3.1-8b-instruct": (PARSE, _GPU),
    "autellix serve --model /models/llama-3.1-8b-instruct --engines 8 --kv-offload-gib 64": (
        PARSE, _GPU),
    # docs/operations.md
    "autellix serve --engines 2": (PARSE, _ENGINE),
    "autellix serve --model /models/llama-8b": (PARSE, _GPU),
    "autellix serve --upstream http://127.0.0.1:8001 --upstream http://127.0.0.1:8002": (
        PARSE, "needs engines on those ports"),
    "autellix ps --url http://127.0.0.1:8000": (RUN, "PROGRAM"),
    "autellix ps --all": (RUN, "ended programs"),
    "autellix ps demo-agent --url http://127.0.0.1:8765 --chrome-trace trace.json": (
        PARSE, _SERVER),
    "autellix ps demo-agent --url http://127.0.0.1:8765 --plot timeline.png": (PARSE, _SERVER),
    "autellix simulate run --workload agent --programs 2 --timeline agent-1 --plot agent-1.png": (
        RUN, "agent-1: 13 calls"),
    "pip install \"torch==2.13.0\" && pip install '.[cpu,ray]'": (PARSE, "installs packages"),
    "pip install 'autellix[otel]'": (PARSE, "installs packages"),
    "autellix ray-serve --model tiny --replicas 2": (PARSE, "starts a Ray cluster and engines"),
    "autellix ray-serve --address auto --model smollm2 --replicas 4 --engine-cpus 4": (
        PARSE, "needs a Ray cluster"),
    "python -m autellix_vllm.ray_serve.measure breakdown --calls 200": (
        PARSE, "starts a Ray cluster and engines"),
    "python -m autellix_vllm.ray_serve.measure routers --programs 8 --calls 6": (
        PARSE, "starts a Ray cluster and engines"),
    "python -m autellix_vllm.ray_serve.measure throughput": (
        PARSE, "starts a Ray cluster and engines"),
    "autellix simulate sweep --workload agent --preset a100-llama8b-kv --kv-offload-gib 64"
    " --seed 10 --policies vllm-opt,autellix": (PARSE, _SWEEP),
    "autellix simulate matrix --seed 10 --locality-threshold 2048 --workloads W --settings S": (
        FORM, "a cell takes minutes to an hour"),
    "autellix simulate sweep --workload W --preset a100-llama8b-kv --engines 4 --lb locality"
    " --locality-threshold 2048 --seed 1 --policies vllm-opt,autellix": (FORM, "sweeps of minutes"),
    "python bench/experiments/tier_bound.py --seeds 0,1,2,3,4 --gib 256": (
        PARSE, "sweeps of half an hour"),
    "python bench/experiments/size_bound.py --workload agent --preset a100-llama8b-kv"
    " --kv-offload-gib 256 --seeds 0,1,10 --policies vllm-opt,autellix,srpt --orders gittins": (
        PARSE, "sweeps of minutes"),
    "python bench/experiments/tenants.py --seeds 10,11,12,13,14 --capacity 4.8"
    " --preset a100-llama8b-kv --max-num-seqs 32 --flow-control off": (
        PARSE, "simulations of minutes"),
    "python bench/experiments/tenants.py --seeds 10,11,12,13,14 --capacity 4.8"
    " --preset a100-llama8b-kv --max-num-seqs 256 --flow-control off": (
        PARSE, "simulations of minutes"),
    "python bench/experiments/tenants.py --seeds 10,11,12,13,14 --capacity 4.8"
    " --preset a100-llama8b-kv --max-num-seqs 256 --no-split": (PARSE, "simulations of minutes"),
    "python bench/experiments/tenants_engine.py --seeds 10,11 --capacity 0.18 --window 60"
    " --split-load 0.75": (PARSE, "a real engine for twenty minutes"),
    "python bench/experiments/tenants.py --seeds 10,11,12,13,14 --capacity 4.8"
    " --preset a100-llama8b-kv --max-num-seqs 32 --no-split": (PARSE, "simulations of minutes"),
    # docs/simulator.md
    "python bench/experiments/table_staleness.py --engines 16 --seeds 10-14 --duration 10": (
        PARSE, "simulations of minutes"),
    "python bench/experiments/table_staleness.py --engines 64 --seeds 10,11 --duration 10": (
        PARSE, "simulations of half an hour"),
    "python bench/experiments/table_staleness.py --engines 16 --seeds 10,11 --duration 10"
    " --lb round-robin": (PARSE, "simulations of minutes"),
    "autellix simulate run --workload W --policy P --rate R [--programs N] [--engines E --lb L]": (
        FORM, "the command's form"),
    "autellix simulate sweep --workload W --policies P1,P2 [--lb L1,L2 --engines E --preset S]": (
        FORM, "the command's form"),
    "autellix simulate matrix [--workloads W] [--settings S] [--seed N] [--workers N] --json": (
        FORM, "the command's form: hours on 2 cores"),
    "autellix simulate tune [--quick] [--workers N]": (FORM, "tables of half an hour"),
    # docs/scheduling.md
    "autellix simulate tune --quick --workers 1": (PARSE, "minutes of simulation"),
}  # fmt: skip

# What a template's placeholders stand for, to parse it.
PLACEHOLDERS = {
    "W": "sharegpt", "P": "autellix", "R": "1", "N": "10", "E": "2", "L": "locality",
    "S": "a100-llama8b", "P1,P2": "vllm-opt,autellix", "L1,L2": "round-robin,locality",
    "0.8*R": "0.8", "0.8*R*duration": "100", "$s": "0", "$b": "8",
}  # fmt: skip

DOCUMENTED = doc_commands()
STOP_WORDS = ("&", "|", ">", ";")  # a command's arguments end there


def key_of(doc: DocCommand) -> str:
    """The command as :data:`DOC_COMMANDS` names it: without its comment, spaces single."""
    return " ".join(re.sub(r"(^|\s)#\s.*$", "", doc.command).split())


def test_every_documented_command_is_classified_and_every_entry_is_documented():
    keys = {key_of(doc) for doc in DOCUMENTED}
    unclassified = [f"{doc.where}: {key_of(doc)}" for doc in DOCUMENTED if key_of(doc) not in
                    DOC_COMMANDS]  # fmt: skip
    assert not unclassified, "classify these in DOC_COMMANDS:\n" + "\n".join(unclassified)
    assert not [key for key in DOC_COMMANDS if key not in keys], "no longer in the docs"
    assert all(reason for kind, reason in DOC_COMMANDS.values() if kind != RUN)


def _parsed(doc: DocCommand, as_template: bool) -> None:
    """Check one command without running it: the shell's syntax, then each program
    of it (``a && b``) with its own parser."""
    check = subprocess.run(["bash", "-n"], input=doc.script, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    command = key_of(doc)
    if as_template:
        command = command.replace("[", "").replace("]", "")
    if substitution := re.fullmatch(r"[A-Z_][A-Z0-9_]*=\$\((.*)\)", command):
        command = substitution.group(1)
    for part in command.split(" && "):
        words = shlex.split(part)
        words = [PLACEHOLDERS.get(w, w) for w in words] if as_template else words
        for stop in STOP_WORDS:
            words = words[: words.index(stop)] if stop in words else words
        while words and (words[0] == "time" or re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0])):
            words = words[1:]
        _program_parses(words, doc.heredoc)


def _program_parses(words: list[str], heredoc: str | None) -> None:
    program, arguments = words[0], words[1:]
    if program == "autellix":
        build_parser().parse_args(arguments)
    elif program == "make":
        _make_target_parses(arguments)
    elif re.fullmatch(r"(\.venv/bin/)?python3?", program):
        _python_parses(arguments, heredoc)


def _python_parses(arguments: list[str], heredoc: str | None) -> None:
    if arguments[0] == "-c":
        compile(arguments[1], "<python -c>", "exec")
    elif arguments[0] == "-":
        assert heredoc is not None
        compile("\n".join(heredoc.splitlines()[:-1]), "<here-document>", "exec")
    elif arguments[:2] == ["-m", "pytest"]:
        paths = [a for a in arguments[2:] if a.startswith("tests")]
        assert paths and all((ROOT / path).exists() for path in paths), paths
    elif arguments[0] == "-m":  # a module; the project's own parse with their parser()
        assert importlib.util.find_spec(arguments[1]) is not None, arguments[1]
        if arguments[1].startswith("autellix_vllm."):
            importlib.import_module(arguments[1]).parser().parse_args(arguments[2:])
    else:
        _example_parses(Path(arguments[0]), arguments[1:])


def _example_parses(script: Path, arguments: list[str]) -> None:
    """An example's own parser (``parser()``) takes the arguments."""
    name = f"documented_{script.stem}"
    spec = importlib.util.spec_from_file_location(name, ROOT / script)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / script.parent))
    sys.modules[name] = module  # dataclasses look their module up while it loads
    try:
        spec.loader.exec_module(module)
        module.parser().parse_args(arguments)
    finally:
        sys.path.remove(str(ROOT / script.parent))
        del sys.modules[name]


def _make_target_parses(arguments: list[str]) -> None:
    """The target exists, and each autellix command of its recipe parses."""
    plan = subprocess.run(["make", "-n", *arguments], cwd=ROOT, capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    for line in plan.stdout.replace("\\\n", " ").splitlines():
        if match := re.search(r"(?:^|/)autellix (.*)$", line):
            build_parser().parse_args(shlex.split(match.group(1)))


def _checked(kinds: tuple[str, ...]) -> list[DocCommand]:
    return [doc for doc in DOCUMENTED if DOC_COMMANDS.get(key_of(doc), ("",))[0] in kinds]


@pytest.mark.parametrize("doc", _checked((PARSE, FORM)), ids=lambda doc: doc.where)
def test_a_command_that_is_not_run_parses(doc):
    _parsed(doc, as_template=DOC_COMMANDS[key_of(doc)][0] == FORM)


# ---- the commands that run ----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _answers(url: str) -> bool:
    """Whether anything answers HTTP at ``url`` (an error status counts)."""
    try:
        urllib.request.urlopen(url, timeout=1).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def router_url() -> Iterator[str]:
    """``autellix serve`` as a router only (its one upstream down): what ``ps`` reads."""
    url = f"http://127.0.0.1:{_free_port()}"
    upstream = f"http://127.0.0.1:{_free_port()}"
    served = subprocess.Popen(
        [sys.executable, "-m", "autellix_vllm", "serve", "--upstream", upstream,
         "--port", url.rsplit(":", 1)[1]],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: _answers(url + "/health") or served.poll() is not None, timeout_s=60)
        assert served.poll() is None, "the router exited before it answered"
        yield url
    finally:
        served.terminate()
        served.wait(timeout=30)


@pytest.mark.parametrize("path", sorted({doc.where.split(":")[0] for doc in _checked((RUN,))}))
def test_the_runnable_commands_of_a_file_run_in_order(path, router_url, tmp_path):
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "AUTELLIX_URL": router_url,
    }
    env.pop("AUTELLIX_API_KEY", None)
    for doc in _checked((RUN,)):
        if doc.where.split(":")[0] != path:
            continue
        script = doc.script.replace("http://127.0.0.1:8000", router_url)
        done = subprocess.run(
            ["bash", "-c", f"set -euo pipefail\n{script}"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, (doc.where, done.stdout[-2000:], done.stderr[-2000:])
        assert DOC_COMMANDS[key_of(doc)][1] in done.stdout, (doc.where, done.stdout[-2000:])
