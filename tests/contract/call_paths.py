"""What the contract tests know of a path (``CallPath``) and the keys and limits
every path runs with; the paths themselves are ``conftest.py``'s fixtures."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from autellix_vllm.policy.config import ProgramLimits

ENGINE_KEY = "contract-engine-" + uuid.uuid4().hex
ALICE_KEY = "sk-alice-" + uuid.uuid4().hex
BOB_KEY = "sk-bob-" + uuid.uuid4().hex
LIMITS = ProgramLimits(max_threads=3)
"""Every path's program limits (small, so that a test passes one in four calls)."""


def bearer(key: str) -> str:
    return f"Bearer {key}"


@dataclass
class CallPath:
    """Where a client sends its calls, and what this path is.

    ``alice``, ``bob``: the ``Authorization`` of two callers (on a router two
    client keys; on an engine its key and a wrong one). ``engines``: the base
    URLs of the engines behind it, read with :data:`ENGINE_KEY`.
    """

    name: str
    url: str
    model: str
    alice: str
    bob: str
    engines: list[str]
    router: bool
    """A router in front: client keys own programs, calls that name none get a
    derived one, a call past a program limit is refused (an engine alone runs it
    as an anonymous call)."""

    @property
    def programs_url(self) -> str:
        """Where a caller lists the programs it may see."""
        return self.url + ("/autellix/v1/programs" if self.router else "/autellix/v1/engine/table")

    def end_url(self, program_id: str) -> str:
        """Where a caller ends a program."""
        if self.router:
            return f"{self.url}/autellix/v1/programs/{program_id}"
        return f"{self.url}/autellix/v1/engine/programs/{program_id}"

    @property
    def stranger_refusal(self) -> tuple[int, str]:
        """What bob gets for alice's program: on a router, as for an id never seen;
        on an engine, whose one key bob lacks, the key's refusal."""
        return (404, "program_not_found") if self.router else (401, "invalid_api_key")
