"""Everything that parameterises the router; filled from `autellix serve` flags."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from autellix_vllm.policy.routing import BALANCERS, DEFAULT_LOCALITY_THRESHOLD
from autellix_vllm.registry import lookup

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class RouterConfig:
    """How the router runs. ``upstreams`` are engine base URLs (no ``/v1``)."""

    upstreams: tuple[str, ...]
    balancer: str = "locality"
    # Paper Algorithm 2: calls with more prompt tokens than this stick to their
    # program's engine. Prompt tokens are estimated as characters / chars_per_token
    # (token-id prompts are counted exactly); see calls.estimate_prompt_tokens.
    locality_threshold: int = DEFAULT_LOCALITY_THRESHOLD
    chars_per_token: float = 4.0
    api_key: str | None = None
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
    # Ended program ids remembered (so that late calls get 404), oldest forgotten first.
    ended_ids_kept: int = 100_000
    # Programs with nothing in flight are dropped from the table after this long idle.
    idle_ttl_s: float = 600.0
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
        if self.api_key is not None and not self.allow_remote_upstreams:
            remote = [u for u in self.upstreams if not is_loopback(urlsplit(u).hostname or "")]
            if remote:
                raise ValueError(
                    f"with an API key, engines must be on loopback (they have no key): {remote[0]}"
                )
        lookup(BALANCERS, self.balancer, "load balancer")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key must not be empty")
        positive = {
            "locality_threshold": self.locality_threshold,
            "chars_per_token": self.chars_per_token,
            "max_body_bytes": self.max_body_bytes,
            "health_interval_s": self.health_interval_s,
            "health_timeout_s": self.health_timeout_s,
            "health_failures": self.health_failures,
            "max_attempts": self.max_attempts,
            "connect_timeout_s": self.connect_timeout_s,
            "ended_ids_kept": self.ended_ids_kept,
            "idle_ttl_s": self.idle_ttl_s,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
