"""The crash-point sweep's recovery: a new engine on the file a killed process left.

Run in a process that never had the file open: ``PRAGMA integrity_check`` and a read-only look
at the store as the kill left it, then an :class:`~agent_session.Engine` with startup recovery
on, the scenario's tools and ``[engine]`` table, a ``VirtualClock`` and every model id answering
any request with text (a :class:`~stream_manager.FunctionModel`), driven to quiescence by the
harness's driver within the scenario's ``[limits]``; then a second look. What it saw is a
:class:`~agent_session.harness.crashcheck.RecoveryFacts` for the checker.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path

import msgspec

from agent_session._engine import Engine
from agent_session._rows import decode_body
from agent_session.harness.crashcheck import EventData, OwedCut, RecoveryFacts
from agent_session.harness.crashturns import OpKey, QueuedMessage, UserRowText
from agent_session.harness.fakes import Faults, FaultyStore, ScenarioTool
from agent_session.harness.runner import engine_config
from agent_session.harness.scenario import Scenario
from agent_session.harness.virtual_time import VirtualTime, busy_sessions
from message_queue import decode_entry
from persistence import (
    CorruptRecord,
    HistoryRow,
    OpState,
    RowKind,
    SqliteStore,
    TurnkeeperError,
    UsageError,
)
from stream_manager import FunctionModel, ScriptStep, VirtualClock


def _answering(model_id: str) -> FunctionModel:
    """A model that answers any request with the text ``recovered`` and stops."""
    return FunctionModel(model_id, lambda request: ScriptStep(text="recovered"))


async def recover(scenario: Scenario, db: Path) -> RecoveryFacts:
    """Look at ``db`` as the kill left it, recover it with a new engine, look again."""
    facts = RecoveryFacts(integrity=integrity(db))
    try:
        await _look_after_kill(db, facts)
    except TurnkeeperError as error:
        facts.open_error = f"{type(error).__name__}: {error}"
        return facts
    with _quiet_logs():
        await _recover(scenario, db, facts)
    facts.integrity_after_recovery = integrity(db)
    try:
        await _look_after_recovery(db, facts)
    except TurnkeeperError as error:
        facts.reopen_error = f"{type(error).__name__}: {error}"
    return facts


@contextmanager
def _quiet_logs() -> Iterator[None]:
    """The recovery engine's warnings (an abandoned recovery, ...) are the findings' business."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


def integrity(db: Path) -> str:
    """``PRAGMA integrity_check`` on a read-only connection: ``ok``, or what it found."""
    try:
        uri = f"{db.resolve().as_uri()}?mode=ro"
        with closing(sqlite3.connect(uri, uri=True)) as connection:
            rows = connection.execute("PRAGMA integrity_check").fetchall()
    except sqlite3.Error as error:
        return f"{type(error).__name__}: {error}"
    return "; ".join(str(row[0]) for row in rows)


async def _user_rows(store: SqliteStore) -> tuple[dict[str, bytes], dict[str, UserRowText]]:
    """Every user row's body, and its session and text, by row id.

    A body that does not decode has no text here: damage is the ``store`` check's business.
    """
    rows: dict[str, bytes] = {}
    texts: dict[str, UserRowText] = {}
    for session in await store.sessions():
        loaded = await store.load(session.id)
        for row in () if loaded is None else loaded.rows:
            if row.kind is RowKind.USER:
                rows[row.row_id] = row.body
                try:
                    texts[row.row_id] = UserRowText(session=row.session, text=decode_body(row).text)
                except CorruptRecord:
                    continue
    return rows, texts


async def _queued(store: SqliteStore) -> list[QueuedMessage]:
    """One item per add of every stored entry that decodes (damage is reported elsewhere)."""
    found: list[QueuedMessage] = []
    for record in (await store.queued()).records:
        key = f"{record.session}/{record.entry_id}"
        try:
            entry = decode_entry(record.body, key)
        except CorruptRecord:
            continue
        found.extend(
            QueuedMessage(
                session=record.session,
                entry=entry.id,
                message=add.id,
                text=add.text,
                user_authored=entry.user_authored,
                withdrawn=entry.withdrawn,
            )
            for add in entry.messages
        )
    return found


async def _ops(store: SqliteStore) -> list[OpKey]:
    return [
        OpKey(op=r.op_id, session=r.session, capability=r.capability.text, target=r.target)
        for r in (await store.receipts()).records
    ]


async def _corrupt(store: SqliteStore, when: str) -> list[tuple[str, str]]:
    found = [(f"receipt {op} ({when})", detail) for op, detail in (await store.receipts()).corrupt]
    listed = await store.sessions()  # a damaged session record is skipped there, never missed
    found.extend((f"session {sid} ({when})", detail) for sid, detail in listed.corrupt)
    scan = await store.scan_recoverable()
    found.extend((f"cut of session {sid} ({when})", detail) for sid, detail in scan.corrupt)
    return found


async def _look_after_kill(db: Path, facts: RecoveryFacts) -> None:
    async with SqliteStore(db, readonly=True) as store:
        facts.user_rows_after_kill, facts.texts_after_kill = await _user_rows(store)
        facts.queued_after_kill = await _queued(store)
        facts.owed_after_kill = [
            str(row.stream) for found in (await store.scan_recoverable()).cuts for row in found.owed
        ]
        facts.corrupt.extend(await _corrupt(store, "after the kill"))
        queue = await store.queued()
        facts.corrupt.extend((f"queued entry {k} (after the kill)", w) for k, w in queue.corrupt)


async def _look_after_recovery(db: Path, facts: RecoveryFacts) -> None:
    async with SqliteStore(db, readonly=True) as store:
        facts.user_rows_after_recovery, facts.texts_after_recovery = await _user_rows(store)
        facts.queued_after_recovery = await _queued(store)
        facts.ops_after_recovery = await _ops(store)
        facts.corrupt.extend(await _corrupt(store, "after recovery"))
        for found in (await store.scan_recoverable()).cuts:
            loaded = await store.load(found.session.id)
            history = () if loaded is None else loaded.rows
            for row in found.owed:
                facts.owed_after_recovery.append(
                    OwedCut(
                        session=row.session,
                        row_id=row.row_id,
                        stream=row.stream,
                        unanswered_user=_unanswered_user(row, history),
                    )
                )
        still_open = await store.receipts(states=frozenset({OpState.REQUESTED, OpState.RUNNING}))
        facts.open_ops_after_recovery = [(r.op_id, r.state.value) for r in still_open.records]
        handles = await store.handles()
        facts.handles_after_recovery = [(r.handle_id, r.status.value) for r in handles.records]
        facts.corrupt.extend(
            (f"handle {key} (after recovery)", why) for key, why in handles.corrupt
        )


def _unanswered_user(owed: HistoryRow, history: Sequence[HistoryRow]) -> bool:
    """Only user rows follow the owed row (besides sentinels and system rows)."""
    after = [
        row.kind
        for row in history
        if row.seq > owed.seq and row.kind not in (RowKind.SENTINEL, RowKind.SYSTEM)
    ]
    return bool(after) and all(kind is RowKind.USER for kind in after)


async def _recover(scenario: Scenario, db: Path, facts: RecoveryFacts) -> None:
    """Startup recovery by a new engine, driven to quiescence on virtual time."""
    clock = VirtualClock()
    store = FaultyStore(SqliteStore(db), Faults())
    tools = {t.name: ScenarioTool(t, clock) for t in scenario.tools}
    events = facts.recovery_events
    engine = Engine(
        store=store,
        models={m.id: _answering(m.id) for m in scenario.models},
        tools={name: tool for name, tool in tools.items() if tool.kind.value != "provider"},
        fallbacks={m.id: m.fallbacks for m in scenario.models},
        clock=clock,
        config=engine_config(scenario),  # recovers at start (the default)
        observers=(lambda event: events.append(msgspec.to_builtins(event)),),
    )
    started = False
    try:
        async with engine:
            started = True
            facts.recovery_error = await _quiesce(scenario, engine, store, clock, events)
            for tool in tools.values():  # nothing of the dead process may hold the exit
                tool.abandon()
    except Exception as error:
        what = f"{type(error).__name__}: {error}"
        if not started and isinstance(error, TurnkeeperError) and not isinstance(error, UsageError):
            facts.engine_open_error = what  # opening the store, or reading it at start, failed
        else:
            facts.recovery_error = f"the recovery engine raised {what}"


async def _quiesce(
    scenario: Scenario,
    engine: Engine,
    store: FaultyStore,
    clock: VirtualClock,
    events: Sequence[EventData],
) -> str | None:
    """Move virtual time with the harness's driver, within the scenario's limits."""
    limits = scenario.limits

    def too_many_events() -> bool:
        if len(events) > limits.max_events:
            raise _OverLimit(
                f"recovery emitted more than {limits.max_events} events (limits.max_events)"
            )
        return False

    def within_limits(deadline: float) -> None:
        if deadline * 1000 > limits.max_virtual_ms:
            raise _OverLimit(
                f"recovery found no quiescence within {limits.max_virtual_ms} virtual ms"
            )

    try:
        await VirtualTime(clock, store=store).advance(stop=too_many_events, check=within_limits)
    except _OverLimit as over:
        return str(over)
    busy = busy_sessions(engine)
    if busy:
        return "the recovery engine did not reach quiescence: " + "; ".join(busy)
    return None


class _OverLimit(Exception):
    """The recovery went past the scenario's ``[limits]``."""
