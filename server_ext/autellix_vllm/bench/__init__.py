"""Every benchmark, in one place: the engine extension (``replay``: a workload
replayed on real engines; ``overhead``: the scheduler's per-step cost), the
router, the client SDK (``autellix bench ...``) and the policy core alone
(``policy_core``, ``autellix simulate bench-policy``)."""
