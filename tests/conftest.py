"""Test-wide settings.

Hypothesis runs derandomized by default so every run of ``make test`` is the same run; set
``HYPOTHESIS_PROFILE=explore`` to search with fresh randomness locally.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", deadline=None, print_blob=True, max_examples=2_000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# -- a real PostgreSQL server (tests/pg_server.py) ----------------------------------------------

import itertools  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402

import pytest  # noqa: E402

from tests import pg_server as _pg  # noqa: E402

_schemas = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[_pg.PgServer]:
    """A throwaway PostgreSQL server for the whole run, started on first use."""
    server = _pg.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_database(pg_server: _pg.PgServer) -> str:
    """The tests' database on the server (each test gets a schema of its own in it)."""
    import psycopg

    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE turnkeeper_tests")
    return "turnkeeper_tests"


@pytest.fixture
def pg_url(pg_server: _pg.PgServer, pg_database: str) -> Iterator[str]:
    """A URL of a fresh, empty schema (dropped after the test)."""
    import psycopg

    schema = f"t{next(_schemas)}"
    url = pg_server.url(pg_database)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")  # the fixture's own DDL only
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{url}&options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def fresh_pg_url(pg_server: _pg.PgServer, pg_database: str) -> Iterator[Callable[[], str]]:
    """Makes a URL of a fresh, empty schema at each call (all dropped after the test)."""
    import psycopg

    made: list[str] = []
    url = pg_server.url(pg_database)

    def fresh() -> str:
        schema = f"t{next(_schemas)}"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            conn.execute(f"CREATE SCHEMA {schema}")
        made.append(schema)
        return f"{url}&options=-csearch_path%3D{schema}"

    try:
        yield fresh
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            for schema in made:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
