"""Small builders for store tests."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import TYPE_CHECKING

from persistence import CutRecord, CutState, HistoryRow, RowKind, SessionRecord, TurnEnvelope
from persistence.records import Capability, ToolKind

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def session(
    sid: str = "s1", *, model: str = "alpha", created_seq: int = 0, goal: str | None = None
) -> SessionRecord:
    return SessionRecord(id=sid, model=model, created_seq=created_seq, goal=goal)


def cut(remaining: int = 3, state: CutState = CutState.OWED) -> CutRecord:
    return CutRecord(
        remaining=remaining,
        model="beta",
        requested_model="alpha",
        refused_models=("alpha",),
        chain=("gamma",),
        handle_id="h1",
        owner_session="ow",
        turn_id="t1",
        goal_kind="objective",
        goal_id="g1",
        state=state,
    )


def row(
    seq: int,
    row_id: str | None = None,
    *,
    sid: str = "s1",
    kind: RowKind = RowKind.USER,
    body: bytes | None = None,
    stream: str | None = None,
    cut: CutRecord | None = None,
) -> HistoryRow:
    return HistoryRow(
        session=sid,
        seq=seq,
        row_id=row_id if row_id is not None else f"r{seq}",
        kind=kind,
        body=body if body is not None else b'{"text":"m%d"}' % seq,
        stream=stream,
        cut=cut,
    )


def envelope(stream: str = "st1", *, sid: str = "s1", budget: int = 8) -> TurnEnvelope:
    return TurnEnvelope(
        session=sid, stream=stream, model="alpha", budget=budget, cause="user", handle=None
    )


@contextlib.contextmanager
def plain_sqlite(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain ``sqlite3`` connection (autocommit), closed afterwards: the test's hand tools."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file in a folder, name -> bytes: to prove an open left a file untouched."""
    return {entry.name: entry.read_bytes() for entry in sorted(folder.iterdir())}


def client(name: str = "noop") -> Capability:
    """The capability of a client tool called ``name`` (stored as ``client:NAME``)."""
    return Capability(kind=ToolKind.CLIENT, name=name)
