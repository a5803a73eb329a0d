"""The framework tests run each example's agent, in the real framework, against
the project's router (in process) in front of a recording engine
(``recording_engine.py``). The examples and the router tests' HTTP helpers go
on ``sys.path`` so that the tests import them by module name."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for folder in (TESTS.parent / "examples", TESTS / "router"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
