"""PostgreSQL persistence: many engine processes on one database (the ``postgres`` extra).

``PostgresStore`` is a :class:`~persistence.Store` with session leases fenced by epochs
(``docs/deploying.md``); it needs psycopg 3 (``pip install 'turnkeeper[postgres]'``), which
this module imports.
"""

from persistence._pg_leases import LeaseRow, Leases
from persistence._postgres import DEFAULT_LEASE_S, PostgresStore, mint_owner, pg_schema_version
from persistence._urls import is_postgres_url, masked

__all__ = [
    "DEFAULT_LEASE_S",
    "LeaseRow",
    "Leases",
    "PostgresStore",
    "is_postgres_url",
    "masked",
    "mint_owner",
    "pg_schema_version",
]
