"""What each durable write of a session holds: the ``Commit`` effects the turn machine decides.

The machine decides *that* something becomes durable and what follows (the ``then`` and
``failed`` inputs); these pure builders say what the boundary holds and what is told after
``COMMIT`` (``docs/architecture.md``, "Every durable write"). A row is always the machine's
(it numbers them); nothing here reads or changes a session's state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from agent_session import _inputs as _in
from agent_session._effects import Commit
from persistence import Boundary, CutStateChange, TurnEnvelope
from stream_manager import Persisted

if TYPE_CHECKING:
    from agent_session._cut_records import CutChange
    from agent_session._events import EngineEvent
    from agent_session._turn import StreamContext
    from persistence import HistoryRow
    from stream_manager import StreamInfo


def appended(
    row: HistoryRow,
    reported: str,
    *,
    then: _in.Input | None,
    failed: _in.WriteFailure,
    what: str,
) -> Commit:
    """``row`` appended to history, told ``persisted reported`` once durable."""
    persisted = Persisted(session=row.session, what=reported, id=row.row_id)
    return Commit(Boundary(rows=(row,)), tell=(persisted,), then=then, failed=failed, what=what)


def removed(
    row_ids: tuple[str, ...],
    what: str,
    *,
    then: _in.Input | None = None,
    failed: _in.WriteFailure,
    exact: bool = False,
) -> Commit:
    """History rows deleted (nothing is told: a deletion has no ``persisted`` report)."""
    return Commit(Boundary(delete=row_ids), then=then, failed=failed, what=what, exact=exact)


def records(
    session: str, changes: tuple[CutChange, ...], then: _in.Input, failed: _in.WriteFailure
) -> Commit:
    """One boundary for cut-record ``changes`` (PS-6); each reported, then told, in order."""
    tell: list[EngineEvent] = []
    for change in changes:
        tell.append(Persisted(session=session, what="cut-void", id=change.row_id))
        if change.told is not None:
            tell.append(change.told)
    moved = tuple(CutStateChange(row_id=c.row_id, state=c.state) for c in changes)
    boundary = Boundary(cut_states=moved)
    return Commit(boundary, tell=tuple(tell), then=then, failed=failed, what="cut record")


def with_records(commit: Commit, session: str, changes: tuple[CutChange, ...]) -> Commit:
    """``commit`` with the record ``changes`` riding in its boundary (one transaction).

    The changes are told after the commit's own report; its results are wrapped so the
    machine settles both (``WithRecords``).
    """
    riding = records(session, changes, _in.Ignored(), _in.Ignored())
    boundary = msgspec.structs.replace(
        commit.boundary, cut_states=(*commit.boundary.cut_states, *riding.boundary.cut_states)
    )
    return msgspec.structs.replace(
        commit,
        boundary=boundary,
        tell=(*commit.tell, *riding.tell),
        then=_in.WithRecords(commit.then, changes),
        failed=_in.WithRecords(commit.failed, changes),
    )


def envelope(info: StreamInfo, context: StreamContext, after_seq: int) -> Commit:
    """B3: the durable turn envelope of the stream ``info`` describes.

    Its history ends at ``after_seq``: a startup retry tells by it which turn it was running.
    """
    written = TurnEnvelope(
        session=info.session,
        stream=info.stream,
        model=info.model,
        budget=info.budget,
        cause=context.cause.value,
        handle=context.correlation.handle_id if context.correlation else None,
        after_seq=after_seq,
    )
    persisted = Persisted(session=info.session, what="envelope", id=info.stream)
    return Commit(
        Boundary(envelope=written), tell=(persisted,), failed=_in.AnswerError(), what="envelope"
    )
