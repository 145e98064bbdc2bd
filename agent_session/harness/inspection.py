"""``turnkeeper inspect`` and ``turnkeeper receipts``: what a store holds, read-only.

Both open the store with ``SqliteStore(readonly=True)``: they never migrate, repair, lock or
write a store another process may be using. A file that is not a turnkeeper store is refused
with a clear message (exit 2). Receipts hold no arguments or outputs by construction; as a
second line of defence every printed value passes through :func:`redact`.
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from agent_session.harness.console import PipeConsole
from agent_session.harness.redaction import redact
from persistence import (
    MigrationRequired,
    NotATurnkeeperStore,
    OperationRecord,
    OpState,
    SqliteStore,
    StoreError,
    UnsupportedSchemaVersion,
)

_encoder = msgspec.json.Encoder()


def _receipt_row(record: OperationRecord) -> dict[str, Any]:
    data: dict[str, Any] = msgspec.to_builtins(record)
    data["capability"] = record.capability.text  # shown as stored: ``client:bash``
    return {key: redact(value) if isinstance(value, str) else value for key, value in data.items()}


async def _open(db: str) -> SqliteStore | str:
    store = SqliteStore(db, readonly=True)
    try:
        await store.open()
    except (NotATurnkeeperStore, UnsupportedSchemaVersion, MigrationRequired, StoreError) as error:
        return redact(error)
    return store


async def receipts_command(db: str, state: str | None, as_json: bool) -> int:
    """``turnkeeper receipts``: operation receipts, open ones first."""
    states = None
    if state is not None:
        try:
            states = frozenset({OpState(state)})
        except ValueError:
            allowed = ", ".join(s.value for s in OpState)
            print(f"turnkeeper receipts: unknown state {state!r} ({allowed})", file=sys.stderr)
            return 2
    opened = await _open(db)
    if isinstance(opened, str):
        print(f"turnkeeper receipts: {opened}", file=sys.stderr)
        return 2
    try:
        query = await opened.receipts(states=states)
    finally:
        await opened.close()
    for op_id, detail in query.corrupt:
        print(
            f"turnkeeper receipts: skipped corrupt receipt {redact(op_id)}: {redact(detail)}",
            file=sys.stderr,
        )
    if as_json:
        payload = {
            "receipts": [_receipt_row(r) for r in query.records],
            "corrupt": [
                {"op": redact(op_id), "detail": redact(detail)} for op_id, detail in query.corrupt
            ],
        }
        print(_encoder.encode(payload).decode())
        return 0
    _print_receipts(list(query.records))
    return 0


def _console() -> Console:
    """Rich output; a pipe or a log gets full rows instead of a guessed 80 columns."""
    return PipeConsole(highlight=False, width=None if sys.stdout.isatty() else 160)


def _print_receipts(records: list[OperationRecord]) -> None:
    console = _console()
    if not records:
        console.print("no receipts")
        return
    table = Table(title="operation receipts (indeterminate first)")
    for column in ("op", "tool", "state", "ack", "outcome", "cancel", "started", "ended"):
        table.add_column(column)
    for record in records:
        table.add_row(
            redact(record.op_id),
            redact(record.capability.text),
            record.state.value,
            "yes" if record.termination_acknowledged else "no",
            redact(record.outcome_code or ""),
            redact(record.cancel_reason or ""),
            f"{record.started_at:.3f}",
            "" if record.ended_at is None else f"{record.ended_at:.3f}",
        )
    console.print(table)
    for record in records:
        if record.explanation:
            console.print(f"{redact(record.op_id)}: {redact(record.explanation)}")


async def inspect_command(db: str, session: str | None, as_json: bool) -> int:
    """``turnkeeper inspect``: sessions, owed continuations, receipts."""
    opened = await _open(db)
    if isinstance(opened, str):
        print(f"turnkeeper inspect: {opened}", file=sys.stderr)
        return 2
    try:
        sessions = [s for s in await opened.sessions() if session is None or s.id == session]
        scan = await opened.scan_recoverable()
        query = await opened.receipts(session)
    finally:
        await opened.close()
    owed = [row for cut in scan.cuts for row in cut.owed if session in (None, row.session)]
    for sid, detail in scan.corrupt:
        if session in (None, sid):
            print(
                f"turnkeeper inspect: skipped corrupt cut of session {redact(sid)}: "
                f"{redact(detail)}",
                file=sys.stderr,
            )
    owed_rows: list[dict[str, Any]] = [
        {
            "session": redact(row.session),
            "row": redact(row.row_id),
            "cut": redact(row.stream),
            "remaining": row.cut.remaining if row.cut else None,
            "model": redact(row.cut.model) if row.cut else None,
        }
        for row in owed
    ]
    report: dict[str, Any] = {
        "sessions": [{"id": redact(s.id), "model": redact(s.model)} for s in sessions],
        "owed": owed_rows,
        "follow_ups": [],  # compaction follow-ups arrive with the compaction work
        "handles": [],  # delegated handles arrive with the delegation work
        "receipts": [_receipt_row(r) for r in query.records],
        "corrupt_receipts": [
            {"op": redact(op_id), "detail": redact(d)} for op_id, d in query.corrupt
        ],
    }
    if as_json:
        print(_encoder.encode(report).decode())
        return 0
    console = _console()
    console.print(f"store: {redact(db)}")
    console.print(f"sessions: {', '.join(redact(s.id) for s in sessions) or 'none'}")
    if owed_rows:
        for item in owed_rows:
            console.print(
                f"owed continuation: {item['session']} cut {item['cut']} "
                f"({item['remaining']} steps left on {item['model']})"
            )
    else:
        console.print("owed continuations: none")
    console.print("pending follow-ups: none; delegated handles: none")
    _print_receipts(list(query.records))
    return 0
