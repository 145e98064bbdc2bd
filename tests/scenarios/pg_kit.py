"""Helpers for the CLI tests on PostgreSQL: raw SQL, a URL with a password, seeded sessions.

Each test gets a fresh schema (``pg_url``, ``tests/conftest.py``); the server trusts local
connections, so a URL may carry any password: the tests give it one to check it never shows.
"""

from __future__ import annotations

import anyio

from persistence.postgres import PostgresStore
from tests.persistence.helpers import session
from tests.pg_kit import sql
from tests.store_kit import commit

#: The password the tests put in every URL: no output may ever hold it.
SECRET = "Pw7-kq9zmT"


def with_password(url: str) -> str:
    """``url`` with :data:`SECRET` as the password (the server does not ask for one)."""
    assert url.startswith("postgresql://postgres@"), url
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@", 1)


def seed(url: str, *sessions: str) -> None:
    """A turnkeeper store at ``url`` holding ``sessions`` (their leases released at close)."""

    async def make() -> None:
        async with PostgresStore(url) as store:
            for sid in sessions:
                await commit(store, sid, create=session(sid))

    anyio.run(make)


def lease(url: str, sid: str, *, owner: str | None, epoch: int, expires: str) -> None:
    """Set ``sid``'s lease columns (``expires`` is SQL: ``now() + interval '1 hour'``)."""
    sql(
        url,
        f"UPDATE sessions SET owner = %s, epoch = %s, lease_expires = {expires} WHERE id = %s",
        (owner, epoch, sid),
    )
