"""Program latency on a real vLLM engine: stock FCFS, the Autellix scheduler and
its peers.

The benchmark starts the real engine once per entry of ``schedulers`` (same
model, flags and workload; only the scheduling differs) and replays one
workload of concurrent multi-call programs through the OpenAI completions API:
a seeded workload of the simulator's, or a JSONL trace in its format or one it
imports (Mooncake's, Dynamo's: workloads.trace_formats)
(``trace``). An entry is a scheduler (``vllm`` or ``fcfs``: stock vLLM;
``autellix``: the Autellix scheduler under ``policy``) or a policy the Autellix
scheduler runs (a peer such as ``thunderagent``, :func:`entry_engine`). The
first entry is the baseline; every other one is a candidate, compared with it.
By default the engines run one after the other, each alone on the machine;
``side_by_side`` runs them all at once, which shares any background load
between them but, on a machine with few cores, also lets one engine crowd out
another (on 2 cores stock FCFS against itself measured a ratio of 0.2;
docs/benchmarks.md). Naming the same entry twice (``schedulers=("fcfs",
"fcfs")``) measures that noise floor.

* the programs come from the simulator's workloads (:mod:`autellix_vllm.workloads`:
  heavy-tailed calls per program, log-normal lengths, Poisson arrivals), with
  token counts scaled down to a CPU engine, or from a trace, as recorded (cut
  to fit the context);
* a call's prompt is its program's transcript so far, as token ids drawn from
  the model's own vocabulary, so it is exactly ``prompt_tokens`` long and later
  calls share their prefix with earlier ones, as agent calls do (a call that
  names another context, a subagent's, extends that one instead);
* decode lengths are forced (``ignore_eos`` and ``max_tokens``);
* a program's first calls (those that wait for no other) are streamed, so the
  time of the program's first token is known; the others are not;
* tool gaps are sleeps between a call and the calls that depend on it;
* identity ``sent`` (the default): every call carries the SDK's headers
  (program, thread, call), and on the Autellix engine each program is ended
  after its last call, as the SDK ends a program when it returns (a KV-aware
  policy then drops its held context at once instead of when the hold
  expires);
* identity ``derived``: the agent without the SDK. Each context is a plain
  chat conversation (``/v1/chat/completions``, no autellix header, never
  ended) whose every call repeats the previous call's messages and appends
  new ones, sent through an ``autellix serve --upstream`` router in front of
  the engine, which derives the program from the growing conversation
  (router/derived.py); both schedulers' runs go through a router;
* ``max_num_seqs`` is small, so the engine saturates and calls queue;
* a generated workload's arrivals are Poisson, spread over a fixed fraction of
  the time the engines need for the whole workload at their probed speed, so
  the load is the same on a fast and on a busy machine; a trace keeps its own.

The metric is the paper's: program latency per token = program wall time
(arrival to last completion) / the program's decoded tokens, averaged over
programs and at the 95th percentile. Beside it, what the average hides
(:func:`~autellix_vllm.stats.tails`): the P95 and P99 program latency and the
first-call wait, from a program's first call to its first token (average and
P95). Each candidate's ``ratios`` are the baseline's value of each of these over
its own (> 1: the candidate is faster). Each run also reports vLLM's own counts
of preemptions and prefix-cache hits over the replay (``vllm``), the same for
every scheduler.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from autellix_vllm.bench import IDENTITIES
from autellix_vllm.bench.subprocesses import ROUTER_READY, router_command, running
from autellix_vllm.bench.vllm_counters import counted_between, read_counters
from autellix_vllm.engine.launcher import (
    SCHEDULERS,
    EngineConfig,
    EngineProcess,
    start_all,
    stop_all,
)
from autellix_vllm.engine.models import resolve_model
from autellix_vllm.engine.settings import ENGINE_POLICY_NAMES, SchedulerSettings
from autellix_vllm.plots import draw_latency_cdf, save_panels
from autellix_vllm.policy import PolicyConfig
from autellix_vllm.protocol.identity import (
    CALL_ID_HEADER,
    PARENT_THREAD_ID_HEADER,
    PROGRAM_ID_HEADER,
    THREAD_ID_HEADER,
)
from autellix_vllm.protocol.paths import (
    CHAT_COMPLETIONS_PATH,
    COMPLETIONS_PATH,
    ENGINE_PROGRAM_PATH,
    ENGINE_TABLE_PATH,
)
from autellix_vllm.registry import unknown
from autellix_vllm.router.admin_client import fetch_table
from autellix_vllm.sim.sweep import text_table
from autellix_vllm.stats import percentile, tails
from autellix_vllm.workloads import at_rate, generate, get_workload
from autellix_vllm.workloads.trace import CallSpec, ProgramSpec
from autellix_vllm.workloads.trace_formats import import_trace

PROMPT_HEADROOM = 8  # tokens kept free below max_model_len
# Tokens the chat template adds around each message's text (ChatML, SmolLM2's:
# <|im_start|>, the role, a newline, <|im_end|>, a newline): a derived call's
# messages leave them out of its text, so its templated prompt stays near the
# workload's ``prompt_tokens`` and within the context.
MESSAGE_TEMPLATE_TOKENS = 5
# What an entry of BenchSettings.schedulers may name: a scheduler, or a policy
# the Autellix scheduler runs (a scheduler's name wins: fcfs is stock vLLM).
ENTRY_NAMES = tuple(dict.fromkeys((*SCHEDULERS, *ENGINE_POLICY_NAMES)))


def entry_engine(entry: str, policy: str | None = None) -> tuple[str, str | None]:
    """The scheduler and policy an entry of :attr:`BenchSettings.schedulers` names.

    A scheduler of :data:`~autellix_vllm.engine.launcher.SCHEDULERS` runs as
    ``autellix engine --scheduler`` does, ``autellix`` under ``policy`` (None:
    the engine's default); any other policy an engine can run (a peer such as
    ``thunderagent``) runs on the Autellix scheduler. ValueError for other names.
    """
    if entry in SCHEDULERS:
        return entry, policy if entry == "autellix" else None
    if entry in ENGINE_POLICY_NAMES:
        return "autellix", entry
    raise ValueError(unknown("scheduler or policy", entry, ENTRY_NAMES))


@dataclass(frozen=True)
class BenchSettings:
    # Programs of ``workload`` to generate; with a ``trace``, the first this many
    # (None: all of it).
    programs: int | None = 32
    seed: int = 0
    workload: str = "mixed"
    trace: Path | None = None  # replay this JSONL trace instead of generating
    model: str = "smollm2"  # a name of engine.models.MODELS, or a model folder
    # Programs arrive (Poisson) over this fraction of the time the engine needs to
    # decode the whole workload at its probed speed: the same load on a fast and
    # on a busy machine. An explicit ``rate`` (programs per second) overrides it.
    arrival_window: float = 0.3
    rate: float | None = None
    # The workload's token counts, scaled to the CPU model. A trace keeps its gaps
    # and decode lengths (no min_decode/max_decode); only the scale applies.
    token_scale: float = 0.125
    min_decode: int = 4
    max_decode: int = 128
    tool_gap_s: float = 0.05  # mean tool gap where the workload has none
    # Longer tool gaps are cut to this (the agent workload's tail reaches five
    # minutes, which would stretch a run without loading the engine).
    max_tool_gap_s: float = 10.0
    max_num_seqs: int = 4
    max_model_len: int = 1024
    # The engine's KV cache in blocks (vLLM's --num-gpu-blocks-override; None: as
    # much as its memory allows): a KV-bound engine, where residency matters.
    kv_blocks: int | None = None
    # The policy of the autellix scheduler (None: the engine's default).
    policy: str | None = None
    call_timeout_s: float = 1800.0
    # What is compared: names of ENTRY_NAMES (entry_engine), the baseline first,
    # then each candidate.
    schedulers: tuple[str, ...] = ("fcfs", "autellix")
    side_by_side: bool = False
    # "sent": the SDK's headers, straight to the engine; "derived": plain chat
    # conversations through a router, which derives each program (see the module).
    identity: str = "sent"

    def __post_init__(self) -> None:
        if self.identity not in IDENTITIES:
            raise ValueError(f"identity must be one of {', '.join(IDENTITIES)}: {self.identity!r}")
        if len(self.schedulers) < 2:
            raise ValueError(
                "the bench compares two or more schedulers or policies, the baseline first"
                f" (e.g. fcfs,autellix,thunderagent), not {','.join(self.schedulers)!r}"
            )
        for entry in self.schedulers:
            entry_engine(entry)  # a bad name is refused before any engine starts

    @classmethod
    def quick(cls, **overrides: Any) -> BenchSettings:
        """16 programs: 6-10 minutes on two CPU cores with SmolLM2 (about two with the
        tiny model), engine starts included."""
        return replace(cls(programs=16), **overrides)


@dataclass
class ProgramResult:
    program_id: str
    calls: int
    decode_tokens: int
    latency_s: float
    prompt_tokens: int = 0  # as the engine counted them, over the program's calls
    # Each call's (sent, answered) times in seconds from the run's start: where a
    # program's latency went.
    call_times: dict[str, tuple[float, float]] = field(default_factory=dict)
    # Seconds from its first call's sending to its first token.
    first_call_wait_s: float = 0.0

    @property
    def latency_per_token(self) -> float:
        return self.latency_s / self.decode_tokens


def build_workload(settings: BenchSettings) -> list[ProgramSpec]:
    """The programs to replay, fitted to the CPU model's context and speed.

    A generated workload: seeded, scaled, arrivals at ``settings.rate`` or one
    per second on average until :func:`spread` sets them. A trace: its programs
    in arrival order, scaled by ``token_scale`` and cut to fit the context, its
    arrivals and gaps as recorded (arrivals rescaled to ``settings.rate`` if set).
    """
    if settings.trace is not None:
        programs = sorted(import_trace(settings.trace), key=lambda p: p.arrival)
        programs = [_fitted(p, settings) for p in programs[: settings.programs]]
        return at_rate(programs, _rate_scale(programs, settings.rate))
    if settings.programs is None:
        raise ValueError("a generated workload needs a number of programs")
    rate = settings.rate or 1.0
    programs = generate(
        settings.workload, settings.programs, rate, settings.seed, _context_cap(settings)
    )
    return [_scaled(program, settings) for program in programs]


def _context_cap(settings: BenchSettings) -> int | None:
    """For a workload whose contexts grow to the model's maximum (agent): the
    unscaled context that fits the engine's ``max_model_len`` once scaled, so
    sessions end where the model's context does instead of being cut mid-way
    (a cut prompt would no longer extend the one before it). None for others."""
    if not get_workload(settings.workload).context_limited:
        return None
    usable = settings.max_model_len - PROMPT_HEADROOM - settings.max_decode
    return max(2, int(usable / settings.token_scale))


def _rate_scale(programs: list[ProgramSpec], rate: float | None) -> float:
    """The factor that brings the programs' arrival rate (programs over the time to
    the last arrival, as in a generated workload) to ``rate``; 1 keeps them as is."""
    span = max(p.arrival for p in programs)
    if rate is None or span == 0:
        return 1.0
    return len(programs) / rate / span


def _scaled(program: ProgramSpec, settings: BenchSettings) -> ProgramSpec:
    """A generated program at the CPU scale: decode within [min_decode, max_decode],
    and a tool gap before every dependent call (the workloads have few of their own)."""
    rng = random.Random(f"{settings.seed}/{program.program_id}/gaps")
    calls = []
    for call in program.calls:
        decode = round(call.decode_tokens * settings.token_scale)
        decode = min(settings.max_decode, max(settings.min_decode, decode))
        gap = min(call.tool_gap, settings.max_tool_gap_s)
        if gap == 0 and call.after and settings.tool_gap_s > 0:
            gap = rng.expovariate(1 / settings.tool_gap_s)
        prompt = max(8, round(call.prompt_tokens * settings.token_scale))
        calls.append(_fit_context(call, prompt, decode, gap, settings))
    return replace(program, calls=tuple(calls))


def _fitted(program: ProgramSpec, settings: BenchSettings) -> ProgramSpec:
    """A trace's program scaled by ``token_scale``, its gaps kept."""
    scale = settings.token_scale
    calls = [
        _fit_context(
            call,
            round(call.prompt_tokens * scale),
            max(1, round(call.decode_tokens * scale)),
            call.tool_gap,
            settings,
        )
        for call in program.calls
    ]
    return replace(program, calls=tuple(calls))


def _fit_context(
    call: CallSpec, prompt: int, decode: int, gap: float, settings: BenchSettings
) -> CallSpec:
    """The call with these lengths, cut to fit the model's context: the decode to
    half of it at most, the prompt to what is left."""
    usable = settings.max_model_len - PROMPT_HEADROOM
    decode = min(decode, usable // 2)
    prompt = max(1, min(prompt, usable - decode))
    return replace(call, decode_tokens=decode, prompt_tokens=prompt, tool_gap=gap)


@dataclass(frozen=True)
class PromptVocabulary:
    """The token ids synthesized prompts are drawn from: every id of the model's
    tokenizer except its special and added tokens (which would end or steer a
    prompt). Prompts are sent as ids, so their length is exact whatever the
    tokenizer (one character a token in the tiny model, BPE in SmolLM2)."""

    ids: tuple[int, ...]

    @classmethod
    def for_model(cls, model: str) -> PromptVocabulary:
        """The vocabulary of a model name of :data:`~autellix_vllm.engine.models.MODELS`
        or of a model folder."""
        return cls.of_model(resolve_model(model).path)

    @classmethod
    def of_model(cls, folder: str | Path) -> PromptVocabulary:
        """Read from the model folder's ``tokenizer.json`` (offline)."""
        path = Path(folder) / "tokenizer.json"
        try:
            tokenizer = json.loads(path.read_text())
        except OSError as error:
            raise ValueError(f"cannot read the model's tokenizer {path}: {error}") from None
        vocab = tokenizer["model"]["vocab"]
        ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
        ids -= {token["id"] for token in tokenizer.get("added_tokens", [])}
        if not ids:
            raise ValueError(f"{path} has no ordinary tokens to build prompts from")
        return cls(tuple(sorted(ids)))

    def transcript(self, key: str, length: int) -> list[int]:
        """A deterministic token sequence for ``key``; the prompts of one context
        are prefixes of it."""
        return random.Random(key).choices(self.ids, k=length)


@dataclass(frozen=True)
class ChatWords:
    """The text of derived-identity chat messages: pieces that are one token each
    and stay so when joined, so a message of ``n`` pieces is ``n`` tokens. For a
    word-level tokenizer (SmolLM2's BPE) the tokens that are a space and ASCII
    letters; for a character-level one (the tiny model) the ASCII letters."""

    pieces: tuple[str, ...]

    @classmethod
    def for_model(cls, model: str) -> ChatWords:
        """The pieces of a model name of :data:`~autellix_vllm.engine.models.MODELS`
        or of a model folder."""
        return cls.of_model(resolve_model(model).path)

    @classmethod
    def of_model(cls, folder: str | Path) -> ChatWords:
        """Read from the model folder's ``tokenizer.json`` (offline)."""
        from tokenizers import Tokenizer  # vLLM's dependency; only derived runs need it

        tokenizer = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
        ids = PromptVocabulary.of_model(folder).ids
        decoded = [tokenizer.decode([i]) for i in ids]
        words = sorted({t for t in decoded if len(t) > 1 and t[0] == " " and _letters(t[1:])})
        if len(words) < 2:
            words = sorted({t for t in decoded if len(t) == 1 and _letters(t)})
        if len(words) < 2:
            raise ValueError(f"{folder}: no one-token words to write chat messages with")
        return cls(tuple(words))

    def transcript(self, key: str, length: int) -> list[str]:
        """A deterministic sequence of ``length`` pieces for ``key``."""
        return random.Random(key).choices(self.pieces, k=length)


def _letters(text: str) -> bool:
    return text.isascii() and text.isalpha()


def context_key(program: ProgramSpec, call: CallSpec) -> str:
    """Which transcript a call's prompt is a prefix of: its program's, or (a call
    that names a context) that subagent's."""
    context = call.context
    return program.program_id if context is None else f"{program.program_id}/{context}"


def prompts(program: ProgramSpec, vocabulary: PromptVocabulary) -> dict[str, list[int]]:
    """Every call's prompt (by call id): the first ``prompt_tokens`` ids of its
    context's transcript, so a later call extends the earlier ones."""
    longest: dict[str, int] = {}
    for call in program.calls:
        key = context_key(program, call)
        longest[key] = max(longest.get(key, 0), call.prompt_tokens)
    texts = {key: vocabulary.transcript(key, length) for key, length in longest.items()}
    return {
        call.id: texts[context_key(program, call)][: call.prompt_tokens] for call in program.calls
    }


def conversations(program: ProgramSpec, words: ChatWords) -> dict[str, list[dict[str, str]]]:
    """Every call's chat messages (by call id), for identity ``derived``.

    A context's calls, by prompt length, cut its transcript into turns: the
    first turn is a system and a user message, each later one an assistant
    message (the reply the call before received) and a user message (the tool
    output). A call's messages are every turn up to its prompt length, so they
    repeat the previous call's and append to them, as an agent's conversation
    grows. Each message's text is :data:`MESSAGE_TEMPLATE_TOKENS` shorter than
    its share of the prompt, which the chat template fills.
    """
    by_context: dict[str, list[CallSpec]] = {}
    for call in program.calls:
        by_context.setdefault(context_key(program, call), []).append(call)
    messages_of: dict[str, list[dict[str, str]]] = {}
    for key, calls in by_context.items():
        cuts = sorted({call.prompt_tokens for call in calls})
        text = words.transcript(key, cuts[-1])
        messages: list[dict[str, str]] = []
        upto: dict[int, list[dict[str, str]]] = {}
        start = 0
        for turn, cut in enumerate(cuts):
            segment = text[start:cut]
            half = len(segment) // 2
            roles = ("system", "user") if turn == 0 else ("assistant", "user")
            for role, part in zip(roles, (segment[:half], segment[half:]), strict=True):
                if part:
                    kept = max(1, len(part) - MESSAGE_TEMPLATE_TOKENS)
                    messages.append({"role": role, "content": "".join(part[:kept])})
            upto[cut] = list(messages)
            start = cut
        for call in calls:
            messages_of[call.id] = upto[call.prompt_tokens]
    return messages_of


@dataclass(frozen=True)
class CallRequest:
    """What one replayed call sends: its path, body and headers."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]


def call_requests(
    program: ProgramSpec,
    model: str,
    identity: str,
    vocabulary: PromptVocabulary | None = None,
    words: ChatWords | None = None,
) -> dict[str, CallRequest]:
    """Every call's request (by call id). ``sent``: a completion of the call's
    token-id prompt (:func:`prompts`, from ``vocabulary``) with the SDK's headers.
    ``derived``: a chat completion of its :func:`conversations` (from ``words``)
    with no header at all. Decode lengths are forced in both."""
    forced = {"model": model, "ignore_eos": True}
    if identity == "derived":
        if words is None:
            raise ValueError("identity derived needs the model's ChatWords")
        messages = conversations(program, words)
        return {
            call.id: CallRequest(
                CHAT_COMPLETIONS_PATH,
                {
                    **forced,
                    **_streamed(call),
                    "messages": messages[call.id],
                    "max_tokens": call.decode_tokens,
                },
                {},
            )
            for call in program.calls
        }
    if vocabulary is None:
        raise ValueError("identity sent needs the model's PromptVocabulary")
    prompt_of = prompts(program, vocabulary)
    requests = {}
    for call in program.calls:
        headers = {
            PROGRAM_ID_HEADER: program.program_id,
            THREAD_ID_HEADER: call.thread,
            CALL_ID_HEADER: call.id,
        }
        if call.parent_thread:
            headers[PARENT_THREAD_ID_HEADER] = call.parent_thread
        body = {
            **forced,
            **_streamed(call),
            "prompt": prompt_of[call.id],
            "max_tokens": call.decode_tokens,
        }
        requests[call.id] = CallRequest(COMPLETIONS_PATH, body, headers)
    return requests


def _streamed(call: CallSpec) -> dict[str, Any]:
    """A program's first call (it waits for no other) is streamed, with its usage in
    the last chunk: its first chunk times the program's first token."""
    return {} if call.after else {"stream": True, "stream_options": {"include_usage": True}}


async def replay(
    base_url: str,
    model: str,
    programs: list[ProgramSpec],
    settings: BenchSettings,
    vocabulary: PromptVocabulary | None = None,
    end_path: str | None = None,
    words: ChatWords | None = None,
) -> list[ProgramResult]:
    """Run every program (its calls in dependency order) and time it, with the
    identity of ``settings.identity``. Prompts come from ``vocabulary``, a derived
    call's messages from ``words`` (default: those of ``settings.model``). With
    ``end_path`` (a path with ``{program_id}``), each program is ended there by a
    ``DELETE`` after its last call, as the SDK ends a program when it returns: a
    KV-aware engine then drops the program's held context at once."""
    if settings.identity == "derived":
        words = words or ChatWords.for_model(settings.model)
    else:
        vocabulary = vocabulary or PromptVocabulary.for_model(settings.model)
    timeout = aiohttp.ClientTimeout(total=settings.call_timeout_s)
    # vLLM's server (uvicorn) closes idle keep-alive connections after 5 s; a
    # pooled connection idle for longer (a program's tool gap) may already be
    # closed when reused, so keep idle connections for less than that.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
    requests = [call_requests(p, model, settings.identity, vocabulary, words) for p in programs]
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        start = time.monotonic()
        return await asyncio.gather(
            *(
                _run_program(http, base_url, program, start, program_requests, end_path)
                for program, program_requests in zip(programs, requests, strict=True)
            )
        )


async def _run_program(
    http: aiohttp.ClientSession,
    base_url: str,
    program: ProgramSpec,
    start: float,
    requests: dict[str, CallRequest],
    end_path: str | None,
) -> ProgramResult:
    await asyncio.sleep(max(0.0, start + program.arrival - time.monotonic()))
    arrived = time.monotonic()
    done: dict[str, asyncio.Future[None]] = {
        c.id: asyncio.get_running_loop().create_future() for c in program.calls
    }
    prompt_tokens: dict[str, int] = {}
    call_times: dict[str, tuple[float, float]] = {}
    first_tokens: list[float] = []  # of the streamed first calls, from the run's start

    async def run_call(call: CallSpec) -> None:
        await asyncio.gather(*(done[dep] for dep in call.after))
        await asyncio.sleep(call.tool_gap)
        sent = time.monotonic()
        answer = await _complete(http, base_url, call, requests[call.id])
        prompt_tokens[call.id] = answer.prompt_tokens
        if answer.first_token is not None:
            first_tokens.append(answer.first_token - start)
        call_times[call.id] = (sent - start, time.monotonic() - start)
        done[call.id].set_result(None)

    await asyncio.gather(*(run_call(c) for c in program.calls))
    first_sent = min(call_times[c.id][0] for c in program.calls if not c.after)
    result = ProgramResult(
        program.program_id,
        calls=len(program.calls),
        decode_tokens=program.decode_tokens,
        latency_s=time.monotonic() - arrived,
        prompt_tokens=sum(prompt_tokens.values()),
        call_times=call_times,
        first_call_wait_s=min(first_tokens) - first_sent,
    )
    if end_path is not None:
        url = base_url + end_path.format(program_id=quote(program.program_id, safe=""))
        async with http.delete(url) as response:
            if response.status not in (200, 404):  # 404: already dropped as idle
                raise RuntimeError(
                    f"ending {program.program_id} failed with HTTP {response.status}:"
                    f" {await response.text()}"
                )
    return result


@dataclass(frozen=True)
class Answer:
    """What a call's answer tells the replay."""

    prompt_tokens: int  # as the engine counted them
    first_token: float | None  # a streamed call's: when its first chunk came (monotonic)


async def _complete(
    http: aiohttp.ClientSession, base_url: str, call: CallSpec, request: CallRequest
) -> Answer:
    """Send the call; checks the forced decode length (and a token-id prompt's
    length)."""
    url = base_url + request.path
    first_token = None
    async with http.post(url, json=request.body, headers=request.headers) as response:
        if response.status != 200:
            raise RuntimeError(
                f"call {call.id} failed with HTTP {response.status}: {await response.text()}"
            )
        if request.body.get("stream"):
            answer: dict[str, Any] = {}
            async for chunk in _events(response):
                if "error" in chunk:
                    raise RuntimeError(f"call {call.id} failed mid-stream: {chunk['error']}")
                if chunk.get("choices") and first_token is None:
                    first_token = time.monotonic()
                if chunk.get("usage"):
                    answer["usage"] = chunk["usage"]
            if "usage" not in answer:
                raise RuntimeError(f"call {call.id}: its stream ended without the usage")
        else:
            answer = await response.json()
    usage = answer["usage"]
    if usage["completion_tokens"] != call.decode_tokens:
        raise RuntimeError(
            f"call {call.id} produced {usage['completion_tokens']} tokens, not {call.decode_tokens}"
        )
    prompt = request.body.get("prompt")
    if prompt is not None and usage["prompt_tokens"] != len(prompt):
        raise RuntimeError(
            f"call {call.id}: the engine counted {usage['prompt_tokens']}"
            f" prompt tokens, not {len(prompt)}"
        )
    return Answer(usage["prompt_tokens"], first_token)


async def _events(response: aiohttp.ClientResponse) -> Any:
    """The JSON chunks of a server-sent event stream, up to ``[DONE]``."""
    async for line in response.content:
        data = line.strip().removeprefix(b"data:").strip()
        if not line.startswith(b"data:") or not data:
            continue
        if data == b"[DONE]":
            return
        yield json.loads(data)


def summarize(results: list[ProgramResult], wall_s: float) -> dict[str, Any]:
    """The run's program latency per decoded token (average, tails), the program
    latency and first-call wait tails, and each program's own latency, which shows
    whose latency a tail is."""
    per_token = [r.latency_per_token for r in results]
    seconds = tails((r.latency_s for r in results), (r.first_call_wait_s for r in results))
    tokens = sum(r.decode_tokens for r in results)
    return {
        "programs": len(results),
        "calls": sum(r.calls for r in results),
        "prompt_tokens": sum(r.prompt_tokens for r in results),
        "decode_tokens": tokens,
        "makespan_s": round(wall_s, 3),
        "throughput_tokens_per_s": round(tokens / wall_s, 1),
        "avg_latency_per_token_s": statistics.fmean(per_token),
        "p95_latency_per_token_s": percentile(per_token, 95),
        "p99_latency_per_token_s": percentile(per_token, 99),
        **{f"{key}_s": value for key, value in seconds.items()},
        "latency_per_token_s_by_program": {
            r.program_id: round(r.latency_per_token, 4) for r in results
        },
        "program_latency_s_by_program": {r.program_id: round(r.latency_s, 3) for r in results},
        "call_times_s_by_program": {
            r.program_id: {call: [round(t, 3) for t in when] for call, when in r.call_times.items()}
            for r in results
        },
    }


async def _table(base_url: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(base_url + ENGINE_TABLE_PATH) as response,
    ):
        return await response.json()


def scaled_levels(settings: BenchSettings) -> str:
    """The policy's level boundaries, scaled like the workload's token counts, so a
    program crosses the same levels as its unscaled original would."""
    bounds = PolicyConfig().levels.boundaries
    return ",".join(f"{b * settings.token_scale:g}" for b in bounds)


def engine_config(entry: str, settings: BenchSettings, engines_on_host: int) -> EngineConfig:
    """The engine that runs ``entry`` (:func:`entry_engine`) on ``settings``."""
    scheduler, policy = entry_engine(entry, settings.policy)
    kv = settings.kv_blocks
    return EngineConfig(
        model=settings.model,
        port=0,
        scheduler=scheduler,
        policy=policy,
        max_num_seqs=settings.max_num_seqs,
        max_model_len=settings.max_model_len,
        extra_env={"AUTELLIX_LEVELS": scaled_levels(settings)},
        extra_args=[] if kv is None else ["--num-gpu-blocks-override", str(kv)],
        engines_on_host=engines_on_host,
    )


@dataclass
class EngineRun:
    """One entry's replay of the workload: its summary and each program's result."""

    summary: dict[str, Any]
    results: list[ProgramResult]


def _policy_run(config: EngineConfig) -> str | None:
    """The policy an engine runs: its config's, else the one its environment sets
    or the default (the engine inherits this process's); None for stock vLLM."""
    if not config.runs_autellix:
        return None
    return config.policy or SchedulerSettings.from_env(os.environ).policy


async def _measure(
    entry: str,
    engine: EngineProcess,
    programs: list[ProgramSpec],
    settings: BenchSettings,
    vocabulary: PromptVocabulary,
) -> EngineRun:
    counters_before = await asyncio.to_thread(read_counters, [engine.base_url])
    summary: dict[str, Any] = {
        "entry": entry,
        "scheduler": engine.config.scheduler,
        "policy": _policy_run(engine.config),
    }
    if settings.identity == "derived":
        # Derived: through a router that names the programs; nobody ends them.
        words = await asyncio.to_thread(ChatWords.of_model, engine.model.path)
        with running(router_command([engine.base_url]), ROUTER_READY) as router:
            started = time.monotonic()
            results = await replay(
                router.ready, engine.served_model_name, programs, settings, words=words
            )
            wall_s = time.monotonic() - started
            table = await asyncio.to_thread(fetch_table, router.ready, None)
        summary["router_programs"] = [
            {key: row[key] for key in ("name", "calls_completed", "calls_failed")}
            for row in table["programs"]
        ]
    else:
        # Programs end as the SDK's do; only the Autellix scheduler keeps programs.
        end_path = ENGINE_PROGRAM_PATH if engine.config.runs_autellix else None
        started = time.monotonic()
        results = await replay(
            engine.base_url, engine.served_model_name, programs, settings, vocabulary, end_path
        )
        wall_s = time.monotonic() - started
    summary.update(summarize(results, wall_s))
    counters_after = await asyncio.to_thread(read_counters, [engine.base_url])
    summary["vllm"] = counted_between(counters_before, counters_after)
    table = await _table(engine.base_url)
    if table.get("enabled"):
        for counter in ("preemptions", "kv_preemptions", "promotions", "demotions"):
            summary[counter] = table[counter]
        summary["waiter_preemptions"] = table.get("waiter_preemptions", {})
        if "residency" in table:  # a KV-aware policy's holds
            summary["residency"] = table["residency"]
    return EngineRun(summary, results)


def run_engine_bench(settings: BenchSettings) -> dict[str, Any]:
    """Every entry of ``settings.schedulers`` on the same workload and arrivals:
    the baseline's summary, and each candidate's with its ``ratios``.

    A short saturating probe of the first engine (of all, side by side) measures
    the decode speed, which sets the arrival window of a generated workload
    (unless ``settings.rate`` is set).
    """
    speed, programs, (baseline, *candidates) = run_schedulers(settings)
    return {
        "settings": settings_summary(settings, speed, programs),
        "baseline": baseline.summary,
        "candidates": [
            {**run.summary, "ratios": ratios(baseline.summary, run.summary)} for run in candidates
        ],
    }


# What a candidate is compared with the baseline on, in seconds (a summary's key
# and its heading in the text table): latency per token, then what its average hides.
COMPARED = (
    ("avg_latency_per_token_s", "AVG/TOKEN"),
    ("p95_latency_per_token_s", "P95/TOKEN"),
    ("p99_latency_per_token_s", "P99/TOKEN"),
    ("p95_program_latency_s", "P95 PROGRAM"),
    ("p99_program_latency_s", "P99 PROGRAM"),
    ("avg_first_call_wait_s", "AVG FIRST WAIT"),
    ("p95_first_call_wait_s", "P95 FIRST WAIT"),
)


def ratios(baseline: dict[str, Any], candidate: dict[str, Any]) -> dict[str, float | None]:
    """The baseline's value of each :data:`COMPARED` key over the candidate's: > 1,
    the candidate is faster (None where the candidate's is 0)."""
    return {key: baseline[key] / candidate[key] if candidate[key] else None for key, _ in COMPARED}


def run_labels(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """:func:`run_engine_bench`'s runs by the name the table and the plot give them:
    its entry, the baseline's marked, a repeated entry numbered."""
    runs: dict[str, dict[str, Any]] = {}
    for position, run in enumerate([result["baseline"], *result["candidates"]], start=1):
        label = f"baseline: {run['entry']}" if position == 1 else run["entry"]
        runs[f"{label} #{position}" if label in runs else label] = run
    return runs


def format_engine_bench(result: dict[str, Any]) -> str:
    """:func:`run_engine_bench`'s result for a terminal: what ran, then one row per
    entry, each candidate's value followed by its ratio to the baseline's."""
    settings = result["settings"]
    lines = [
        f"{settings['programs']} programs of {settings['workload']} on {settings['model']},"
        f" {settings['max_num_seqs']} seats, identity {settings['identity']},"
        f" {'side by side' if settings['side_by_side'] else 'one after another'};"
        f" probe {settings['probe_tokens_per_s']:g} tokens/s",
        "seconds (per token: s/token); (x): the baseline's over this run's, > 1: faster",
    ]
    rows = [("RUN", "POLICY", *(heading for _, heading in COMPARED), "MAKESPAN")]
    for label, run in run_labels(result).items():
        compared = run.get("ratios", {})
        cells = []
        for key, _ in COMPARED:
            ratio = compared.get(key)
            cells.append(f"{run[key]:.4g}" + ("" if ratio is None else f" ({ratio:.2f}x)"))
        rows.append((label, run["policy"] or "-", *cells, f"{run['makespan_s']:.4g}"))
    lines += text_table(rows)
    if "plot" in result:
        lines.append(f"plot: {result['plot']}")
    return "\n".join(lines)


# The left panel's bars: a summary's key and its label.
AVERAGE_BARS = (
    ("avg_latency_per_token_s", "average"),
    ("p95_latency_per_token_s", "P95"),
    ("p99_latency_per_token_s", "P99"),
)


def plot_engine_bench(result: dict[str, Any], path: str) -> Any:
    """Two panels of :func:`run_engine_bench`'s result: each run's program latency
    per token (average, P95, P99), and each one's program latency CDF. Writes
    ``path`` (PNG) and returns the matplotlib figure."""
    runs = run_labels(result)
    latencies = {
        label: list(run["program_latency_s_by_program"].values()) for label, run in runs.items()
    }

    def averages(ax: Any) -> None:
        width = 0.8 / len(runs)
        for i, (label, run) in enumerate(runs.items()):
            xs = [j + i * width for j in range(len(AVERAGE_BARS))]
            ax.bar(xs, [run[key] for key, _ in AVERAGE_BARS], width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(AVERAGE_BARS))])
        ax.set_xticklabels([name for _, name in AVERAGE_BARS])
        ax.set_ylabel("program latency per token (s)")
        ax.legend(fontsize=8)

    settings = result["settings"]
    title = f"{settings['programs']} programs of {settings['workload']} on {settings['model']}"
    return save_panels(
        path, title, [averages, lambda ax: draw_latency_cdf(ax, latencies, "each program")]
    )


def settings_summary(
    settings: BenchSettings, speed: float, programs: list[ProgramSpec]
) -> dict[str, Any]:
    """What a result says about how it was measured."""
    return {
        "model": settings.model,
        "programs": len(programs),
        "workload": str(settings.trace) if settings.trace else settings.workload,
        "seed": settings.seed,
        "max_num_seqs": settings.max_num_seqs,
        "max_model_len": settings.max_model_len,
        "kv_blocks": settings.kv_blocks,
        "policy": settings.policy,
        "token_scale": settings.token_scale,
        "levels": scaled_levels(settings),
        "schedulers": list(settings.schedulers),
        "side_by_side": settings.side_by_side,
        "identity": settings.identity,
        "probe_tokens_per_s": round(speed, 1),
        "arrivals_over_s": round(max(p.arrival for p in programs), 2),
    }


Outcome = tuple[float, list[ProgramSpec], list[EngineRun]]


def run_schedulers(settings: BenchSettings) -> Outcome:
    """Replay the workload once per entry of ``settings.schedulers``: the probed
    decode speed, the programs as replayed (arrivals set) and each run."""
    programs = build_workload(settings)
    run = _side_by_side if settings.side_by_side else _one_after_another
    return run(programs, settings)


def _arrivals(programs: list[ProgramSpec], settings: BenchSettings, speed: float):
    """A generated workload's arrivals, spread by the probed speed (unless a rate
    was given); a trace's as built."""
    if settings.trace is not None or settings.rate is not None:
        return programs
    return spread(programs, settings.arrival_window, speed)


def _one_after_another(programs: list[ProgramSpec], settings: BenchSettings) -> Outcome:
    """Each engine alone on the machine, warmed up by a probe first; the first
    engine's probe sets the arrivals."""
    runs: list[EngineRun] = []
    speed = 0.0
    for entry in settings.schedulers:
        with EngineProcess(engine_config(entry, settings, engines_on_host=1)) as engine:
            vocabulary = PromptVocabulary.of_model(engine.model.path)
            probed = asyncio.run(probe_speed(engine, settings, vocabulary))
            if not runs:
                speed = probed
                programs = _arrivals(programs, settings, speed)
            runs.append(asyncio.run(_measure(entry, engine, programs, settings, vocabulary)))
    return speed, programs, runs


def _side_by_side(programs: list[ProgramSpec], settings: BenchSettings) -> Outcome:
    """Every engine at once, sharing the cores, the workload replayed against all
    of them together; the slowest probe sets the arrivals."""
    entries = settings.schedulers
    configs = [engine_config(entry, settings, engines_on_host=len(entries)) for entry in entries]
    engines = start_all(configs)
    try:
        vocabulary = PromptVocabulary.of_model(engines[0].model.path)
        probes = [probe_speed(e, settings, vocabulary) for e in engines]
        speed = min(asyncio.run(gather_all(*probes)))
        programs = _arrivals(programs, settings, speed)
        measures = [
            _measure(entry, engine, programs, settings, vocabulary)
            for entry, engine in zip(entries, engines, strict=True)
        ]
        runs = asyncio.run(gather_all(*measures))
    finally:
        stop_all(engines)
    return speed, programs, runs


def spread(programs: list[ProgramSpec], window: float, tokens_per_s: float) -> list[ProgramSpec]:
    """Scale arrival times so they span ``window`` x (decode tokens / ``tokens_per_s``)."""
    span = max(p.arrival for p in programs)
    if span == 0:
        return programs
    target = window * sum(p.decode_tokens for p in programs) / tokens_per_s
    return at_rate(programs, target / span)


def probe_program(settings: BenchSettings) -> ProgramSpec:
    """What :func:`probe_speed` replays: twice the batch of 48-token answers at once."""
    calls = 2 * settings.max_num_seqs
    return ProgramSpec(
        "probe", 0.0, tuple(CallSpec(f"probe.{i}", 48, 64, thread=f"t{i}") for i in range(calls))
    )


async def probe_speed(
    engine: EngineProcess, settings: BenchSettings, vocabulary: PromptVocabulary | None = None
) -> float:
    """Decode tokens per second with the batch full (second of two rounds: the
    first warms the engine up)."""
    probe = probe_program(settings)
    sent = replace(settings, identity="sent")  # the same probe whatever the identity
    seconds = 0.0
    for _ in range(2):
        (result,) = await replay(
            engine.base_url, engine.served_model_name, [probe], sent, vocabulary
        )
        seconds = result.latency_s
    return probe.decode_tokens / seconds


async def gather_all(*coroutines: Any) -> list[Any]:
    """``asyncio.gather`` as a coroutine, for ``asyncio.run``."""
    return list(await asyncio.gather(*coroutines))
