"""Who is calling: the router's client keys, the admin key, and the owner each key stands for.

Programs belong to the key that opened them (see ``programs``). A key is
never stored in a record, a log line or a listing: its owner is a short hash of
it, and its name (from the keys file) is what listings show.

Keys come from three places, all optional:

* ``api_key``: one client key (``autellix serve --api-key``), named ``default``;
* ``api_keys_file``: one client key per line; a line starting with ``#`` is a
  comment; a line
  ``name: key`` names its key (the name is split off at the first ``:``, so a
  key that contains ``:`` needs a name), a bare ``key`` is named after its hash;
* ``admin_key``: sees and ends every program.

With none of them, every caller is :data:`ANONYMOUS`, one owner for all
(development on loopback).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from autellix_vllm.protocol.identity import ANONYMOUS_OWNER

MAX_KEY_NAME_LENGTH = 64


@dataclass(frozen=True)
class Client:
    """The caller behind one key."""

    owner: str  # stable and not secret: a hash of the key, or "anonymous"
    name: str  # what listings show
    admin: bool = False

    def may_see(self, owner: str) -> bool:
        """Whether this caller may list, end and call a program ``owner`` opened."""
        return self.admin or owner == self.owner


ANONYMOUS = Client(owner=ANONYMOUS_OWNER, name="anonymous")
"""Every caller when the router has no key."""


def owner_of(key: str) -> str:
    """The owner a key stands for: the first 16 hex digits of its SHA-256."""
    return "key-" + _digest(key).hex()[:16]


class KeyRing:
    """The keys the router accepts and the client each one is."""

    def __init__(self, clients: Mapping[str, Client]) -> None:
        # By the key's SHA-256: looking one up reveals nothing about the keys held.
        self._by_digest = {_digest(key): client for key, client in clients.items()}

    @classmethod
    def build(
        cls,
        api_key: str | None = None,
        named_keys: Mapping[str, str] | None = None,
        admin_key: str | None = None,
    ) -> KeyRing:
        """``named_keys`` maps key -> name (from :func:`load_api_keys`)."""
        clients: dict[str, Client] = {}
        if api_key is not None:
            clients[api_key] = Client(owner_of(api_key), "default")
        for key, name in (named_keys or {}).items():
            clients[key] = Client(owner_of(key), name)
        if admin_key is not None:
            if admin_key in clients:
                raise ValueError("the admin key must differ from every client key")
            clients[admin_key] = Client(owner_of(admin_key), "admin", admin=True)
        return cls(clients)

    @property
    def required(self) -> bool:
        """Whether callers must send a key (False: everyone is :data:`ANONYMOUS`)."""
        return bool(self._by_digest)

    def __len__(self) -> int:
        return len(self._by_digest)

    def client_for(self, authorization: str | None) -> Client | None:
        """The client an ``Authorization`` header names; None for a missing or unknown key."""
        if not self.required:
            return ANONYMOUS
        scheme, _, key = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self._by_digest.get(_digest(key.strip()))


def check_key(key: str, what: str) -> None:
    """A key must be non-empty, printable and without whitespace (it travels in a header)."""
    if not key:
        raise ValueError(f"{what} must not be empty")
    if any(ch.isspace() or not ch.isprintable() for ch in key):
        raise ValueError(f"{what} must not contain spaces or control characters")


def load_api_keys(path: str | Path) -> dict[str, str]:
    """The keys in a keys file: key -> name. Errors name the file and line, never a key."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"API keys file {path}: cannot read it: {error}") from None
    return parse_api_keys(text.splitlines(), str(path))


def parse_api_keys(lines: Iterable[str], source: str) -> dict[str, str]:
    keys: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        where = f"API keys file {source}, line {number}"
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, separator, key = line.partition(":")
        if separator:
            name, key = name.strip(), key.strip()
            if not name or len(name) > MAX_KEY_NAME_LENGTH or not name.isprintable():
                raise ValueError(
                    f"{where}: a name must be 1 to {MAX_KEY_NAME_LENGTH} printable characters"
                )
        else:
            name, key = "", name
        check_key(key, f"{where}: the key")
        if key in first_line:
            raise ValueError(f"{where}: the same key is on line {first_line[key]}")
        first_line[key] = number
        keys[key] = name or owner_of(key)
    if not keys:
        raise ValueError(f"API keys file {source}: no keys in it")
    return keys


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
