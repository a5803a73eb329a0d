"""Which extra of the ``autellix`` package installs a module a command needs.

The client SDK installs with ``openai`` and ``tenacity`` only; the router, the
engines and the simulator's progress bars and plots come with extras
(``pyproject.toml``). A command that imports a module its extra did not bring
ends with one line that names the extra to install, not a traceback.
"""

from __future__ import annotations

EXTRA_OF_MODULE: dict[str, str] = {
    "aiohttp": "router",
    "prometheus_client": "router",
    "tqdm": "sim",
    "matplotlib": "sim",
    "vllm": "cpu",
    "gguf": "cpu",
    "numpy": "cpu",
}
"""Top-level import name -> the extra that installs it (``gpu`` serves for ``cpu``
on a GPU host)."""


def missing_extra(error: ModuleNotFoundError) -> str | None:
    """What to install for ``error``'s module; None if no extra brings it."""
    module = (error.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(module)
    if extra is None:
        return None
    if extra == "cpu":
        return f"needs {module}: pip install 'autellix[cpu]' ('autellix[gpu]' on a GPU host)"
    return f"needs {module}: pip install 'autellix[{extra}]'"
