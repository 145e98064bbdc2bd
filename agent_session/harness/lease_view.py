"""``turnkeeper inspect``'s session leases, on a PostgreSQL store (``docs/deploying.md``).

Each session's lease as the database holds it (``PostgresStore.lease_rows``): who owns it,
its epoch, when it runs out and whether it has, by the database's clock. A malformed lease row
(LS-7: never taken by any process) is reported like other damage, by its session and what is
wrong; nothing is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from agent_session.harness.redaction import redact
from persistence import StoreError, clip

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from persistence.postgres import PostgresStore


async def read_leases(
    store: PostgresStore, session: str | None, report: Callable[[str, str], None]
) -> list[dict[str, Any]]:
    """The leases (every session's, or ``session``'s), as ``inspect --json`` shows them.

    Each is ``{"session", "owner", "epoch", "expires", "expired", "problem"}``; a malformed one
    is reported to ``report`` too (``malformed lease of session S``, its problem).
    """
    try:
        rows = await store.lease_rows()
    except StoreError as error:
        report("leases", str(error))
        return []
    leases: list[dict[str, Any]] = []
    for row in rows:
        if session not in (None, row.session):
            continue
        if row.problem is not None:
            report(f"malformed lease of session {row.session}", row.problem)
        data: dict[str, Any] = msgspec.to_builtins(row)
        leases.append({k: redact(v) if isinstance(v, str) else v for k, v in data.items()})
    return leases


def print_leases(console: Console, leases: list[dict[str, Any]]) -> None:
    """One line per session: its owner, epoch and expiry, or what is malformed."""
    if not leases:
        console.print("leases: none")
        return
    malformed = sum(lease["problem"] is not None for lease in leases)
    console.print(f"leases: {len(leases)}" + (f", {malformed} malformed" if malformed else ""))
    for lease in leases:
        console.print(f"  {clip(lease['session'])}: {_state(lease)}", markup=False, soft_wrap=True)


def _state(lease: dict[str, Any]) -> str:
    if lease["problem"] is not None:
        return f"malformed, never taken: {clip(lease['problem'], 1000)}"
    if lease["owner"] is None:
        return f"unowned, epoch {lease['epoch']}"
    head = f"owner {clip(lease['owner'])}, epoch {lease['epoch']}"
    if lease["expired"]:
        return f"{head}, expired {lease['expires']} (ran out: another process may take it)"
    return f"{head}, expires {lease['expires']} (live)"
