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
  after the key, ``class=C`` gives the key's priority class (its calls' band
  unless they ask for another) and ``max-class=C`` the best class its calls may
  ask for (default: its class), each ``interactive``, ``batch`` or a band's
  number (:func:`~autellix_vllm.protocol.identity.validate_priority`), and
  ``weight=W`` the key's weight, a positive number (default 1): inside a band,
  the keys' shares of the engines' service are proportional to their weights.
  E.g. ``nightly: sk-... class=batch weight=2``;
* ``admin_key``: sees and ends every program.

With none of them, every caller is :data:`ANONYMOUS`, one owner for all
(development on loopback).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from autellix_vllm.protocol.identity import (
    ANONYMOUS_OWNER,
    IdentityError,
    validate_priority,
    validate_weight,
)

MAX_KEY_NAME_LENGTH = 64


@dataclass(frozen=True)
class Client:
    """The caller behind one key."""

    owner: str  # stable and not secret: a hash of the key, or "anonymous"
    name: str  # what listings show
    admin: bool = False
    # Its calls' band unless they ask for another (0, interactive, is the best) ...
    band: int = 0
    # ... and the best band they may ask for (never better than this).
    best_band: int = 0
    # Its share of service inside a band, relative to the other keys' (1: equal).
    weight: float = 1.0

    def may_see(self, owner: str) -> bool:
        """Whether this caller may list, end and call a program ``owner`` opened."""
        return self.admin or owner == self.owner

    def band_for(self, asked: int | None) -> int:
        """The band the router states for a call that asked for ``asked`` (None:
        none): any worse band, a better one only up to :attr:`best_band`."""
        return self.band if asked is None else max(asked, self.best_band)


@dataclass(frozen=True)
class KeyEntry:
    """What a keys file says of one key: its name, its classes (bands) and its weight."""

    name: str
    band: int = 0
    best_band: int = 0
    weight: float = 1.0


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
        named_keys: Mapping[str, KeyEntry] | None = None,
        admin_key: str | None = None,
    ) -> KeyRing:
        """``named_keys`` maps key -> its entry (from :func:`load_api_keys`)."""
        clients: dict[str, Client] = {}
        if api_key is not None:
            clients[api_key] = Client(owner_of(api_key), "default")
        for key, entry in (named_keys or {}).items():
            clients[key] = Client(owner_of(key), entry.name, band=entry.band,
                                  best_band=entry.best_band, weight=entry.weight)  # fmt: skip
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


def load_api_keys(path: str | Path) -> dict[str, KeyEntry]:
    """The keys in a keys file: key -> its entry. Errors name the file and line,
    never a key."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"API keys file {path}: cannot read it: {error}") from None
    return parse_api_keys(text.splitlines(), str(path))


def parse_api_keys(lines: Iterable[str], source: str) -> dict[str, KeyEntry]:
    keys: dict[str, KeyEntry] = {}
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
        key, *options = key.split() or [""]
        if any("=" not in option for option in options):  # not an option: a key with a space
            check_key(" ", f"{where}: the key")
        check_key(key, f"{where}: the key")
        if key in first_line:
            raise ValueError(f"{where}: the same key is on line {first_line[key]}")
        first_line[key] = number
        keys[key] = _entry(name or owner_of(key), options, where)
    if not keys:
        raise ValueError(f"API keys file {source}: no keys in it")
    return keys


# A key line's options and how each value is read.
_OPTIONS = {"class": validate_priority, "max-class": validate_priority, "weight": validate_weight}


def _entry(name: str, options: Iterable[str], where: str) -> KeyEntry:
    """A key's entry from its line's options: ``class=``, ``max-class=`` and ``weight=``."""
    given: dict[str, float] = {}
    for option in options:
        field, _, value = option.partition("=")
        validate = _OPTIONS.get(field)
        if validate is None:
            known = ", ".join(_OPTIONS)
            raise ValueError(f"{where}: unknown option {field!r}; the options are {known}")
        try:
            given[field] = validate(value, field)
        except IdentityError as error:
            raise ValueError(f"{where}: {error}") from None
    band = int(given.get("class", 0))
    best_band = int(given.get("max-class", band))
    if best_band > band:
        raise ValueError(f"{where}: max-class must be at least as good as class")
    return KeyEntry(name, band, best_band, given.get("weight", 1.0))


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
