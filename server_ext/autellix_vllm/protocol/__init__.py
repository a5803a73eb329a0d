"""The wire contract between the SDK, the router and the engines.

What travels on the wire, one module per subject, pure functions, no web
framework:

* :mod:`~autellix_vllm.protocol.identity`: a call's identity
  (:class:`~autellix_vllm.protocol.identity.CallIdentity`), the headers and
  ``vllm_xargs`` keys it travels in, and the one reader every hop uses;
* :mod:`~autellix_vllm.protocol.paths`: the API paths of the router and the engines;
* :mod:`~autellix_vllm.protocol.openai_errors`: the error body, OpenAI's shape,
  from the router and the engines alike;
* :mod:`~autellix_vllm.protocol.bearer`: the engine key and how a bearer key is checked;
* :mod:`~autellix_vllm.protocol.trust`: which identity fields only the router
  states, and the one rule of who may state them.

The SDK (``autellix``) keeps its own copies of the header names and paths,
since it must work without this package; ``tests/test_protocol.py`` checks
that they match.
"""
