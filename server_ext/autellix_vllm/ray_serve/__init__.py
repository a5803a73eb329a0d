"""Autellix on Ray Serve: engines as replicas, a program-aware request router, one table.

The same serving model as ``autellix serve`` (``router/``), spread over a Ray
cluster so that it outlives one machine:

* ``EngineReplica`` (``engine_replica``): one Serve replica per engine, each
  supervising an ``autellix engine`` process (vLLM 0.32 with the Autellix
  scheduler and identity middleware); Serve restarts a replica that dies.
* ``ProgramAwareRouter`` (``request_router``): Ray Serve's request-router
  extension, ranking engine replicas with the project's balancers
  (``policy.routing``; the paper's locality rule by default) via ``placement``.
* ``ProgramDirectory`` (``directory``): the global process table
  (``router.programs.ProgramTable``, unchanged) in one Serve replica, which
  every ingress replica asks once per call; call outcomes travel in batches.
* ``Ingress`` (``ingress``): the OpenAI-compatible HTTP front with the session
  API, keys and the router's error bodies.
* ``app``: the Serve application and its config (``serve deploy``-able).

Only ``_ray_adapter`` imports Ray; ``placement``, ``directory`` and
``messages`` are plain Python (unit-tested without Ray). Nothing outside this
package imports it, and Ray is an optional extra (``pip install autellix[ray]``).
"""
