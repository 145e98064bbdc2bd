"""What a command's ``--db`` opens: a SQLite path, or a PostgreSQL URL (``docs/cli.md``).

A value that starts ``postgresql://`` or ``postgres://`` opens a ``PostgresStore``; anything
else stays a SQLite path, exactly as before. ``persistence.postgres`` (and psycopg, the
``postgres`` extra) is imported only for a URL, so a SQLite-only install never needs it; a URL
without it is one :class:`~persistence.UsageError` naming ``turnkeeper[postgres]``.

Every message that echoes a URL shows it masked (:func:`shown`), and a message about one is
scrubbed of its password (:func:`scrubbed`) before it is printed: a driver's error may quote
the part of the URL it could not parse.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import unquote

from persistence import UsageError, is_postgres_url, masked

if TYPE_CHECKING:
    from persistence import SqliteStore
    from persistence.postgres import PostgresStore

    #: A store a ``--db`` value opens.
    DbStore = SqliteStore | PostgresStore

#: A URL's password: ``scheme://user:PASSWORD@`` or ``password=PASSWORD`` (to the next ``&``).
_PASSWORDS = (re.compile(r"://[^/@:]*:([^/@]*)@"), re.compile(r"password=([^&]*)"))


def is_url(db: str | None) -> bool:
    """Whether ``--db`` names a PostgreSQL database (else a SQLite file, or nothing)."""
    return db is not None and is_postgres_url(db)


def _secrets(url: str) -> list[str]:
    """The URL's passwords, as given and percent-decoded, longest first."""
    found = {secret for pattern in _PASSWORDS for secret in pattern.findall(url) if secret}
    return sorted(found | {unquote(secret) for secret in found}, key=len, reverse=True)


def _without(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return masked(text)


def shown(db: str) -> str:
    """``db`` as messages show it: a URL with its password masked, a path as it is."""
    return _without(db, _secrets(db)) if is_url(db) else db


def scrubbed(text: str, db: str | None) -> str:
    """``text`` without the password of ``db`` (as given or percent-decoded), masked.

    Unchanged when ``db`` is not a URL. The store's own rendering of the URL (``masked``,
    which stops at a space) is replaced by :func:`shown`'s first.
    """
    if db is None or not is_url(db):
        return text
    return _without(text.replace(masked(db), shown(db)), _secrets(db))


def postgres_store(url: str, *, readonly: bool = False) -> PostgresStore:
    """A (closed) ``PostgresStore`` of ``url``.

    Raises:
        UsageError: psycopg cannot be imported (the ``postgres`` extra is not installed).
    """
    try:
        from persistence.postgres import PostgresStore
    except ImportError as error:
        why = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UsageError(
            f"--db {masked(url)}: a PostgreSQL URL needs psycopg, the postgres extra: "
            f"pip install 'turnkeeper[postgres]' ({why})"
        ) from None
    return PostgresStore(url, readonly=readonly)


def postgres_schema_version() -> int:
    """The newest PostgreSQL schema version this code knows (psycopg is imported already)."""
    from persistence.postgres import pg_schema_version

    return pg_schema_version()
