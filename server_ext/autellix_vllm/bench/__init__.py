"""Benchmarks of the engine extension, the router and the client SDK (``autellix bench ...``)."""
