"""The vLLM engine extension: the only modules of autellix that import vLLM.

A call meets them in this order: ``middleware`` (identity headers into the
body's ``vllm_xargs``), ``scheduler`` (vLLM's scheduler, ordered by the policy
core), ``general_plugin`` and ``endpoint_plugin`` (the engine's process table
and metrics over HTTP). Every vLLM internal they touch is in ``_vllm_adapter``.
``launcher`` starts and stops engine processes, with the scheduler's
``settings`` (the ``AUTELLIX_*`` variables); ``tiny_model`` is the embedded
test model; ``testing`` builds model-free schedulers for tests and benchmarks.

Importing this package imports nothing from vLLM.
"""
