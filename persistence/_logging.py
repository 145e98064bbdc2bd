"""aiosqlite's log keeps no row: quiet by default, and never a call's arguments.

aiosqlite logs every call at DEBUG as ``executing %s`` with the call itself as the argument:
its repr carries the SQL parameters, that is the rows (a user's message, a tool's output) and
the store's owner token. Neither is credential-shaped, so the redactor cannot find them; the
records must not carry them at all (``docs/persistence.md``, "Logging"):

* the ``aiosqlite`` logger is set to ``WARNING`` unless the host gave it a level first, so a
  host's ``logging.basicConfig(level=logging.DEBUG)`` does not turn it on;
* whatever its level, :class:`CallNames` replaces each argument of its records with a name (a
  call's function, or a value's type), so a host that asks for its DEBUG log sees which calls
  ran, never what they carried.
"""

from __future__ import annotations

import functools
import logging
from typing import Final

__all__ = ["AIOSQLITE", "CallNames", "quiet_aiosqlite"]

AIOSQLITE: Final = "aiosqlite"


def _name(value: object) -> str:
    """A call's qualified function name (through ``partial``), else the value's type name."""
    while isinstance(value, functools.partial):
        value = value.func
    name = getattr(value, "__qualname__", None) if callable(value) else None
    return name if isinstance(name, str) else type(value).__name__


class CallNames(logging.Filter):
    """Replace each argument of a record with :func:`_name` of it; always ``True``."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Name ``record``'s arguments in place."""
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(_name(arg) for arg in args)
        elif args:  # a mapping (``log("%(x)s", {...})``)
            record.args = {key: _name(arg) for key, arg in args.items()}
        return True


def quiet_aiosqlite() -> None:
    """Install :class:`CallNames` on aiosqlite's logger and keep it below DEBUG (idempotent)."""
    logger = logging.getLogger(AIOSQLITE)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)
    if not any(isinstance(f, CallNames) for f in logger.filters):
        logger.addFilter(CallNames())
