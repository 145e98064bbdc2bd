"""Numbered migrations: the SQL files in ``persistence/migrations``, split into statements."""

from __future__ import annotations

import functools
import importlib.resources
import re
import sqlite3
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered migration file, split into statements."""

    version: int
    name: str
    statements: tuple[str, ...]


def split_statements(script: str) -> tuple[str, ...]:
    """Split a SQL script into complete statements (comments stay with their statement).

    Raises:
        ValueError: The script ends with an incomplete statement.
    """
    statements: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    leftover = [
        line for line in pending.splitlines() if line.strip() and not line.strip().startswith("--")
    ]
    if leftover:
        raise ValueError(f"incomplete SQL statement at the end of a migration: {pending!r}")
    return tuple(statements)


@functools.cache
def load_migrations() -> tuple[Migration, ...]:
    """The numbered migrations in ``persistence/migrations``, in order.

    Raises:
        RuntimeError: The files are not numbered 1, 2, 3, ... without gaps.
    """
    folder = importlib.resources.files("persistence").joinpath("migrations")
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_\w+\.sql", entry.name)
        if match:
            text = entry.read_text(encoding="utf-8")
            found.append(Migration(int(match.group(1)), entry.name, split_statements(text)))
    found.sort(key=lambda migration: migration.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..N: {[m.name for m in found]}")
    return tuple(found)
