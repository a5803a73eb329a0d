"""Server side of autellix: the scheduling policy core, the vLLM engine extension,
the router and the simulator.

The scheduling math lives only in :mod:`autellix_vllm.policy`; everything else
adapts it to a place where calls are run (a vLLM engine, the simulator) or routed.
"""

__version__ = "0.1.0"
