"""Old dotted path of the engine launcher (documented Python API)."""

from autellix_vllm.engine.launcher import EngineConfig, EngineProcess, EngineStartError

__all__ = ["EngineConfig", "EngineProcess", "EngineStartError"]
