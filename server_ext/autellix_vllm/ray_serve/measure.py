"""Measurements of the Ray Serve path (results in docs/benchmarks.md).

``python -m autellix_vllm.ray_serve.measure breakdown``: the latency a call
sees through the Ray application (one tiny-model engine replica) against
today's router (``autellix serve``, one tiny engine), and where the
difference goes. Both run at once and calls alternate between them and the
stages timed alone (sequential, ``max_tokens`` 1), so that the machine's load
weighs on all alike: the whole Ray path for a call of a program (and for one
without, which the directory admits too: it may derive a program for it), the
router's path (router and engine),
Serve's HTTP proxy to a replica that answers at once, the directory's round
trip from a handle, and an engine replica's answer from a handle (request
router, replica, its loopback hop to the engine, the engine).

``python -m autellix_vllm.ray_serve.measure throughput``: the calls per second
the Ray path sustains against today's router, each in front of one tiny
engine: ``--clients`` threads send calls (``max_tokens`` 1, one program each)
back to back for ``--seconds``, first through the router, then through the Ray
application, alternating for ``--rounds``; both stacks stay up throughout, so
an idle one weighs on the machine like a busy one.

``python -m autellix_vllm.ray_serve.measure routers``: programs whose context
grows call by call (a unique system prompt, then each answer and a new user
turn) on two engine replicas, under the program-aware router and Ray's
power-of-two and consistent-hash routers in turn: per router, the prefix-cache
hit rate (cached prompt tokens over prompt tokens, from each answer's usage),
the replicas each program's calls ran on, and program latency (p50, max).

Every process started here is stopped before it returns, also on errors.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx

from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.protocol.paths import CHAT_COMPLETIONS_PATH, PROGRAMS_PATH
from autellix_vllm.ray_serve._ray_adapter import ray, serve
from autellix_vllm.ray_serve.app import RayServeConfig, build_app
from autellix_vllm.ray_serve.ingress import IngressSettings
from autellix_vllm.ray_serve.launch import APP_NAME
from autellix_vllm.ray_serve.messages import EngineCall

TINY = {"model": "tiny", "max_num_seqs": 4, "max_model_len": 512, "kv_cache_gib": 1}
# The tiny model's tokenizer is character-level: one token per character.
CHARS_PER_TOKEN = 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_cluster(num_cpus: int = 4) -> Iterator[int]:
    """A local Ray cluster with Serve's HTTP proxy on a free port (yielded)."""
    port = _free_port()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()


@contextlib.contextmanager
def router_process(engines: int = 1) -> Iterator[str]:
    """``autellix serve`` with ``engines`` tiny engines; its root URL."""
    port = _free_port()
    command = [sys.executable, "-m", "autellix_vllm", "serve", "--model", "tiny",
               "--engines", str(engines), "--max-num-seqs", "4", "--max-model-len", "512",
               "--chars-per-token", "1", "--port", str(port)]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            try:
                _wait_healthy(url, process)
            except RuntimeError as error:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"{error}; its output ends:\n{tail}") from None
            yield url
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"autellix serve exited with code {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(1)
    raise RuntimeError("autellix serve did not get healthy")


def _model(client: httpx.Client) -> str:
    return client.get("/v1/models").json()["data"][0]["id"]


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": 1000 * statistics.median(ordered),
        "p90_ms": 1000 * ordered[int(0.9 * (len(ordered) - 1))],
        "max_ms": 1000 * ordered[-1],
    }


def breakdown(calls: int) -> dict[str, Any]:
    """See the module's docstring."""
    config = RayServeConfig(
        engine={**TINY, "engines_on_host": 2},
        replicas=1,
        ingress=IngressSettings(chars_per_token=CHARS_PER_TOKEN),
    )

    class Answer:
        async def __call__(self, request: object) -> str:
            return "ok"

    # Called, not a class decorator: mypy keeps a decorated class's own type.
    answer = serve.deployment(name="Answer", ray_actor_options={"num_cpus": 0})(Answer)

    with router_process() as router_url, local_cluster() as port:
        serve.run(build_app(config), name=APP_NAME, route_prefix="/")
        serve.run(answer.bind(), name="answer", route_prefix="/answer")
        ray_client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        router_client = httpx.Client(base_url=router_url, timeout=60)
        directory = serve.get_deployment_handle("ProgramDirectory", APP_NAME)
        engines = serve.get_deployment_handle("EngineReplica", APP_NAME)
        body = {"model": _model(ray_client), "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
        engine_call = EngineCall(
            path=CHAT_COMPLETIONS_PATH, raw=json.dumps(body).encode(), identity=CallIdentity(),
            stream=False, program_key="breakdown", prompt_tokens=2,
        )  # fmt: skip
        # An agent's call names its program: the ingress asks the directory, the
        # router its table. A call without one asks them too (a derived program).
        program = {
            name: {"X-Autellix-Program-Id": client.post(PROGRAMS_PATH).json()["program_id"]}
            for name, client in (("ray", ray_client), ("router", router_client))
        }
        stages = {
            "ray_path": lambda: ray_client.post(
                CHAT_COMPLETIONS_PATH, json=body, headers=program["ray"]
            ),
            "ray_path_without_program": lambda: ray_client.post(CHAT_COMPLETIONS_PATH, json=body),
            "router_path": lambda: router_client.post(
                CHAT_COMPLETIONS_PATH, json=body, headers=program["router"]
            ),
            "serve_proxy": lambda: ray_client.get("/answer"),
            "directory_round_trip": lambda: directory.apply.remote([]).result(),
            "engine_replica": lambda: (
                engines.options(session_id="breakdown").answer.remote(engine_call).result()
            ),
        }
        latencies: dict[str, list[float]] = {name: [] for name in stages}
        for _ in range(5):  # warm-up: connections, caches
            for stage in stages.values():
                _answered(stage())
        for _ in range(calls):
            for name, stage in stages.items():
                started = time.perf_counter()
                answer = stage()
                latencies[name].append(time.perf_counter() - started)
                _answered(answer)
        ray_client.close()
        router_client.close()
    result: dict[str, Any] = {name: _percentiles(values) for name, values in latencies.items()}
    added = result["ray_path"]["p50_ms"] - result["router_path"]["p50_ms"]
    result["ray_minus_router_p50_ms"] = added
    result["calls_each"] = calls
    return result


def _answered(answer: object) -> None:
    """Raise unless a breakdown stage's answer is a success (a timed error is no figure)."""
    status = getattr(answer, "status_code", getattr(answer, "status", 200))
    if status != 200:
        raise RuntimeError(f"a measured call answered {status}")


def _calls_per_second(base_url: str, clients: int, seconds: float) -> float:
    """Calls answered per second by ``clients`` threads sending back to back."""

    def send(index: int, model: str, deadline: float) -> int:
        with httpx.Client(base_url=base_url, timeout=120) as client:
            pid = client.post(PROGRAMS_PATH).json()["program_id"]
            body = {"model": model, "max_tokens": 1,
                    "messages": [{"role": "user", "content": f"hi {index}"}]}  # fmt: skip
            answered = 0
            while time.perf_counter() < deadline:
                answer = client.post(
                    CHAT_COMPLETIONS_PATH, json=body, headers={"X-Autellix-Program-Id": pid}
                )
                answer.raise_for_status()
                answered += 1
            return answered

    with httpx.Client(base_url=base_url, timeout=60) as client:
        model = _model(client)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(send, i, model, started + seconds) for i in range(clients)]
        answered = sum(future.result() for future in futures)
    return answered / (time.perf_counter() - started)


def throughput(clients: int, seconds: float, rounds: int, ingress_replicas: int) -> dict[str, Any]:
    """See the module's docstring."""
    config = RayServeConfig(
        engine={**TINY, "engines_on_host": 2},
        replicas=1,
        ingress_replicas=ingress_replicas,
        ingress=IngressSettings(chars_per_token=CHARS_PER_TOKEN),
    )
    rates: dict[str, list[float]] = {"router": [], "ray": []}
    with router_process() as router_url, local_cluster() as port:
        serve.run(build_app(config), name=APP_NAME, route_prefix="/")
        urls = {"router": router_url, "ray": f"http://127.0.0.1:{port}"}
        for url in urls.values():  # warm-up: connections, compiled graphs, caches
            _calls_per_second(url, clients, 3)
        for _ in range(rounds):
            for name, url in urls.items():
                rates[name].append(_calls_per_second(url, clients, seconds))
    return {
        **{f"{name}_calls_per_s": values for name, values in rates.items()},
        "clients": clients,
        "seconds": seconds,
        "ingress_replicas": ingress_replicas,
    }


def _run_program(base_url: str, model: str, index: int, calls: int) -> dict[str, Any]:
    with httpx.Client(base_url=base_url, timeout=120) as client:
        pid = client.post(PROGRAMS_PATH).json()["program_id"]
        system = f"program {index}: " + "".join(chr(97 + (index * 7 + i) % 26) for i in range(180))
        messages = [{"role": "system", "content": system}]
        prompt = cached = 0
        started = time.perf_counter()
        for call in range(calls):
            messages.append({"role": "user", "content": f"step {call}: go on"})
            answer = client.post(
                CHAT_COMPLETIONS_PATH,
                json={"model": model, "messages": messages, "max_tokens": 12},
                headers={"X-Autellix-Program-Id": pid, "X-Autellix-Call-Id": f"c{call}"},
            )
            answer.raise_for_status()
            data = answer.json()
            usage = data["usage"]
            prompt += usage["prompt_tokens"]
            cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            messages.append(
                {"role": "assistant", "content": data["choices"][0]["message"]["content"] or ""}
            )
        latency = time.perf_counter() - started
        time.sleep(0.3)  # the last report reaches the directory
        rows = client.get(PROGRAMS_PATH, params={"limit": 1000}).json()["programs"]
        row = next(r for r in rows if r["program_id"] == pid)
        return {"latency_s": latency, "prompt": prompt, "cached": cached,
                "replicas": len(row["engines"])}  # fmt: skip


def routers(programs: int, calls: int, names: list[str]) -> dict[str, Any]:
    """See the module's docstring."""
    results: dict[str, Any] = {}
    with local_cluster() as port:
        base_url = f"http://127.0.0.1:{port}"
        for name in names:
            config = RayServeConfig(
                engine={**TINY, "engines_on_host": 2,
                        "extra_args": ["--enable-prompt-tokens-details"]},
                replicas=2,
                router=name,
                locality_threshold=64,
                ingress=IngressSettings(chars_per_token=CHARS_PER_TOKEN),
            )  # fmt: skip
            serve.run(build_app(config), name=APP_NAME, route_prefix="/")
            with httpx.Client(base_url=base_url, timeout=60) as client:
                model = _model(client)
            with concurrent.futures.ThreadPoolExecutor(programs) as pool:
                futures = [
                    pool.submit(_run_program, base_url, model, i, calls) for i in range(programs)
                ]
                runs = [future.result() for future in futures]
            serve.delete(APP_NAME)
            latencies = [r["latency_s"] for r in runs]
            results[name] = {
                "prefix_hit_rate": sum(r["cached"] for r in runs) / sum(r["prompt"] for r in runs),
                "programs_on_one_replica": sum(r["replicas"] == 1 for r in runs),
                "program_latency_p50_s": statistics.median(latencies),
                "program_latency_max_s": max(latencies),
            }
    results["programs"], results["calls_per_program"] = programs, calls
    return results


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = made.add_subparsers(dest="what", required=True)
    sub.add_parser("breakdown").add_argument("--calls", type=int, default=200)
    loaded = sub.add_parser("throughput")
    loaded.add_argument("--clients", type=int, default=16)
    loaded.add_argument("--seconds", type=float, default=20)
    loaded.add_argument("--rounds", type=int, default=2)
    loaded.add_argument("--ingress-replicas", type=int, default=1)
    routed = sub.add_parser("routers")
    routed.add_argument("--programs", type=int, default=8)
    routed.add_argument("--calls", type=int, default=6)
    routed.add_argument("--routers", default="autellix,pow2,consistent-hash")
    return made


def main() -> None:
    args = parser().parse_args()
    if args.what == "breakdown":
        result = breakdown(args.calls)
    elif args.what == "throughput":
        result = throughput(args.clients, args.seconds, args.rounds, args.ingress_replicas)
    else:
        result = routers(args.programs, args.calls, args.routers.split(","))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
