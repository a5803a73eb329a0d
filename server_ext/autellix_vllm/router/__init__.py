"""The Autellix router: one OpenAI-compatible endpoint in front of N engines.

It is the paper's frontend and load balancer (Autellix §3, Algorithm 2):
programs open and end sessions here, every call is routed by the locality rule
(or a baseline) to one of the engines, and a program's service is summed over
all engines and handed to the next engine it uses.

Modules, in the order a call meets them: ``app`` (application factory and
runner), ``middlewares`` (errors, API key), ``routes`` (handlers), ``calls``
(reading a call), ``dispatch`` (choosing an engine, retries, relaying),
``usage`` (service from token usage, stream relay), ``programs`` (the global
process table), ``engines`` (health and load), ``metrics``, ``config``,
``errors``, ``state``; and ``admin_client``, which reads the table over HTTP
(``autellix ps``, ``top``, the router benchmark).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autellix_vllm.router.config import RouterConfig

if TYPE_CHECKING:
    from autellix_vllm.router.app import create_app, serve_router

__all__ = ["RouterConfig", "create_app", "serve_router"]

# Loaded on first use: the plain modules (calls, params, errors, admission ...),
# which the Ray ingress reads too, then import without aiohttp.
_IN_APP = {"create_app", "serve_router"}


def __getattr__(name: str) -> Any:
    if name in _IN_APP:
        return getattr(importlib.import_module("autellix_vllm.router.app"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
