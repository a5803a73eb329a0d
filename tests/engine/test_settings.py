"""The Autellix scheduler's settings from ``AUTELLIX_*`` variables (no vLLM needed)."""

import pytest
from autellix_vllm.engine.settings import (
    ENGINE_POLICY_NAMES,
    SchedulerSettings,
    SettingError,
    engine_key,
    engine_policy,
    settings_env,
)
from autellix_vllm.policy import Levels, PolicyConfig, ProgramLimits, TableBounds


def test_unset_and_empty_variables_keep_the_defaults():
    for environ in ({}, {"AUTELLIX_POLICY": "", "AUTELLIX_BETA": "", "AUTELLIX_LEVELS": ""}):
        assert SchedulerSettings.from_env(environ) == SchedulerSettings("autellix", PolicyConfig())


def test_every_variable_is_read():
    settings = SchedulerSettings.from_env(
        {
            "AUTELLIX_POLICY": "plas",
            "AUTELLIX_BETA": "2.5",
            "AUTELLIX_LEVELS": "0,4,8",
            "AUTELLIX_SERVICE_UNIT": "time",
            "AUTELLIX_IDLE_TTL_S": "30",
            "AUTELLIX_MAX_THREADS": "100",
            "AUTELLIX_MAX_FORK_DEPTH": "8",
            "AUTELLIX_MAX_LIVE_CALLS": "50",
            "AUTELLIX_ENGINE_KEY": "k",
        }
    )
    assert settings.policy == "plas"
    config = settings.config
    assert (config.beta, config.levels.boundaries) == (2.5, (0.0, 4.0, 8.0))
    assert (config.meter.unit, config.table.idle_ttl_s) == ("time", 30.0)
    limits = ProgramLimits(max_threads=100, max_fork_depth=8, max_live_calls=50)
    assert config.table.limits == limits
    assert settings.trusts_router_fields
    core = settings.core(seats=4)
    assert core.policy.name == "plas" and core.config == config


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("AUTELLIX_POLICY", "lottery", "unknown policy 'lottery' (choose from fcfs, mlfq, plas"),
        ("AUTELLIX_POLICY", "srpt", "clairvoyant oracle"),
        ("AUTELLIX_BETA", "fast", "not a number"),
        ("AUTELLIX_BETA", "0", "must be positive"),
        ("AUTELLIX_BETA", "nan", "must be positive"),
        ("AUTELLIX_LEVELS", "4,8", "must start at 0"),
        ("AUTELLIX_LEVELS", "0;4", "comma-separated numbers"),
        ("AUTELLIX_SERVICE_UNIT", "seconds", "unknown service unit"),
        ("AUTELLIX_IDLE_TTL_S", "-1", "must be positive"),
        ("AUTELLIX_MAX_THREADS", "0", "must be at least 1"),
        ("AUTELLIX_MAX_FORK_DEPTH", "2.5", "not an integer"),
        ("AUTELLIX_MAX_LIVE_CALLS", "lots", "not an integer"),
    ],
)
def test_a_bad_value_is_one_error_naming_the_variable(variable, value, problem):
    with pytest.raises(SettingError) as error:
        SchedulerSettings.from_env({variable: value})
    assert str(error.value).startswith(f"{variable}={value!r}: ")
    assert problem in str(error.value)


def test_an_engine_runs_every_policy_but_the_oracle():
    assert ENGINE_POLICY_NAMES == (
        "fcfs", "mlfq", "plas", "atlas", "plas-atlas", "autellix",
        "continuum", "thunderagent", "mori", "lru-priority",
    )  # fmt: skip
    assert all(engine_policy(name) == name for name in ENGINE_POLICY_NAMES)
    with pytest.raises(ValueError, match="only the simulator can run it"):
        engine_policy("srpt")


def test_settings_env_writes_what_from_env_reads():
    variables = settings_env("atlas", 1e12, Levels.parse("0,16,64"))
    assert variables == {
        "AUTELLIX_POLICY": "atlas",
        "AUTELLIX_BETA": "1000000000000.0",
        "AUTELLIX_LEVELS": "0,16,64",
    }
    settings = SchedulerSettings.from_env(variables)
    assert (settings.policy, settings.config.beta) == ("atlas", 1e12)
    assert settings.config.levels == Levels.parse("0,16,64")
    assert settings_env() == {}


def test_settings_env_carries_the_table_bounds_an_engine_keeps():
    limits = ProgramLimits(max_threads=10, max_fork_depth=2, max_live_calls=3,
                           max_prior_service=5e6)  # fmt: skip
    table = TableBounds(idle_ttl_s=42.5, limits=limits, max_programs=7)
    settings = SchedulerSettings.from_env(settings_env(table=table))
    # The counts of programs are the router's: an engine keeps the idle TTL and limits.
    assert settings.config.table == TableBounds(idle_ttl_s=42.5, limits=limits)


def test_a_prior_service_bound_must_be_a_finite_positive_number():
    for bad in ("inf", "0", "-1", "lots"):
        with pytest.raises(SettingError, match="AUTELLIX_MAX_PRIOR_SERVICE"):
            SchedulerSettings.from_env({"AUTELLIX_MAX_PRIOR_SERVICE": bad})


def test_only_an_engine_with_a_key_trusts_prior_service():
    assert engine_key({}) is None and engine_key({"AUTELLIX_ENGINE_KEY": ""}) is None
    assert engine_key({"AUTELLIX_ENGINE_KEY": "k"}) == "k"
    assert not SchedulerSettings.from_env({}).trusts_router_fields
    assert SchedulerSettings.from_env({"AUTELLIX_ENGINE_KEY": "k"}).trusts_router_fields
