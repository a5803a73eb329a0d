"""Old dotted path of the workload generators; they live in :mod:`autellix_vllm.workloads`."""

from autellix_vllm.workloads import MAX_CONTEXT, WORKLOADS, at_rate, generate

__all__ = ["MAX_CONTEXT", "WORKLOADS", "at_rate", "generate"]
