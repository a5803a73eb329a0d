"""``autellix top``: the router's programs, refreshed live (see :mod:`.ps`)."""

from .ps import add_parser

__all__ = ["add_parser"]
