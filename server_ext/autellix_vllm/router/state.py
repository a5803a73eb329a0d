"""What the router's handlers share, kept on the aiohttp application."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from aiohttp import web

from autellix_vllm.router.config import RouterConfig
from autellix_vllm.router.dispatch import Dispatcher
from autellix_vllm.router.engines import EnginePool
from autellix_vllm.router.metrics import RouterMetrics
from autellix_vllm.router.programs import ProgramTable


@dataclass
class RouterState:
    config: RouterConfig
    session: aiohttp.ClientSession
    metrics: RouterMetrics
    programs: ProgramTable
    pool: EnginePool
    dispatcher: Dispatcher


STATE = web.AppKey("autellix_router", RouterState)
