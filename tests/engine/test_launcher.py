"""How the launcher builds the server's command line and environment (no engine)."""

import json
import sys

import pytest
from autellix_vllm.engine import launcher, models
from autellix_vllm.engine.launcher import EngineConfig, EngineProcess, EngineStartError
from autellix_vllm.engine.models import ModelSpec
from autellix_vllm.engine.reaper import group_members
from autellix_vllm.engine.settings import VARIABLES, SchedulerSettings, SettingError
from autellix_vllm.policy import Levels

TINY = ModelSpec(
    "/m", "autellix-tiny", dtype="float32", load_format="dummy", tool_call_parser="hermes"
)
PLAIN = ModelSpec("/models/llama", "/models/llama")


def flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_cpu_command_uses_the_autellix_scheduler_and_cpu_flags():
    cmd = launcher.server_command(EngineConfig(max_num_seqs=3), TINY, 8123)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert flag(cmd, "--scheduler-cls") == "autellix_vllm.engine.scheduler.AutellixScheduler"
    assert flag(cmd, "--scheduling-policy") == "priority"
    assert flag(cmd, "--middleware") == "autellix_vllm.engine.middleware.IdentityMiddleware"
    assert flag(cmd, "--load-format") == "dummy"
    assert flag(cmd, "--dtype") == "float32"
    assert flag(cmd, "--max-num-seqs") == "3"
    assert flag(cmd, "--port") == "8123"
    assert "--enforce-eager" in cmd


def test_answers_carry_per_request_timings_unless_the_user_turns_stats_off():
    assert "--enable-per-request-metrics" in launcher.server_command(EngineConfig(), TINY, 1)
    quiet = EngineConfig(extra_args=["--disable-log-stats"])
    assert "--enable-per-request-metrics" not in launcher.server_command(quiet, TINY, 1)


def test_fcfs_baseline_is_stock_vllm_with_the_same_flags():
    autellix = launcher.server_command(EngineConfig(), TINY, 1)
    fcfs = launcher.server_command(EngineConfig(scheduler="fcfs"), TINY, 1)
    assert "--scheduler-cls" not in fcfs
    assert flag(fcfs, "--scheduling-policy") == "fcfs"
    strip = {
        "--scheduler-cls",
        "autellix_vllm.engine.scheduler.AutellixScheduler",
        "priority",
        "fcfs",
    }
    assert [a for a in autellix if a not in strip] == [a for a in fcfs if a not in strip]


def test_gpu_with_an_explicit_model_uses_the_async_scheduler_and_no_cpu_settings(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    config = EngineConfig(model="/models/llama", device="gpu", extra_args=["--foo", "1"])
    cmd = launcher.server_command(config, PLAIN, 1)
    assert flag(cmd, "--scheduler-cls") == "autellix_vllm.engine.scheduler.AutellixAsyncScheduler"
    assert "--load-format" not in cmd and "--enforce-eager" not in cmd
    assert cmd[-2:] == ["--foo", "1"]
    env = launcher.server_environment(config)
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env
    assert "OMP_NUM_THREADS" not in env
    assert env["HF_HUB_OFFLINE"] == "1"


def test_a_cpu_engine_gets_the_cpu_defaults_and_a_gpu_engine_vllms_own(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cpu = EngineConfig(device="cpu")
    cmd = launcher.server_command(cpu, TINY, 1)
    assert flag(cmd, "--max-model-len") == str(launcher.CPU_MAX_MODEL_LEN) == "1024"
    assert flag(cmd, "--max-num-seqs") == str(launcher.CPU_MAX_NUM_SEQS) == "16"
    assert launcher.server_environment(cpu)["VLLM_CPU_KVCACHE_SPACE"] == "1"
    # An 8B model on an H200 must not get a 1,024-token context and 16 seats.
    gpu = launcher.server_command(EngineConfig(model="/models/llama", device="gpu"), PLAIN, 1)
    for vllm_default in ("--max-model-len", "--max-num-seqs", "--kv-cache-memory-bytes",
                         "--kv-offloading-size", "--enforce-eager"):  # fmt: skip
        assert vllm_default not in gpu


def test_a_gpu_engine_passes_what_was_set_and_the_host_kv_tier():
    config = EngineConfig(
        model="/models/llama", device="gpu", max_model_len=32768, max_num_seqs=512,
        kv_cache_gib=60, kv_offload_gib=200,
    )  # fmt: skip
    cmd = launcher.server_command(config, PLAIN, 1)
    assert flag(cmd, "--max-model-len") == "32768"
    assert flag(cmd, "--max-num-seqs") == "512"
    assert flag(cmd, "--kv-cache-memory-bytes") == str(60 * 2**30)
    assert flag(cmd, "--kv-offloading-size") == "200"
    assert flag(cmd, "--kv-offloading-backend") == "native"
    assert json.loads(flag(cmd, "--kv-transfer-config")) == {
        "kv_connector_extra_config": {"offload_prompt_only": False}
    }
    assert "VLLM_CPU_KVCACHE_SPACE" not in launcher.server_environment(config)


def test_a_host_kv_tier_needs_a_gpu_engine():
    with pytest.raises(ValueError, match="kv-offload-gib"):
        launcher.server_command(EngineConfig(device="cpu", kv_offload_gib=8), TINY, 1)


def test_auto_warns_when_a_gpu_is_here_but_the_cpu_build_is_installed(monkeypatch):
    monkeypatch.setattr(launcher, "vllm_gpu_build", lambda: False)
    monkeypatch.setattr(launcher, "nvidia_gpus", lambda: ["GPU 0: NVIDIA H200 (UUID: x)"])
    config = EngineConfig(model="smollm2")
    assert config.resolved_device() == "cpu"
    assert "CPU build" in launcher.device_warning(config)
    assert launcher.device_warning(EngineConfig(model="tiny")) is None  # always the CPU
    assert launcher.device_warning(EngineConfig(model="smollm2", device="cpu")) is None
    monkeypatch.setattr(launcher, "nvidia_gpus", lambda: [])
    assert launcher.device_warning(config) is None  # no GPU: nothing to say


def test_auto_device_is_cpu_for_the_tiny_model(monkeypatch):
    monkeypatch.setattr(launcher, "gpu_available", lambda: True)
    assert EngineConfig().resolved_device() == "cpu"
    assert EngineConfig(model="tiny").resolved_device() == "cpu"
    assert EngineConfig(model="smollm2").resolved_device() == "gpu"
    assert EngineConfig(model="/m").resolved_device() == "gpu"
    monkeypatch.setattr(launcher, "gpu_available", lambda: False)
    assert EngineConfig(model="/m").resolved_device() == "cpu"


def test_the_models_flags_come_before_the_users_so_the_user_wins(monkeypatch):
    monkeypatch.setattr(models, "cpu_computes_bfloat16", lambda: True)
    real = ModelSpec("/cache/smollm2", "SmolLM2-135M-Instruct", dtype="bfloat16")
    cmd = launcher.server_command(EngineConfig(extra_args=["--dtype", "float32"]), real, 1)
    assert flag(cmd, "--served-model-name") == "SmolLM2-135M-Instruct"
    assert cmd[-4:] == ["--dtype", "bfloat16", "--dtype", "float32"]  # vLLM takes the last
    assert "--load-format" not in cmd


def test_a_bfloat16_model_is_served_in_float32_on_a_cpu_without_bfloat16(monkeypatch):
    monkeypatch.setattr(models, "cpu_computes_bfloat16", lambda: False)
    real = ModelSpec("/cache/smollm2", "SmolLM2-135M-Instruct", dtype="bfloat16")
    cpu = launcher.server_command(EngineConfig(device="cpu"), real, 1)
    assert flag(cpu, "--dtype") == "float32"
    gpu = launcher.server_command(EngineConfig(model="/cache/smollm2", device="gpu"), real, 1)
    assert flag(gpu, "--dtype") == "bfloat16"


def test_environment_allowlists_both_plugins_and_keeps_user_plugins(monkeypatch):
    monkeypatch.setenv("VLLM_PLUGINS", "other,autellix_general")
    env = launcher.server_environment(EngineConfig(kv_cache_gib=2))
    assert env["VLLM_PLUGINS"] == "other,autellix_general,autellix_endpoint"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize(
    ("cores", "engines", "threads"), [(2, 1, 1), (2, 2, 1), (16, 1, 15), (16, 2, 7), (16, 32, 1)]
)
def test_cpu_engines_share_the_cores_less_one(monkeypatch, cores, engines, threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(launcher.os, "sched_getaffinity", lambda pid: set(range(cores)))
    env = launcher.server_environment(EngineConfig(engines_on_host=engines))
    assert env["OMP_NUM_THREADS"] == str(threads)


def test_the_users_omp_num_threads_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert launcher.server_environment(EngineConfig(engines_on_host=4))["OMP_NUM_THREADS"] == "6"


def test_unknown_scheduler_is_an_error():
    with pytest.raises(ValueError, match="unknown scheduler 'lifo' \\(choose from autellix, vllm"):
        launcher.server_command(EngineConfig(scheduler="lifo"), TINY, 1)


def test_vllm_is_stock_vllm_and_fcfs_another_name_for_it():
    stock = launcher.server_command(EngineConfig(scheduler="vllm"), TINY, 1)
    assert stock == launcher.server_command(EngineConfig(scheduler="fcfs"), TINY, 1)
    assert "--scheduler-cls" not in stock


@pytest.fixture
def clean_environment(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_policy_settings_reach_the_engine_as_autellix_variables(clean_environment):
    config = EngineConfig(policy="plas", beta=4.0, levels=Levels.parse("0,4,8"))
    env = launcher.server_environment(config)
    assert (env["AUTELLIX_POLICY"], env["AUTELLIX_BETA"], env["AUTELLIX_LEVELS"]) == (
        "plas", "4.0", "0,4,8",
    )  # fmt: skip
    settings = SchedulerSettings.from_env(env)
    assert settings.policy == "plas" and settings.config.beta == 4.0
    assert "AUTELLIX_POLICY" not in launcher.server_environment(EngineConfig())


def test_config_settings_win_over_extra_env_over_the_environment(clean_environment):
    clean_environment.setenv("AUTELLIX_BETA", "2")
    clean_environment.setenv("AUTELLIX_POLICY", "mlfq")
    extra_env = {"AUTELLIX_BETA": "3", "AUTELLIX_LEVELS": "0,9"}
    config = EngineConfig(policy="atlas", extra_env=extra_env)
    assert launcher.scheduler_environment(config) == {
        "AUTELLIX_POLICY": "atlas", "AUTELLIX_BETA": "3", "AUTELLIX_LEVELS": "0,9",
    }  # fmt: skip


def test_a_bad_inherited_variable_stops_the_launch_before_any_process(clean_environment):
    clean_environment.setenv("AUTELLIX_BETA", "-1")
    clean_environment.setattr(EngineProcess, "command", lambda self: ["true"])
    engine = EngineProcess(EngineConfig(port=0))
    with pytest.raises(SettingError, match="AUTELLIX_BETA='-1': must be positive"):
        engine.start()
    assert engine.process is None
    # Stock vLLM reads none of them.
    assert launcher.scheduler_environment(EngineConfig(scheduler="vllm")) == {"AUTELLIX_BETA": "-1"}


def test_policy_settings_need_the_autellix_scheduler():
    for setting in ({"policy": "plas"}, {"beta": 2.0}, {"levels": Levels()}):
        with pytest.raises(ValueError, match="tune the Autellix scheduler"):
            EngineConfig(scheduler="vllm", **setting)


def test_a_server_that_dies_raises_with_its_log_tail_and_leaves_nothing(monkeypatch, tmp_path):
    # A stand-in "server" that prints and exits: wait_healthy must notice, not hang.
    script = "import sys; print('boom: no such model'); sys.exit(3)"
    monkeypatch.setattr(EngineProcess, "command", lambda self: [sys.executable, "-c", script])
    engine = EngineProcess(EngineConfig(port=0, log_file=tmp_path / "server.log"))
    with pytest.raises(EngineStartError, match="exited with code 3") as info, engine:
        pass
    assert "boom: no such model" in str(info.value)
    assert "boom" in (tmp_path / "server.log").read_text()
    assert engine.process.returncode == 3


def test_stop_kills_the_whole_process_group(monkeypatch):
    # A "server" that spawns a grandchild and never becomes healthy.
    script = (
        "import subprocess, sys, time;"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
        "print('started', flush=True); time.sleep(600)"
    )
    monkeypatch.setattr(EngineProcess, "command", lambda self: [sys.executable, "-c", script])
    engine = EngineProcess(EngineConfig(port=0)).start()
    with pytest.raises(EngineStartError, match="not healthy"):
        engine.wait_healthy(timeout_s=2)
    pgid = engine.process.pid
    engine.stop(timeout_s=5)
    assert not group_members(pgid)  # from /proc: no live process of the group


def test_the_engine_key_goes_in_the_environment_never_on_the_command_line(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "inherited")
    monkeypatch.setenv("AUTELLIX_ENGINE_KEY", "inherited")
    config = EngineConfig(api_key="s3cret")
    env = launcher.server_environment(config)
    assert env["VLLM_API_KEY"] == env["AUTELLIX_ENGINE_KEY"] == "s3cret"
    command = launcher.server_command(config, TINY, 1)
    assert "s3cret" not in " ".join(command) and "--api-key" not in command
    assert "s3cret" not in repr(config)
    # No key configured: none inherited either, so the engine is what it was told to be.
    keyless = launcher.server_environment(EngineConfig())
    assert "VLLM_API_KEY" not in keyless and "AUTELLIX_ENGINE_KEY" not in keyless
    for bad in ("", " ", "a\nb"):
        with pytest.raises(ValueError, match="engine key"):
            EngineConfig(api_key=bad)


def test_tool_calling_takes_the_models_parser_a_named_one_or_none():
    def parser_flags(config, model=TINY):
        cmd = launcher.server_command(config, model, 1)
        return flag(cmd, "--tool-call-parser") if "--enable-auto-tool-choice" in cmd else None

    assert parser_flags(EngineConfig()) == "hermes"  # TINY's own
    assert parser_flags(EngineConfig(), PLAIN) is None  # no parser known: off
    assert parser_flags(EngineConfig(tool_call_parser="llama3_json"), PLAIN) == "llama3_json"
    assert parser_flags(EngineConfig(tool_call_parser=None)) is None
