"""Raw SQL for the PostgreSQL tests: what a test reads or breaks behind the store's back."""

from __future__ import annotations

from typing import Any

import psycopg


def sql(url: str, query: str, params: Any = None) -> list[Any]:
    """Run one statement on ``url`` (autocommit); its rows, if it returns any."""
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def expire(url: str, sid: str) -> None:
    """Make ``sid``'s lease run out now, on the database's clock (the one that judges it)."""
    sql(
        url, "UPDATE sessions SET lease_expires = now() - interval '1 second' WHERE id = %s", (sid,)
    )


def tables(url: str) -> set[str]:
    """The tables of the URL's schema."""
    found = sql(
        url,
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()",
    )
    return {name for (name,) in found}
