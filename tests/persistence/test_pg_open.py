"""Opening a PostgresStore: migrations, and bad input as one clear error (never a traceback).

A URL that does not connect, a database of another application, a schema newer than the code
or a role without rights: each is one typed error at open, naming the URL (its password
masked) and what was wrong; nothing is written.
"""

from __future__ import annotations

import pytest

from persistence import (
    NotATurnkeeperStore,
    StoreError,
    UnsupportedSchemaVersion,
    UsageError,
)
from persistence.postgres import PostgresStore, masked, pg_schema_version
from tests.pg_kit import sql, tables
from tests.store_kit import commit

from .helpers import session


async def test_a_fresh_schema_is_migrated_in_full_and_versioned(pg_url: str) -> None:
    async with PostgresStore(pg_url) as store:
        await commit(store, "s1", create=session("s1"))
    assert sql(pg_url, "SELECT version, application FROM schema_version") == [
        (pg_schema_version(), "turnkeeper")
    ]
    assert {
        "sessions",
        "history_rows",
        "turn_envelopes",
        "operations",
        "handles",
        "queued_entries",
        "queue_versions",
        "abandon_markers",
        "partial_parts",
        "retry_settings",
    } <= tables(pg_url)
    async with PostgresStore(pg_url) as again:  # a second open migrates nothing
        assert [r.id for r in await again.sessions()] == ["s1"]


async def test_a_url_that_does_not_connect_is_one_line_naming_it() -> None:
    url = "postgresql://postgres:hunter2@/nowhere?host=/tmp/no-such-socket-dir"
    with pytest.raises(StoreError) as refused:
        await PostgresStore(url, connect_timeout=1).open()
    message = str(refused.value)
    assert "cannot connect" in message
    assert "hunter2" not in message
    assert "postgres:***@" in message
    assert "\n" not in message


async def test_a_database_of_another_application_is_refused_untouched(pg_url: str) -> None:
    sql(pg_url, "CREATE TABLE invoices (id int)")
    with pytest.raises(NotATurnkeeperStore, match=r"another application.*invoices"):
        await PostgresStore(pg_url).open()
    assert tables(pg_url) == {"invoices"}


async def test_a_schema_version_of_another_application_is_refused(pg_url: str) -> None:
    sql(pg_url, "CREATE TABLE schema_version (version int, application text)")
    sql(pg_url, "INSERT INTO schema_version VALUES (3, 'ledger')")
    with pytest.raises(NotATurnkeeperStore, match="ledger"):
        await PostgresStore(pg_url).open()


async def test_a_schema_newer_than_the_code_is_refused_untouched(pg_url: str) -> None:
    async with PostgresStore(pg_url):
        pass
    sql(pg_url, "UPDATE schema_version SET version = 41")
    with pytest.raises(UnsupportedSchemaVersion) as refused:
        await PostgresStore(pg_url).open()
    assert (refused.value.found, refused.value.supported) == (41, pg_schema_version())
    assert sql(pg_url, "SELECT version FROM schema_version") == [(41,)]


async def test_a_role_without_rights_is_one_line_and_writes_nothing(pg_url: str) -> None:
    schema = pg_url.rsplit("%3D", 1)[1]
    sql(pg_url, "DROP ROLE IF EXISTS tk_reader")
    sql(pg_url, "CREATE ROLE tk_reader LOGIN")
    sql(pg_url, f"GRANT USAGE ON SCHEMA {schema} TO tk_reader")
    limited = pg_url.replace("postgresql://postgres@", "postgresql://tk_reader@")
    try:
        with pytest.raises(StoreError, match="lacks a right") as refused:
            await PostgresStore(limited).open()
        assert "\n" not in str(refused.value)
        assert tables(pg_url) == set()
    finally:
        sql(pg_url, f"REVOKE ALL ON SCHEMA {schema} FROM tk_reader")
        sql(pg_url, "DROP ROLE tk_reader")


async def test_readonly_opens_create_nothing_and_never_migrate(pg_url: str) -> None:
    with pytest.raises(NotATurnkeeperStore, match="empty database"):
        await PostgresStore(pg_url, readonly=True).open()
    assert tables(pg_url) == set()
    async with PostgresStore(pg_url) as store:
        await commit(store, "s1", create=session("s1"))
    async with PostgresStore(pg_url, readonly=True) as view:
        assert view.owner is None
        assert [r.id for r in await view.sessions()] == ["s1"]
    sql(pg_url, "UPDATE schema_version SET version = 0")
    with pytest.raises(Exception, match="damaged"):
        await PostgresStore(pg_url, readonly=True).open()


def test_a_lease_out_of_range_is_refused() -> None:
    with pytest.raises(UsageError, match="lease"):
        PostgresStore("postgresql://x@/y", lease=0.2)


def test_a_password_never_shows() -> None:
    assert masked("postgresql://u:s3cret@db/x") == "postgresql://u:***@db/x"
    assert masked("host=db password=s3cret dbname=x") == "host=db password=*** dbname=x"


def test_a_password_in_every_spelling_is_masked_and_scrubbed() -> None:
    from persistence._urls import scrubbed, secrets_of

    assert masked("host=db password='a b' dbname=x") == "host=db password='***' dbname=x"
    assert masked("postgresql://u@db/x?password=p%40ss&sslmode=off") == (
        "postgresql://u@db/x?sslmode=off"
    )
    assert masked("postgresql://u@/x?host=/s&password=p w") == "postgresql://u@/x?host=/s"
    secrets = secrets_of("postgresql://u:p%40ss@db/x")
    assert scrubbed('unexpected "p@ss" and p%40ss', secrets) == 'unexpected "***" and ***'


async def test_a_password_the_driver_quotes_back_never_shows() -> None:
    url = "host=/tmp/no-such-socket-dir dbname=x password='sesame street' connect_timeout=1"
    with pytest.raises(StoreError) as refused:
        await PostgresStore(url, connect_timeout=1).open()
    assert "sesame" not in str(refused.value)
    assert "street" not in str(refused.value)
