"""The general vLLM plugin (``vllm.general_plugins`` entry point ``autellix_general``).

vLLM loads general plugins in every process (API server, engine core, workers),
so :func:`register` must be idempotent (importing vLLM's scheduler modules is
the only cost, and every vLLM process has them loaded anyway). It adds two utility methods
to ``EngineCore``; the endpoint plugin reaches them from the API server with
``call_utility_async``, and they run in the engine process between steps, where
the scheduler and its process table live:

* ``autellix_table(program_ids=None)``: the scheduler's table snapshot, as
  plain data (msgpack-able dicts, lists, strings and numbers); with
  ``program_ids``, only those programs' rows (``[]``: a summary, no rows).
* ``autellix_end_program(program_id)``: end a program; False if unknown.

Both answer sensibly when the engine runs stock vLLM's scheduler (the FCFS
baseline): the table says ``"enabled": false`` and nothing can be ended.
"""

from __future__ import annotations

from typing import Any

from autellix_vllm.engine import _vllm_adapter as adapter

TABLE_METHOD = "autellix_table"
END_PROGRAM_METHOD = "autellix_end_program"


def register() -> None:
    adapter.install_engine_core_method(TABLE_METHOD, engine_table)
    adapter.install_engine_core_method(END_PROGRAM_METHOD, engine_end_program)


def engine_table(engine_core: Any, program_ids: list[str] | None = None) -> dict[str, Any]:
    scheduler = adapter.engine_core_scheduler(engine_core)
    snapshot = getattr(scheduler, "autellix_snapshot", None)
    if snapshot is None:
        return {"enabled": False, "scheduler": type(scheduler).__name__}
    return snapshot(program_ids)


def engine_end_program(engine_core: Any, program_id: str) -> bool:
    end_program = getattr(adapter.engine_core_scheduler(engine_core), "autellix_end_program", None)
    return bool(end_program is not None and end_program(program_id))
