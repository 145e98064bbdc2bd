"""Telling a PostgreSQL URL from a SQLite path, and showing one without its password.

Free of psycopg, so the CLI can tell what it was given before the ``postgres`` extra is
needed.
"""

from __future__ import annotations

import re


def is_postgres_url(text: str) -> bool:
    """Whether ``text`` names a PostgreSQL database (``postgresql://`` or ``postgres://``)."""
    return text.startswith(("postgresql://", "postgres://"))


def masked(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for messages."""
    url = re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)
    return re.sub(r"(password=)[^&\s]*", r"\1***", url)
