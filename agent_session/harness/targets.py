"""Which files a command may write: never one it reads, never one that is not its own.

``--trace`` may not name the store, its ``-wal``, ``-shm``, ``-journal`` or ``.lock``, or a
scenario the run reads. Two names are the same file when they reach the same inode (a symlink,
a hard link, another spelling of the path: ``os.path.samefile``), or, when one does not exist
yet (a store's ``-wal`` before it is made), when their resolved paths are equal. Checked before
anything runs (``docs/cli.md``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Sequence

#: The files SQLite and the lock keep beside a store, by the suffix of its name.
STORE_SUFFIXES: Final = ("", "-wal", "-shm", "-journal", ".lock")
#: The label ``turnkeeper demo`` gives a store it creates (``SqliteStore(label=...)``): "tkdm".
DEMO_LABEL: Final = 0x746B646D


def same_file(one: str, other: str) -> bool:
    """Whether the two names reach one file (or would, for a file not made yet)."""
    try:
        return os.path.samefile(one, other)
    except OSError:  # one of them does not exist (yet): compare where they point
        return os.path.realpath(one) == os.path.realpath(other)


def store_files(db: str) -> list[str]:
    """The store's file and its companions, by the name given and by the resolved one."""
    real = os.path.realpath(db)
    return [f"{base}{suffix}" for base in (db, real) for suffix in STORE_SUFFIXES]


def trace_conflict(trace: str, *, db: str | None, inputs: Sequence[str]) -> str | None:
    """Why ``--trace trace`` would write over a file the command uses, or ``None``."""
    if db is not None and any(same_file(trace, name) for name in store_files(db)):
        return f"--trace {trace}: is the store {db} (or its -wal, -shm or .lock); not written"
    for path in inputs:
        if same_file(trace, path):
            return f"--trace {trace}: is the scenario {path}; not written"
    return None
