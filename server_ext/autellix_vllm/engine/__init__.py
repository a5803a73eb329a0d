"""The vLLM engine extension: the only modules of autellix that import vLLM.

A call meets them in this order: ``middleware`` (identity headers into the
body's ``vllm_xargs``), ``scheduler`` (vLLM's scheduler, ordered by the policy
core; ``block_holds`` keeps a KV-aware policy's held blocks), ``general_plugin``
and ``endpoint_plugin`` (the engine's process table and metrics over HTTP).
Every vLLM internal they touch is in ``_vllm_adapter``. ``launcher`` starts and
stops engine processes, with the scheduler's ``settings`` (the ``AUTELLIX_*``
variables); ``tiny_model`` is the embedded test model; ``model_free`` builds
model-free schedulers for the scheduler benchmark and the tests.

Importing this package imports nothing from vLLM.
"""
