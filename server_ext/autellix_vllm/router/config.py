"""Everything that parameterises the router; filled from `autellix serve` flags."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from autellix_vllm.policy.config import DEFAULT_BOUNDS, TableBounds
from autellix_vllm.policy.flow_control import FlowControlConfig
from autellix_vllm.policy.routing import DEFAULT_LOCALITY_THRESHOLD, make_balancer
from autellix_vllm.router.keys import KeyRing, check_key, load_api_keys

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class RouterConfig:
    """How the router runs. ``upstreams`` are engine base URLs (no ``/v1``).

    Keys (``api_key``, ``api_keys_file``, ``admin_key``: see ``router.keys``)
    are checked, and the keys file read, when the config is made, so a bad one
    fails before anything starts. Keys are left out of the config's repr.
    """

    upstreams: tuple[str, ...]
    balancer: str = "locality"
    # Paper Algorithm 2: calls with more prompt tokens than this stick to their
    # program's engine. Prompt tokens are estimated as characters / chars_per_token
    # (token-id prompts are counted exactly); see calls.estimate_prompt_tokens.
    locality_threshold: int = DEFAULT_LOCALITY_THRESHOLD
    chars_per_token: float = 4.0
    # Client keys: one key, and/or a keys file (one key per line, "name: key").
    api_key: str | None = field(default=None, repr=False)
    api_keys_file: str | None = None
    # Sees and ends every program; a client key sees only the programs it opened.
    admin_key: str | None = field(default=None, repr=False)
    # Sent to every engine as "Authorization: Bearer <engine_key>" (engines started
    # by `autellix serve` take scheduling fields only from a holder of their key).
    engine_key: str | None = field(default=None, repr=False)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Engines are probed (GET /health, /v1/models and their table) this often.
    health_interval_s: float = 1.0
    health_timeout_s: float = 5.0
    # Failed probes in a row (timeouts, 5xx) that take an engine out of rotation;
    # a refused connection does it at once.
    health_failures: int = 3
    # Tries of one call, each on a different engine, when an engine cannot be
    # reached or drops the call before answering.
    max_attempts: int = 3
    connect_timeout_s: float = 5.0
    # Name programs for calls that name none, from what such clients send
    # (router.derived): session headers, prompt_cache_key and the like, and with
    # prefix_programs, calls that extend an earlier call's messages.
    derived_programs: bool = True
    prefix_programs: bool = True
    # A derived program with nothing in flight for this long is ended (its client
    # never ends it); less than table.idle_ttl_s, which drops (not ends) any program.
    derived_idle_end_s: float = 300.0
    # The table's bounds: programs in all and per key, ended ids kept, the idle
    # TTL, and how large one program may grow (autellix serve gives its engines
    # the same idle TTL and program limits).
    table: TableBounds = DEFAULT_BOUNDS
    # Idle pooled connections to an engine are closed after this long: less than
    # the engines' own keep-alive (uvicorn: 5 s), so the router never reuses a
    # connection the engine is closing.
    engine_keepalive_s: float = 3.0
    # Calls of worse bands wait at the router while the pool is saturated for
    # them (policy.flow_control; ``autellix serve --flow-control``); None, the
    # default: every call goes to an engine at once and queues there.
    flow_control: FlowControlConfig | None = None
    # The keys above, by key (made from them; not a parameter).
    keys: KeyRing = field(init=False, repr=False, compare=False)
    # Allow engines on other hosts even with an API key (they are not protected by it).
    allow_remote_upstreams: bool = False

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ValueError("the router needs at least one upstream engine")
        object.__setattr__(self, "upstreams", tuple(u.rstrip("/") for u in self.upstreams))
        for url in self.upstreams:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"upstream {url!r} is not an http(s) URL")
            if parts.path not in ("", "/"):
                raise ValueError(f"upstream {url!r}: give the engine's root URL, without a path")
        if len(set(self.upstreams)) != len(self.upstreams):
            raise ValueError("the same upstream is listed twice")
        object.__setattr__(self, "keys", self._key_ring())
        if self.keys.required and not self.allow_remote_upstreams:
            remote = [u for u in self.upstreams if not is_loopback(urlsplit(u).hostname or "")]
            if remote:
                raise ValueError(
                    "with API keys, engines must be on loopback (the router's requests to"
                    f" them are not encrypted): {remote[0]}"
                )
        make_balancer(self.balancer, self.locality_threshold)
        positive = {
            "chars_per_token": self.chars_per_token,
            "max_body_bytes": self.max_body_bytes,
            "health_interval_s": self.health_interval_s,
            "health_timeout_s": self.health_timeout_s,
            "health_failures": self.health_failures,
            "max_attempts": self.max_attempts,
            "connect_timeout_s": self.connect_timeout_s,
            "derived_idle_end_s": self.derived_idle_end_s,
            "engine_keepalive_s": self.engine_keepalive_s,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")

    def _key_ring(self) -> KeyRing:
        for what, key in (
            ("the API key", self.api_key),
            ("the admin key", self.admin_key),
            ("the engine key", self.engine_key),
        ):
            if key is not None:
                check_key(key, what)
        named = load_api_keys(self.api_keys_file) if self.api_keys_file is not None else None
        return KeyRing.build(self.api_key, named, self.admin_key)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
