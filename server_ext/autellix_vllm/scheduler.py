"""Old dotted path of the schedulers (``--scheduler-cls`` user configuration)."""

from autellix_vllm.engine.scheduler import AutellixAsyncScheduler, AutellixScheduler

__all__ = ["AutellixAsyncScheduler", "AutellixScheduler"]
