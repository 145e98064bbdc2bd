"""Telling a PostgreSQL URL from a SQLite path, and showing one without its password.

Free of psycopg, so the CLI can tell what it was given before the ``postgres`` extra is
needed.
"""

from __future__ import annotations

import re
import urllib.parse


def is_postgres_url(text: str) -> bool:
    """Whether ``text`` names a PostgreSQL database (``postgresql://`` or ``postgres://``)."""
    return text.startswith(("postgresql://", "postgres://"))


def masked(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for messages.

    A URL's ``user:password@`` is masked and its ``password=`` parameter left out; a
    key-value string's ``password=`` (quoted, with spaces, or bare) is masked.
    """
    if "://" in url:  # a query's password goes whole: ``password=***`` reads as a credential
        url = re.sub(r"[?&]password=[^&#]*", "", url)
        if "?" not in url and "&" in url:
            url = url.replace("&", "?", 1)
    for secret in secrets_of(url):
        url = url.replace(secret, "***")
    return url


def secrets_of(url: str) -> tuple[str, ...]:
    """The password ``url`` carries, in every spelling a message could quote it back in."""
    found: list[str] = []
    if "://" in url:
        at = re.search(r"://[^/@:]*:([^/@]*)@", url)
        if at:
            found.append(at.group(1))
        found += re.findall(r"[?&]password=([^&#]*)", url)
    else:
        quoted = re.search(r"password\s*=\s*'((?:[^'\\]|\\.)*)'", url)
        bare = re.search(r"password\s*=\s*([^\s']+)", url)
        found += [m.group(1) for m in (quoted, bare) if m]
    decoded = [urllib.parse.unquote(value) for value in found]
    return tuple(sorted({value for value in (*found, *decoded) if value}, key=len, reverse=True))


def scrubbed(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***`` (longest first)."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
