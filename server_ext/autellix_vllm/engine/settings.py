"""The Autellix scheduler's settings, and the ``AUTELLIX_*`` variables that carry them.

vLLM builds the scheduler itself, so the scheduler reads its settings from the
engine process's environment; ``autellix engine`` and ``autellix serve`` write
them from ``--policy``, ``--beta`` and ``--levels`` (through the launcher).
Both sides parse a value with the functions here: a value the command line
accepts is one the scheduler accepts, and a bad one, from a flag or from the
environment, is one error naming it before any process starts.

==============================  ==================================================
variable                        value (docs/engine.md has the defaults)
==============================  ==================================================
``AUTELLIX_POLICY``             a policy an engine can run (:data:`ENGINE_POLICY_NAMES`)
``AUTELLIX_BETA``               the anti-starvation ratio, > 0
``AUTELLIX_LEVELS``             level boundaries, e.g. ``0,128,512``
``AUTELLIX_SERVICE_UNIT``       ``tokens`` or ``time``
``AUTELLIX_IDLE_TTL_S``         seconds, > 0
``AUTELLIX_MAX_THREADS``        threads per program, an integer >= 1
``AUTELLIX_MAX_FORK_DEPTH``     fork depth per program, an integer >= 1
``AUTELLIX_MAX_LIVE_CALLS``     calls in flight per program, an integer >= 1
``AUTELLIX_MAX_PRIOR_SERVICE``  the largest prior service honoured, > 0
``AUTELLIX_ENGINE_KEY``         the engine key (:func:`engine_key`)
==============================  ==================================================

The five after ``AUTELLIX_SERVICE_UNIT`` are the engine's
:class:`~autellix_vllm.policy.config.TableBounds`: ``autellix serve`` writes
its router's own (:func:`settings_env`), so that a call its router accepts is
one the engine's table takes too.

An empty variable counts as unset. Importing this module imports nothing from vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar, cast

from autellix_vllm.policy import (
    DEFAULT_POLICY,
    POLICIES,
    Levels,
    PolicyConfig,
    ProgramLimits,
    ProgramScheduler,
    ServiceMeter,
    TableBounds,
    make_policy,
    policy_name,
)
from autellix_vllm.policy.config import ServiceUnit
from autellix_vllm.protocol.bearer import ENGINE_KEY_VARIABLE
from autellix_vllm.protocol.trust import engine_core_trusts
from autellix_vllm.registry import unknown

T = TypeVar("T")

POLICY = "AUTELLIX_POLICY"
BETA = "AUTELLIX_BETA"
LEVELS = "AUTELLIX_LEVELS"
SERVICE_UNIT = "AUTELLIX_SERVICE_UNIT"
IDLE_TTL_S = "AUTELLIX_IDLE_TTL_S"
MAX_THREADS = "AUTELLIX_MAX_THREADS"
MAX_FORK_DEPTH = "AUTELLIX_MAX_FORK_DEPTH"
MAX_LIVE_CALLS = "AUTELLIX_MAX_LIVE_CALLS"
MAX_PRIOR_SERVICE = "AUTELLIX_MAX_PRIOR_SERVICE"
VARIABLES = (
    POLICY,
    BETA,
    LEVELS,
    SERVICE_UNIT,
    IDLE_TTL_S,
    MAX_THREADS,
    MAX_FORK_DEPTH,
    MAX_LIVE_CALLS,
    MAX_PRIOR_SERVICE,
)

# Every core policy but the clairvoyant ones, which need each program's future.
ENGINE_POLICY_NAMES = tuple(name for name, policy in POLICIES.items() if not policy.clairvoyant)


class SettingError(ValueError):
    """A bad ``AUTELLIX_*`` value; the message names the variable."""


def engine_policy(name: str) -> str:
    """``name`` (its current name, if deprecated) if a real engine can run that
    policy, else a ValueError saying why."""
    name = policy_name(name)
    if name not in POLICIES:
        raise ValueError(unknown("policy", name, ENGINE_POLICY_NAMES))
    if POLICIES[name].clairvoyant:
        raise ValueError(
            f"{name} is a clairvoyant oracle (it needs every program's remaining work),"
            f" so only the simulator can run it (autellix simulate run --policy {name});"
            f" an engine runs {', '.join(ENGINE_POLICY_NAMES)}"
        )
    return name


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None
    if not value > 0:
        raise ValueError(f"must be positive, got {text}")
    return value


def finite_positive_number(text: str) -> float:
    value = positive_number(text)
    if not math.isfinite(value):
        raise ValueError(f"must be finite, got {text}")
    return value


def positive_integer(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"not an integer: {text!r}") from None
    if value < 1:
        raise ValueError(f"must be at least 1, got {text}")
    return value


def engine_key(environ: Mapping[str, str]) -> str | None:
    """The engine key (``AUTELLIX_ENGINE_KEY``), or None for an engine without one.

    With a key, the engine takes a call's prior service and answers its
    ``/autellix/v1/engine/*`` endpoints only for callers that send it as
    ``Authorization: Bearer <key>``. Without one (a development setup), identity
    still groups calls, but prior service from clients is ignored.
    """
    return environ.get(ENGINE_KEY_VARIABLE) or None


def service_meter(unit: str) -> ServiceMeter:
    """The default meter in ``unit`` (``tokens`` or ``time``; ServiceMeter checks it)."""
    return ServiceMeter(unit=cast(ServiceUnit, unit))


@dataclass(frozen=True)
class SchedulerSettings:
    """A core policy by name and its parameters: what one engine's scheduler runs."""

    policy: str = DEFAULT_POLICY
    config: PolicyConfig = field(default_factory=PolicyConfig)
    # Honour what only the router states (the prior service and owner calls
    # carry): protocol.trust's rule for the callers that reach the scheduler.
    trusts_router_fields: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SchedulerSettings:
        """Settings from the ``AUTELLIX_*`` variables (unset ones keep their defaults);
        :class:`SettingError` names the first bad one."""

        def read(name: str, parse: Callable[[str], T], default: T) -> T:
            text = environ.get(name, "")
            if not text:
                return default
            try:
                return parse(text)
            except ValueError as exc:
                raise SettingError(f"{name}={text!r}: {exc}") from None

        defaults = PolicyConfig()
        limits = defaults.table.limits
        table = TableBounds(
            idle_ttl_s=read(IDLE_TTL_S, positive_number, defaults.table.idle_ttl_s),
            limits=ProgramLimits(
                max_threads=read(MAX_THREADS, positive_integer, limits.max_threads),
                max_fork_depth=read(MAX_FORK_DEPTH, positive_integer, limits.max_fork_depth),
                max_live_calls=read(MAX_LIVE_CALLS, positive_integer, limits.max_live_calls),
                max_prior_service=read(
                    MAX_PRIOR_SERVICE, finite_positive_number, limits.max_prior_service
                ),
            ),
        )
        config = PolicyConfig(
            levels=read(LEVELS, Levels.parse, defaults.levels),
            meter=read(SERVICE_UNIT, service_meter, defaults.meter),
            beta=read(BETA, positive_number, defaults.beta),
            atlas_variant=defaults.atlas_variant,
            table=table,
        )
        policy = read(POLICY, engine_policy, DEFAULT_POLICY)
        return cls(policy, config, trusts_router_fields=engine_core_trusts(engine_key(environ)))

    def core(self, seats: int | None = None) -> ProgramScheduler:
        """The policy core for an engine of ``seats`` sequences."""
        policy = make_policy(self.policy, self.config.atlas_variant)
        return ProgramScheduler(policy, self.config, seats=seats)


def settings_env(
    policy: str | None = None,
    beta: float | None = None,
    levels: Levels | None = None,
    table: TableBounds | None = None,
) -> dict[str, str]:
    """The variables that give an engine these settings (``table``: its idle TTL
    and program limits); ``None`` sets nothing. The one writer of what
    :meth:`SchedulerSettings.from_env` reads."""
    values: dict[str, object] = {POLICY: policy, BETA: beta, LEVELS: levels}
    if table is not None:
        values.update(
            {
                IDLE_TTL_S: table.idle_ttl_s,
                MAX_THREADS: table.limits.max_threads,
                MAX_FORK_DEPTH: table.limits.max_fork_depth,
                MAX_LIVE_CALLS: table.limits.max_live_calls,
                MAX_PRIOR_SERVICE: repr(table.limits.max_prior_service),
            }
        )
    return {name: str(value) for name, value in values.items() if value is not None}
