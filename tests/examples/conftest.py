"""The examples are scripts in ``examples/``, not a package: their folder goes on
``sys.path`` so that the tests import their modules as the scripts do."""

from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
