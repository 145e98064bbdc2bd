"""``turnkeeper inspect``, ``receipts``, ``resolve`` and ``migrate``: the store commands.

``inspect`` and ``receipts`` show what a store holds, ``resolve`` settles one operation,
``migrate`` brings a store of an older schema to this one.

``inspect`` and ``receipts`` open the store read-only (``SqliteStore(readonly=True)``, or
``PostgresStore(readonly=True)`` for a ``--db`` that is a PostgreSQL URL, ``db_url``): they
never migrate, repair, lock or write a store another process may be using. A file that is not
a turnkeeper store is refused with a clear message (exit 2), a store of an older schema too,
naming ``turnkeeper migrate``. Receipts hold no arguments or outputs by construction; as a
second line of defence every printed value passes through :func:`redact`, and a URL's
password never shows. ``resolve`` holds the lock (SQLite), checks read-only, and writes only
once the operation is found resolvable.
"""

from __future__ import annotations

import shlex
import sys
from typing import TYPE_CHECKING, Any

import msgspec
from rich.console import Console
from rich.table import Table

from agent_session._recovery import damaged_cut, unreadable
from agent_session._requests import Asker, RequestRefused, RequestUnanswered, resolve_by_holder
from agent_session._rows import decode_body
from agent_session.harness.console import PipeConsole
from agent_session.harness.db_url import (
    is_url,
    postgres_schema_version,
    postgres_store,
    scrubbed,
    shown,
)
from agent_session.harness.lease_view import print_leases, read_leases
from agent_session.harness.queued_view import print_queue, read_queue
from agent_session.harness.redaction import redact
from agent_session.ports import EngineConfig
from persistence import (
    RETRY_SETTINGS,
    AbandonMarker,
    CorruptRecord,
    DamagedStore,
    HandleQuery,
    HandleRecord,
    HandleStatus,
    LeaseLost,
    MigrationRequired,
    NotATurnkeeperStore,
    NotResolvable,
    OperationRecord,
    OpState,
    ReceiptQuery,
    RecoveryScan,
    Resolution,
    RowKind,
    SessionList,
    SessionLoad,
    SessionRecord,
    SqliteStore,
    Store,
    StoredPartial,
    StoreError,
    StoreLocked,
    TurnkeeperError,
    UnsupportedSchemaVersion,
    UsageError,
    as_resolution,
    checked_note,
    clip,
    found_receipt,
    resolve_operation,
)
from stream_manager import Clock, SystemClock

#: LS-10: seconds ``resolve`` waits for the answer of the process that holds the receipt's
#: session (the engine's ``request_timeout_s``), before it withdraws its request.
HOLDER_WAIT_S = EngineConfig().request_timeout_s

if TYPE_CHECKING:
    from agent_session.harness.db_url import DbStore

_encoder = msgspec.json.Encoder()


def _receipt_row(record: OperationRecord) -> dict[str, Any]:
    data: dict[str, Any] = msgspec.to_builtins(record)
    data["capability"] = record.capability.text  # shown as stored: ``client:bash``
    return {key: redact(value) if isinstance(value, str) else value for key, value in data.items()}


def _handle_row(record: HandleRecord) -> dict[str, Any]:
    """A handle as ``inspect --json`` shows it: its fields redacted, what it waits on, flagged."""
    data: dict[str, Any] = msgspec.to_builtins(record)
    row = {key: redact(value) if isinstance(value, str) else value for key, value in data.items()}
    active = record.status is HandleStatus.ACTIVE
    row["deferred"] = [redact(stream) for stream in record.deferred]
    row["waiting_on"] = row["deferred"] if active else []
    row["undelivered"] = not active and not record.delivered
    return row


#: Exit codes of ``inspect`` and ``receipts`` (docs/cli.md); ``migrate`` adds ``EXIT_FAILED``.
EXIT_OK, EXIT_REFUSED, EXIT_FAILED, EXIT_DAMAGED = 0, 2, 3, 4


def _said(error: BaseException | str, db: str) -> str:
    """An error as a line shows it: redacted, without the password of a ``--db`` URL."""
    return redact(scrubbed(str(error), db))


async def _open(db: str) -> DbStore | tuple[int, str]:
    """The store, opened read-only; or the exit code and the one line that says why not."""
    try:
        store = postgres_store(db, readonly=True) if is_url(db) else SqliteStore(db, readonly=True)
        await store.open()
    except DamagedStore as error:
        return EXIT_DAMAGED, _said(error, db)
    except MigrationRequired as error:
        name = shown(db)
        return EXIT_REFUSED, _said(
            f"{name} has schema version {error.found} and needs migrating to {error.supported}; "
            f"read-only commands never migrate: run `turnkeeper migrate --db {shlex.quote(name)}`",
            db,
        )
    except TurnkeeperError as error:  # not a store, a newer version, unreadable, no psycopg
        return EXIT_REFUSED, _said(error, db)
    return store


async def migrate_command(db: str) -> int:
    """``turnkeeper migrate``: bring a store to this turnkeeper's schema, in one transaction.

    One line either way: what was done on standard output, why not on standard error. It
    creates nothing: a missing or empty file, a file that is not a store, a newer schema and
    a store another process owns are refused (exit 2) and left as they were; a damaged store
    is exit 4; a migration that fails (exit 3) leaves the store at its old version.
    """
    if is_url(db):
        return await _migrate_postgres(db)
    try:
        found, now = await SqliteStore.migrate(db)
    except DamagedStore as error:
        print(f"turnkeeper migrate: {redact(error)}", file=sys.stderr)
        return EXIT_DAMAGED
    except (NotATurnkeeperStore, UnsupportedSchemaVersion, StoreLocked) as error:
        print(f"turnkeeper migrate: {redact(error)}", file=sys.stderr)
        return EXIT_REFUSED
    except StoreError as error:
        print(
            f"turnkeeper migrate: {redact(error)} (nothing was migrated: the store keeps its "
            "schema version)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if found == now:
        print(f"turnkeeper migrate: {redact(db)} is at schema version {now} already")
    else:
        print(f"turnkeeper migrate: {redact(db)} migrated from schema version {found} to {now}")
    return EXIT_OK


async def _migrate_postgres(url: str) -> int:
    """``migrate`` on a PostgreSQL URL: checked read-only first, so it creates nothing.

    An empty database, another application's, a newer schema and a URL that does not connect
    are refused by the read-only open (exit 2; a damaged store exit 4); only an older schema
    is then opened read-write, which migrates it in one transaction (exit 3 if that fails).
    """
    try:
        view = postgres_store(url, readonly=True)
        await view.open()
    except MigrationRequired as older:
        found, now = older.found, older.supported
    except DamagedStore as error:
        print(f"turnkeeper migrate: {_said(error, url)}", file=sys.stderr)
        return EXIT_DAMAGED
    except TurnkeeperError as error:
        print(f"turnkeeper migrate: {_said(error, url)}", file=sys.stderr)
        return EXIT_REFUSED
    else:
        await view.close()
        now = postgres_schema_version()
        print(f"turnkeeper migrate: {_said(shown(url), url)} is at schema version {now} already")
        return EXIT_OK
    try:
        async with postgres_store(url):
            pass
    except (NotATurnkeeperStore, UnsupportedSchemaVersion) as error:  # changed meanwhile
        print(f"turnkeeper migrate: {_said(error, url)}", file=sys.stderr)
        return EXIT_REFUSED
    except DamagedStore as error:
        print(f"turnkeeper migrate: {_said(error, url)}", file=sys.stderr)
        return EXIT_DAMAGED
    except TurnkeeperError as error:
        print(
            f"turnkeeper migrate: {_said(error, url)} (nothing was migrated: the store keeps "
            "its schema version)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print(
        f"turnkeeper migrate: {_said(shown(url), url)} migrated from schema version {found} "
        f"to {now}"
    )
    return EXIT_OK


class _Findings:
    """What a command found damaged, each ``(where, detail)``; printed on standard error."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.items: list[tuple[str, str]] = []

    def add(self, where: str, detail: str) -> None:
        where, detail = redact(where), redact(detail)
        self.items.append((where, detail))
        print(f"turnkeeper {self.command}: {clip(where)}: {clip(detail, 1000)}", file=sys.stderr)

    def json(self) -> list[dict[str, str]]:
        return [{"at": where, "detail": detail} for where, detail in self.items]


async def receipts_command(db: str, state: str | None, as_json: bool) -> int:
    """``turnkeeper receipts``: operation receipts, open ones first."""
    states = None
    if state is not None:
        try:
            states = frozenset({OpState(state)})
        except ValueError:
            allowed = ", ".join(s.value for s in OpState)
            print(f"turnkeeper receipts: unknown state {state!r} ({allowed})", file=sys.stderr)
            return EXIT_REFUSED
    opened = await _open(db)
    if isinstance(opened, tuple):
        print(f"turnkeeper receipts: {opened[1]}", file=sys.stderr)
        return opened[0]
    found = _Findings("receipts")
    try:
        query = await opened.receipts(states=states)
    except StoreError as error:  # a damaged page under the receipts
        print(f"turnkeeper receipts: {_said(error, db)}", file=sys.stderr)
        return EXIT_DAMAGED
    finally:
        await opened.close()
    for op_id, detail in query.corrupt:
        found.add(f"skipped corrupt receipt {op_id}", detail)
    if as_json:
        payload = {
            "receipts": [_receipt_row(r) for r in query.records],
            "corrupt": [{"op": redact(op), "detail": redact(d)} for op, d in query.corrupt],
        }
        print(_encoder.encode(payload).decode())
    else:
        _print_receipts(list(query.records))
    return EXIT_DAMAGED if found.items else EXIT_OK


def _shown(value: str) -> str:
    """A value as text output shows it: redacted, then cut to a bounded length, its size said.

    Redacted first, so a cut never leaves the head of a credential it would have matched.
    """
    return clip(redact(value))


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
            _shown(record.op_id),
            _shown(record.capability.text),
            record.state.value,
            "yes" if record.termination_acknowledged else "no",
            _shown(record.outcome_code or ""),
            _shown(record.cancel_reason or ""),
            f"{record.started_at:.3f}",
            "" if record.ended_at is None else f"{record.ended_at:.3f}",
        )
    console.print(table)
    for record in records:
        if record.explanation:
            console.print(f"{_shown(record.op_id)}: {_shown(record.explanation)}", markup=False)
        if record.resolved_by is not None:
            when = "" if record.resolved_at is None else f" at {record.resolved_at:.3f}"
            console.print(
                f"{_shown(record.op_id)}: resolved by {_shown(record.resolved_by)}{when}: "
                f"{_shown(record.note or '')}",
                markup=False,  # a person's words, not rich markup ("[redacted]" included)
            )


async def resolve_command(
    db: str, op_id: str, as_: str, note: str, clock: Clock | None = None
) -> int:
    """``turnkeeper resolve``: a person settles an indeterminate operation in a store.

    The store's lock is taken first (refused while another process owns the store), then the
    operation is checked on a read-only view (``SqliteStore(precheck=...)``), so a refusal
    leaves the folder exactly as it was (no ``-wal``, ``-shm`` or ``.lock`` either); then it
    is written on the read-write open. One line
    either way: on standard output when it was resolved, on standard error when not. The
    time recorded is ``clock``'s (the wall clock by default, epoch seconds like the engine's).
    """
    try:
        resolution, _ = as_resolution(as_), checked_note(note)
    except UsageError as error:
        print(f"turnkeeper resolve: {redact(error)}", file=sys.stderr)
        return EXIT_REFUSED
    now = (clock or SystemClock()).now()

    async def resolvable(view: SqliteStore) -> None:
        await _check_resolvable(view, db, op_id)

    try:
        if is_url(db):
            record = await _resolve_on_postgres(db, op_id, resolution, note, now)
        else:
            async with SqliteStore(db, precheck=resolvable) as store:
                record = await resolve_operation(store, op_id, resolution, note=note, at=now)
    except NotResolvable as error:
        print(f"turnkeeper resolve: {_said(error, db)}", file=sys.stderr)
        return EXIT_DAMAGED if error.damaged else EXIT_REFUSED
    except DamagedStore as error:
        print(f"turnkeeper resolve: {_said(error, db)}", file=sys.stderr)
        return EXIT_DAMAGED
    except LeaseLost as error:  # held by a live process that vanished before it was asked
        print(
            f"turnkeeper resolve: {_said(error, db)}: settle it through the engine that holds "
            "the session (engine.resolve_operation)",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    except (RequestUnanswered, RequestRefused) as error:  # asked of the holder (LS-10)
        print(f"turnkeeper resolve: {_said(error, db)}", file=sys.stderr)
        return EXIT_REFUSED
    except TurnkeeperError as error:  # in use by another process, not a store, a failed write
        print(f"turnkeeper resolve: {_said(error, db)}", file=sys.stderr)
        return EXIT_REFUSED
    print(
        f"turnkeeper resolve: {redact(record.op_id)} resolved as {resolution.value}: "
        f"{record.state.value} ({record.outcome_code}), by {record.resolved_by}"
    )
    return EXIT_OK


async def _resolve_on_postgres(
    url: str, op_id: str, resolution: Resolution, note: str, now: float
) -> OperationRecord:
    """Check ``op_id`` on a read-only open, then settle it on a read-write one.

    So a refusal (no such operation, not indeterminate, not a store, an empty database)
    writes nothing, creates nothing and takes no lease. The write takes the receipt's
    session lease for its one commit (its epoch goes up; the close gives it back); when a
    live process holds the session, the write is refused (``LeaseLost``, nothing written)
    and that process is asked to resolve it (LS-10), its answer awaited for
    ``EngineConfig.request_timeout_s``. An older schema is migrated by the read-write open,
    and the operation checked there.
    """
    view = postgres_store(url, readonly=True)
    try:
        async with view:
            await _check_resolvable(view, shown(url), op_id)
    except MigrationRequired:
        pass  # the read-write open migrates it; resolve_operation checks again
    async with postgres_store(url) as store:
        try:
            return await resolve_operation(store, op_id, resolution, note=note, at=now)
        except LeaseLost as refused:
            if refused.holder is None:
                raise
            session = refused.session
        # LS-10: a live process holds the session: it resolves the receipt, asked.
        asker = Asker(store, timeout_s=HOLDER_WAIT_S, poll_s=0.5)
        store.watch_answers(asker.heard)
        return await resolve_by_holder(asker, session, op_id, resolution, note)


async def _check_resolvable(view: Store, db: str, op_id: str) -> None:
    """Refuse ``op_id`` unless it is indeterminate in ``view`` (the store read-only).

    Raises:
        NotResolvable: No such receipt, a damaged one, or one that is not indeterminate.
        DamagedStore: The receipts cannot be read.
    """
    try:
        record = found_receipt(await view.receipts(op_id=op_id), op_id)
    except DamagedStore:
        raise
    except StoreError as error:
        raise DamagedStore(db, str(error)) from None
    if record.state is not OpState.INDETERMINATE:
        raise NotResolvable(op_id, record.state)


async def inspect_command(db: str, session: str | None, as_json: bool) -> int:
    """``turnkeeper inspect``: integrity, sessions, owed continuations, queue, handles, receipts.

    Every read goes on past a damaged value or table: what failed is reported (on standard
    error, and under ``corrupt`` in ``--json``) and the rest is shown; exit 4 when anything
    was damaged (SQLite's ``quick_check`` included), 0 when nothing was.
    """
    opened = await _open(db)
    if isinstance(opened, tuple):
        print(f"turnkeeper inspect: {opened[1]}", file=sys.stderr)
        return opened[0]
    found = _Findings("inspect")
    try:
        report = await _read_report(opened, session, found)
    finally:
        await opened.close()
    records: list[OperationRecord] = report.pop("records")
    handles: list[HandleRecord] = report.pop("handle_records")
    partials: dict[str, tuple[StoredPartial, ...]] = report.pop("partials")
    queued, damaged = report["queued"], report["corrupt_queued"]
    report["corrupt"] = found.json()
    if as_json:
        print(_encoder.encode(report).decode())
        return EXIT_DAMAGED if found.items else EXIT_OK
    console = _console()
    console.print(f"store: {_shown(scrubbed(shown(db), db))}", markup=False)
    problems = report["integrity"]["problems"]
    verdict = "ok" if not problems else f"{len(problems)} problems, the store is damaged"
    if report["integrity"]["check"] is None:
        console.print("integrity: not checked (PostgreSQL)")
    else:
        console.print(f"integrity (SQLite quick_check): {verdict}")
    names = ", ".join(clip(s["id"]) for s in report["sessions"])
    console.print(f"sessions: {names or 'none'}", markup=False)
    if "leases" in report:
        print_leases(console, report["leases"])
    _print_markers(console, report["sessions"])
    _print_retry_off(console, report["sessions"])
    _print_partials(console, partials)
    if report["owed"]:
        for item in report["owed"]:
            console.print(
                f"owed continuation: {clip(item['session'])} cut {clip(item['cut'])} "
                f"({item['remaining']} steps left on {clip(item['model'])})",
                markup=False,
            )
    else:
        console.print("owed continuations: none")
    if report["follow_ups"]:
        for item in report["follow_ups"]:
            console.print(
                f"pending follow-up: {clip(item['session'])} summary {clip(item['row'])} of "
                f"{clip(item['cut'] or '?')} ({item['remaining']!r} steps left on "
                f"{clip(str(item['model']))})",
                markup=False,
            )
    else:
        console.print("pending follow-ups: none")
    print_queue(console, queued, damaged)
    _print_handles(console, handles)
    _print_receipts(records)
    if found.items:
        console.print(f"damaged: {len(found.items)} problems reported (exit 4)")
    return EXIT_DAMAGED if found.items else EXIT_OK


async def _read_report(store: DbStore, session: str | None, found: _Findings) -> dict[str, Any]:
    """Every read of ``inspect``, each going on past what it could not read.

    SQLite's ``quick_check`` on a SQLite store; each session's lease on a PostgreSQL one
    (``leases``; the integrity check is then ``None``: not run).
    """
    integrity = await _integrity(store, found)
    sessions, markers, partials, retry_off, follow_ups = await _sessions(store, session, found)
    leases = None
    if not isinstance(store, SqliteStore):
        leases = await read_leases(store, session, found.add)
    try:
        scan = await store.scan_recoverable()
    except StoreError as error:
        found.add("owed continuations", str(error))
        scan = RecoveryScan()
    for sid, detail in scan.corrupt:
        if session in (None, sid):
            found.add(f"skipped corrupt recovery of session {redact(sid)}", detail)
    for cut in scan.cuts:
        damage = damaged_cut(cut)
        if damage is not None and session in (None, cut.session.id):
            found.add(f"skipped corrupt cut of session {redact(cut.session.id)}", str(damage))
    try:
        query = await store.receipts(session)
    except StoreError as error:
        found.add("receipts", str(error))
        query = ReceiptQuery(records=())
    for op_id, detail in query.corrupt:
        found.add(f"skipped corrupt receipt {redact(op_id)}", detail)
    handles = await _handles(store, session, found)
    queued, damaged = await read_queue(store, session, found.add)
    owed = [row for cut in scan.cuts for row in cut.owed if session in (None, row.session)]
    report: dict[str, Any] = {
        "integrity": integrity,
        "sessions": [_session_row(s, markers.get(s.id), s.id in retry_off) for s in sessions],
        "owed": [
            {
                "session": redact(row.session),
                "row": redact(row.row_id),
                "cut": redact(row.stream),
                "remaining": row.cut.remaining if row.cut else None,
                "model": redact(row.cut.model) if row.cut else None,
            }
            for row in owed
        ],
        "follow_ups": follow_ups,
        "queued": queued,
        "corrupt_queued": damaged,
        "handles": [_handle_row(h) for h in handles],
        "receipts": [_receipt_row(r) for r in query.records],
        "corrupt_receipts": [{"op": redact(op), "detail": redact(d)} for op, d in query.corrupt],
        "records": list(query.records),
        "handle_records": handles,
        "partials": partials,
    }
    if leases is not None:
        report["leases"] = leases
    return report


async def _integrity(store: DbStore, found: _Findings) -> dict[str, Any]:
    """SQLite's ``quick_check``, each problem reported; not run on PostgreSQL (``check: None``)."""
    if not isinstance(store, SqliteStore):
        return {"check": None, "ok": None, "problems": []}
    try:
        problems = await store.quick_check()
    except StoreError as error:
        problems = [str(error)]
    for problem in problems:
        found.add("quick_check", problem)
    return {"check": "quick_check", "ok": not problems, "problems": problems}


async def _handles(store: DbStore, session: str | None, found: _Findings) -> list[HandleRecord]:
    """The delegated handles (every one, or those ``session`` owns or runs), by id."""
    filters = [{}] if session is None else [{"owner": session}, {"target": session}]
    records: dict[str, HandleRecord] = {}
    corrupt: dict[str, str] = {}
    for where in filters:
        try:
            query = await store.handles(**where)
        except StoreError as error:
            found.add("delegated handles", str(error))
            query = HandleQuery()
        records.update((record.handle_id, record) for record in query.records)
        corrupt.update(query.corrupt)
    for handle_id, detail in sorted(corrupt.items()):
        found.add(f"skipped corrupt handle {handle_id}", detail)
    return [records[key] for key in sorted(records)]


def _print_handles(console: Console, handles: list[HandleRecord]) -> None:
    """One line per handle: who delegated to whom, and what it waits on or how it settled."""
    if not handles:
        console.print("delegated handles: none")
        return
    console.print(f"delegated handles: {len(handles)}")
    for record in handles:
        head = (
            f"  {_shown(record.handle_id)}: {_shown(record.owner)} → {_shown(record.target)} "
            f"(turn {_shown(record.turn_id)})"
        )
        if record.status is HandleStatus.ACTIVE:
            waiting = ", ".join(_shown(stream) for stream in record.deferred)
            state = f"active: waiting on {waiting}" if waiting else "active: running"
        else:
            state = f"settled {record.status.value}: {_shown(record.reason or '')}"
            if not record.delivered:
                state += " (not yet delivered)"
        console.print(f"{head}, {state}", markup=False, soft_wrap=True)  # stored text, one line
        if record.report is not None:
            report = f"    {_shown(record.handle_id)} report: {_shown(record.report)}"
            console.print(report, markup=False, soft_wrap=True)


def _session_row(
    record: SessionRecord, marker: AbandonMarker | None, retry_off: bool
) -> dict[str, Any]:
    """A session as ``inspect --json`` shows it; ``auto_retry`` only when it is off (AS-32)."""
    row: dict[str, Any] = {
        "id": redact(record.id),
        "model": redact(record.model),
        "abandon": _marker(marker),
    }
    if retry_off:
        row["auto_retry"] = False
    return row


def _marker(marker: AbandonMarker | None) -> dict[str, str | None] | None:
    """An abandon marker as ``inspect --json`` shows it (redacted), or ``None``."""
    if marker is None:
        return None
    row = None if marker.user_row is None else redact(marker.user_row)
    return {"reason": redact(marker.reason), "user_row": row}


def _print_markers(console: Console, sessions: list[dict[str, Any]]) -> None:
    """One line per abandon marker (PS-8): the session, the user row, why it was given up."""
    marked = [(s["id"], s["abandon"]) for s in sessions if s["abandon"] is not None]
    if not marked:
        console.print("abandoned turns: none")
        return
    console.print(f"abandoned turns (not retried at startup): {len(marked)}")
    for sid, marker in marked:  # redacted already
        row = "" if marker["user_row"] is None else f" (user row {clip(marker['user_row'])})"
        reason = clip(marker["reason"]).replace("\n", " ⏎ ")
        console.print(f"  {clip(sid)}{row}: {reason}", markup=False, soft_wrap=True)


def _print_retry_off(console: Console, sessions: list[dict[str, Any]]) -> None:
    """One line per session whose auto-retry preference is off (AS-32); none when it is on."""
    for entry in sessions:
        if entry.get("auto_retry") is False:
            console.print(f"auto-retry: off for session {clip(entry['id'])}", markup=False)


def _print_partials(console: Console, partials: dict[str, tuple[StoredPartial, ...]]) -> None:
    """One line per stored partial (B4): its stream, how many parts, where a gap stops it."""
    for sid, stored in partials.items():
        for partial in stored:
            gap = "" if partial.gap is None else f", gap at {partial.gap}"
            count = len(partial.parts)
            console.print(
                f"partial: stream {_shown(partial.stream)} of session {_shown(sid)}, "
                f"{count} part{'' if count == 1 else 's'}{gap}",
                markup=False,
            )


async def _sessions(
    store: DbStore, session: str | None, found: _Findings
) -> tuple[
    list[SessionRecord],
    dict[str, AbandonMarker],
    dict[str, tuple[StoredPartial, ...]],
    set[str],
    list[dict[str, Any]],
]:
    """The sessions (every one, or ``session``), each read whole to find its damaged rows.

    With each session's abandon marker, by id (a damaged one fails its session's load and is
    reported so), its stored partials (B4), and the sessions whose auto-retry preference is
    off (AS-32: a damaged one reads as off and is reported), and the compaction follow-ups
    still pending on a summary row (AS-37: its raw budget, as stored).
    """
    try:
        listed = await store.sessions()
    except StoreError as error:
        found.add("sessions", str(error))
        listed = SessionList()
    for sid, detail in listed.corrupt:
        if session in (None, sid):
            found.add(f"skipped corrupt session {sid}", detail)
    sessions = [s for s in listed if session in (None, s.id)]
    markers: dict[str, AbandonMarker] = {}
    partials: dict[str, tuple[StoredPartial, ...]] = {}
    retry_off: set[str] = set()
    follow_ups: list[dict[str, Any]] = []
    for record in sessions:
        try:
            loaded = await store.load(record.id)
        except (CorruptRecord, StoreError) as error:
            found.add(f"session {record.id} cannot be loaded", str(error))
            continue
        if loaded is None:
            continue
        if loaded.abandon is not None:
            markers[record.id] = loaded.abandon
        if loaded.partials:
            partials[record.id] = loaded.partials
        if not loaded.auto_retry:
            retry_off.add(record.id)
        follow_ups += _pending_follow_ups(loaded)
        _report_load(record.id, loaded, found)
    return sessions, markers, partials, retry_off, follow_ups


def _pending_follow_ups(loaded: SessionLoad) -> list[dict[str, Any]]:
    """The follow-ups pending on a session's summary rows (B7), as ``inspect`` shows them."""
    pending: list[dict[str, Any]] = []
    for row in loaded.rows:
        if row.kind is not RowKind.SUMMARY:
            continue
        try:
            follow = decode_body(row).follow_up
        except CorruptRecord:
            continue  # reported with the session's other unreadable rows
        if follow is None:
            continue
        pending.append(
            {
                "session": redact(row.session),
                "row": redact(row.row_id),
                "cut": redact(row.stream) if row.stream else None,
                "remaining": follow.get("step_budget"),
                "model": redact(str(follow.get("model"))),
            }
        )
    return pending


def _report_load(sid: str, loaded: SessionLoad, found: _Findings) -> None:
    """Report what a session's load read past, each as damage.

    A settled cut's damaged record, a damaged auto-retry preference (read as off, AS-32), a
    row the session cannot read.
    """
    for key, detail in loaded.corrupt:
        if key == RETRY_SETTINGS and detail.startswith(f"{RETRY_SETTINGS}["):
            found.add(f"damaged auto-retry preference of session {sid}", detail)
        else:
            found.add(f"skipped corrupt cut record of {key}", detail)
    damaged = unreadable(loaded.rows)
    if damaged is not None:
        found.add(f"session {sid} has an unreadable row", damaged)
