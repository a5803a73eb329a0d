"""Every benchmark, in one place: the engine extension (``replay``: a workload
replayed on real engines; ``overhead``: the scheduler's per-step cost), the
router, the client SDK (``autellix bench ...``) and the policy core alone
(``policy_core``, ``autellix simulate bench-policy``)."""

# How the engine benchmark's calls name their program (bench.replay): the SDK's
# headers, or none, the router deriving the program. Here, so that the CLI can
# list them without importing the benchmark.
IDENTITIES = ("sent", "derived")
