"""The shell commands in the code blocks of README.md and docs/*.md, for the tests
that check them against the code (``test_doc_commands.py``: serve and engine
commands planned on a GPU host; ``test_docs_run.py``: every command)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Code blocks in these languages hold code or data, not shell commands.
NOT_SHELL = {"python", "json", "text"}
# A line that runs a program (after a "$ " prompt and VAR=value words): autellix
# and a subcommand ("autellix serve: ..." is output), python, make, a program
# of the virtual environment, or one of a few shell tools.
COMMAND = re.compile(
    r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"
    r"(?:autellix(?:\s+(?:[a-z][a-z-]*|--help)(?:\s|$)|$)|python3?\s|make(?:\s|$)|\.venv/bin/\S+"
    r"|(?:cat|rm|du|curl|pip)\s)"
    r"|^[A-Z_][A-Z0-9_]*=\$\("
)
HEREDOC = re.compile(r"<<-?\s*'?([A-Za-z_]+)'?")


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    command: str  # as written, continuation lines joined, without a "$ " prompt
    heredoc: str | None = None  # the lines of a here-document it reads, with the end word

    @property
    def script(self) -> str:
        """What a shell runs."""
        return self.command if self.heredoc is None else f"{self.command}\n{self.heredoc}"


def doc_commands() -> list[DocCommand]:
    """Every command in a shell code block of the docs, in the files' order."""
    found = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        in_block = shell = False
        index = 0
        while index < len(lines):
            stripped = lines[index].strip()
            index += 1
            if stripped.startswith("```"):
                in_block = not in_block
                shell = in_block and stripped[3:].strip() not in NOT_SHELL
                continue
            if not shell:
                continue
            start = index
            while stripped.endswith("\\") and index < len(lines):
                stripped = stripped[:-1].rstrip() + " " + lines[index].strip()
                index += 1
            command = stripped.removeprefix("$ ")
            if not COMMAND.match(command):
                continue
            heredoc = None
            if match := HEREDOC.search(command):
                end = lines.index(match.group(1), index)
                heredoc = "\n".join(lines[index : end + 1])
                index = end + 1
            found.append(DocCommand(f"{path.relative_to(ROOT)}:{start}", command, heredoc))
    return found


def argv_of(command: str) -> list[str]:
    """The arguments after the program's name: comments, ``&`` and what follows a
    pipe, a redirection or another command dropped."""
    words = shlex.split(command, comments=True)
    for stop in ("&", "|", ">", "&&", ";"):
        if stop in words:
            words = words[: words.index(stop)]
    return words[1:]
