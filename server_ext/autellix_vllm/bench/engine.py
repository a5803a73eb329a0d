"""Program latency on a real vLLM engine: stock FCFS vs the Autellix scheduler.

The benchmark starts the real engine twice (same model, flags and workload;
only the scheduler differs) and replays one seeded workload of concurrent
multi-call programs through the OpenAI completions API. By default the engines
run one after the other, each alone on the machine; ``side_by_side`` runs both
at once, which shares any background load between them but, on a machine with
few cores, also lets one engine crowd out the other (on 2 cores stock FCFS
against itself measured a ratio of 0.2; docs/benchmarks.md). Naming the same
scheduler twice (``schedulers=("fcfs", "fcfs")``) measures that noise floor.

* the programs come from the simulator's workloads (:mod:`autellix_vllm.workloads`:
  heavy-tailed calls per program, log-normal lengths, Poisson arrivals), with
  token counts scaled down to the tiny CPU model;
* a call's prompt is its program's transcript so far, so later calls share
  their prefix with earlier ones, as agent calls do;
* decode lengths are forced (``ignore_eos`` and ``max_tokens``);
* tool gaps are sleeps between a call and the calls that depend on it;
* ``max_num_seqs`` is small, so the engine saturates and calls queue;
* arrivals are Poisson, spread over a fixed fraction of the time the engines
  need for the whole workload at their probed speed, so the load is the same on
  a fast and on a busy machine.

The metric is the paper's: program latency per token = program wall time
(arrival to last completion) / the program's decoded tokens, averaged over
programs and at the 95th percentile.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import string
import time
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from autellix_vllm.engine.launcher import EngineConfig, EngineProcess, start_all, stop_all
from autellix_vllm.policy import PolicyConfig
from autellix_vllm.protocol import COMPLETIONS_PATH, ENGINE_TABLE_PATH
from autellix_vllm.stats import percentile
from autellix_vllm.workloads import at_rate, generate
from autellix_vllm.workloads.trace import CallSpec, ProgramSpec

# Characters the tiny model's tokenizer has (one token each).
_TEXT = string.ascii_lowercase + "      .,"
PROMPT_HEADROOM = 8  # tokens kept free below max_model_len (BOS, rounding)


@dataclass(frozen=True)
class BenchSettings:
    programs: int = 32
    seed: int = 0
    workload: str = "mixed"
    # Programs arrive (Poisson) over this fraction of the time the engine needs to
    # decode the whole workload at its probed speed: the same load on a fast and
    # on a busy machine. An explicit ``rate`` (programs per second) overrides it.
    arrival_window: float = 0.3
    rate: float | None = None
    token_scale: float = 0.125  # the workload's token counts, scaled to the CPU model
    min_decode: int = 4
    max_decode: int = 128
    tool_gap_s: float = 0.05  # mean tool gap where the workload has none
    max_num_seqs: int = 2
    max_model_len: int = 1024
    call_timeout_s: float = 1800.0
    schedulers: tuple[str, str] = ("fcfs", "autellix")  # baseline, candidate
    side_by_side: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> BenchSettings:
        """16 programs: about two minutes on two idle CPU cores, engine starts included."""
        return replace(cls(programs=16), **overrides)


@dataclass
class ProgramResult:
    program_id: str
    calls: int
    decode_tokens: int
    latency_s: float

    @property
    def latency_per_token(self) -> float:
        return self.latency_s / self.decode_tokens


def build_workload(settings: BenchSettings) -> list[ProgramSpec]:
    """The seeded programs, scaled to fit the CPU model's context and speed; arrivals
    at ``settings.rate``, or one per second on average until :func:`spread` sets them."""
    rate = settings.rate or 1.0
    programs = generate(settings.workload, settings.programs, rate, settings.seed)
    return [_scaled(program, settings) for program in programs]


def _scaled(program: ProgramSpec, settings: BenchSettings) -> ProgramSpec:
    rng = random.Random(f"{settings.seed}/{program.program_id}/gaps")
    calls = []
    for call in program.calls:
        decode = round(call.decode_tokens * settings.token_scale)
        decode = min(settings.max_decode, max(settings.min_decode, decode))
        room = settings.max_model_len - decode - PROMPT_HEADROOM
        prompt = min(room, max(8, round(call.prompt_tokens * settings.token_scale)))
        gap = call.tool_gap
        if gap == 0 and call.after and settings.tool_gap_s > 0:
            gap = rng.expovariate(1 / settings.tool_gap_s)
        calls.append(replace(call, decode_tokens=decode, prompt_tokens=prompt, tool_gap=gap))
    return replace(program, calls=tuple(calls))


def transcript(program_id: str, length: int) -> str:
    """A program's deterministic text; each call's prompt is a prefix of it."""
    rng = random.Random(program_id)
    return "".join(rng.choice(_TEXT) for _ in range(length))


async def replay(
    base_url: str, model: str, programs: list[ProgramSpec], settings: BenchSettings
) -> list[ProgramResult]:
    """Run every program (its calls in dependency order) and time it."""
    timeout = aiohttp.ClientTimeout(total=settings.call_timeout_s)
    # vLLM's server (uvicorn) closes idle keep-alive connections after 5 s; a
    # pooled connection idle for longer (a program's tool gap) may already be
    # closed when reused, so keep idle connections for less than that.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        start = time.monotonic()
        return await asyncio.gather(
            *(_run_program(http, base_url, model, p, start) for p in programs)
        )


async def _run_program(
    http: aiohttp.ClientSession, base_url: str, model: str, program: ProgramSpec, start: float
) -> ProgramResult:
    await asyncio.sleep(max(0.0, start + program.arrival - time.monotonic()))
    arrived = time.monotonic()
    text = transcript(program.program_id, max(c.prompt_tokens for c in program.calls))
    done: dict[str, asyncio.Future[None]] = {
        c.id: asyncio.get_running_loop().create_future() for c in program.calls
    }

    async def run_call(call: CallSpec) -> None:
        await asyncio.gather(*(done[dep] for dep in call.after))
        await asyncio.sleep(call.tool_gap)
        await _complete(http, base_url, model, program.program_id, call, text)
        done[call.id].set_result(None)

    await asyncio.gather(*(run_call(c) for c in program.calls))
    return ProgramResult(
        program.program_id,
        calls=len(program.calls),
        decode_tokens=program.decode_tokens,
        latency_s=time.monotonic() - arrived,
    )


async def _complete(
    http: aiohttp.ClientSession,
    base_url: str,
    model: str,
    program_id: str,
    call: CallSpec,
    text: str,
) -> None:
    headers = {
        "X-Autellix-Program-Id": program_id,
        "X-Autellix-Thread-Id": call.thread,
        "X-Autellix-Call-Id": call.id,
    }
    if call.parent_thread:
        headers["X-Autellix-Parent-Thread-Id"] = call.parent_thread
    body = {
        "model": model,
        "prompt": text[: call.prompt_tokens],
        "max_tokens": call.decode_tokens,
        "ignore_eos": True,
    }
    async with http.post(base_url + COMPLETIONS_PATH, json=body, headers=headers) as response:
        answer = await response.json()
        if response.status != 200:
            raise RuntimeError(f"call {call.id} failed with HTTP {response.status}: {answer}")
    produced = answer["usage"]["completion_tokens"]
    if produced != call.decode_tokens:
        raise RuntimeError(f"call {call.id} produced {produced} tokens, not {call.decode_tokens}")


def summarize(results: list[ProgramResult], wall_s: float) -> dict[str, Any]:
    per_token = [r.latency_per_token for r in results]
    tokens = sum(r.decode_tokens for r in results)
    return {
        "programs": len(results),
        "calls": sum(r.calls for r in results),
        "decode_tokens": tokens,
        "makespan_s": round(wall_s, 3),
        "throughput_tokens_per_s": round(tokens / wall_s, 1),
        "avg_latency_per_token_s": statistics.fmean(per_token),
        "p95_latency_per_token_s": percentile(per_token, 95),
        "p99_latency_per_token_s": percentile(per_token, 99),
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


def engine_config(scheduler: str, settings: BenchSettings, engines_on_host: int) -> EngineConfig:
    return EngineConfig(
        port=0,
        scheduler=scheduler,
        max_num_seqs=settings.max_num_seqs,
        max_model_len=settings.max_model_len,
        extra_env={"AUTELLIX_LEVELS": scaled_levels(settings)},
        engines_on_host=engines_on_host,
    )


async def _measure(engine: EngineProcess, programs: list[ProgramSpec], settings: BenchSettings):
    started = time.monotonic()
    results = await replay(engine.base_url, engine.served_model_name, programs, settings)
    summary = {"scheduler": engine.config.scheduler}
    summary.update(summarize(results, time.monotonic() - started))
    table = await _table(engine.base_url)
    if table.get("enabled"):
        for counter in ("preemptions", "promotions", "demotions"):
            summary[counter] = table[counter]
    return summary


def run_engine_bench(settings: BenchSettings) -> dict[str, Any]:
    """Baseline then candidate scheduler on the same workload and arrivals.

    Ratios > 1: the candidate is faster. A short saturating probe of the first
    engine (of both, side by side) measures the decode speed, which sets the
    arrival window (unless ``settings.rate`` is set).
    """
    programs = build_workload(settings)
    run = _side_by_side if settings.side_by_side else _one_after_another
    speed, programs, (baseline, candidate) = run(programs, settings)
    return {
        "settings": {
            "programs": settings.programs,
            "workload": settings.workload,
            "seed": settings.seed,
            "max_num_seqs": settings.max_num_seqs,
            "token_scale": settings.token_scale,
            "levels": scaled_levels(settings),
            "schedulers": list(settings.schedulers),
            "side_by_side": settings.side_by_side,
            "probe_tokens_per_s": round(speed, 1),
            "arrivals_over_s": round(max(p.arrival for p in programs), 2),
        },
        "baseline": baseline,
        "candidate": candidate,
        "avg_ratio": baseline["avg_latency_per_token_s"] / candidate["avg_latency_per_token_s"],
        "p95_ratio": baseline["p95_latency_per_token_s"] / candidate["p95_latency_per_token_s"],
    }


Outcome = tuple[float, list[ProgramSpec], list[dict[str, Any]]]


def _one_after_another(programs: list[ProgramSpec], settings: BenchSettings) -> Outcome:
    """Each engine alone on the machine; the first one's probe sets the arrivals."""
    summaries: list[dict[str, Any]] = []
    speed = 0.0
    for scheduler in settings.schedulers:
        with EngineProcess(engine_config(scheduler, settings, engines_on_host=1)) as engine:
            if not summaries:
                speed = asyncio.run(probe_speed(engine, settings))
                if settings.rate is None:
                    programs = spread(programs, settings.arrival_window, speed)
            summaries.append(asyncio.run(_measure(engine, programs, settings)))
    return speed, programs, summaries


def _side_by_side(programs: list[ProgramSpec], settings: BenchSettings) -> Outcome:
    """Both engines at once, the workload replayed against both together."""
    configs = [engine_config(name, settings, engines_on_host=2) for name in settings.schedulers]
    engines = start_all(configs)
    try:
        speed = min(asyncio.run(gather_all(*(probe_speed(e, settings) for e in engines))))
        if settings.rate is None:
            programs = spread(programs, settings.arrival_window, speed)
        summaries = asyncio.run(gather_all(*(_measure(e, programs, settings) for e in engines)))
    finally:
        stop_all(engines)
    return speed, programs, summaries


def spread(programs: list[ProgramSpec], window: float, tokens_per_s: float) -> list[ProgramSpec]:
    """Scale arrival times so they span ``window`` x (decode tokens / ``tokens_per_s``)."""
    span = max(p.arrival for p in programs)
    if span == 0:
        return programs
    target = window * sum(p.decode_tokens for p in programs) / tokens_per_s
    return at_rate(programs, target / span)


async def probe_speed(engine: EngineProcess, settings: BenchSettings) -> float:
    """Decode tokens per second with the batch full (second of two rounds: the
    first warms the engine up)."""
    calls = 2 * settings.max_num_seqs
    probe = ProgramSpec(
        "probe", 0.0, tuple(CallSpec(f"probe.{i}", 48, 64, thread=f"t{i}") for i in range(calls))
    )
    seconds = 0.0
    for _ in range(2):
        (result,) = await replay(engine.base_url, engine.served_model_name, [probe], settings)
        seconds = result.latency_s
    return probe.decode_tokens / seconds


async def gather_all(*coroutines: Any) -> list[Any]:
    """``asyncio.gather`` as a coroutine, for ``asyncio.run``."""
    return list(await asyncio.gather(*coroutines))
