"""Benchmarks of the engine extension (``autellix bench ...``)."""
