"""Startup recovery of owed cuts (PS-6, R60, R61): a pure plan per scanned session.

A crash may leave a turn cut at a tool boundary with its continuation owed: the row that ended
the cut stream carries the durable cut record in state ``owed``. A new engine scans the store
once (:meth:`persistence.Store.scan_recoverable`, which only reads rows) and, for each such
session, decides here:

* the owed row is the session's tail (only sentinels or system rows after it, PS-6): rebuild
  the marker from the durable record (budget, model, fallback progress, correlation, goal
  attribution) and let the normal idle sweep resume it (``recovered`` ``resume``);
* the record says zero steps remain (R65), or an answer follows it (the turn moved on and a
  void was lost): nothing is owed; void the record (``recovered`` ``abandon``);
* a user row follows it and nothing answered it (the crash came between a dispatched entry's
  durable row and its stream): that row passed its send's point of no return, so it decided
  the turn's fate as it would have live (AS-8, R35). A row that continues the cut turn (a
  wake, or an entry of the cut's correlation) gets its stream from the resume, under the cut's
  budget, the row being the request's last word; any other row superseded the cut: the record
  is withdrawn (``recovered`` ``abandon``) and answering that row is the startup retry's
  (PS-4, not built);
* the cut's model is not one this engine runs, or it says more steps remain than one turn
  has here (``max_stream_steps``): nothing can resume it here; the record stays owed,
  untouched, for an engine that can (``recovered`` ``abandon``).

Older rows of the same session still marked owed are voided (only the latest cut can be owed).
A record that fails validation never reaches this module: the store reports it as corrupt and
the engine abandons that session's recovery with the store's message (R61), writing nothing.
What the store cannot know is checked here (:func:`damaged_cut`): the owed row's stream must be
one of its session's (``{session}/{n}``), else the row is damaged, reported the same way and
left owed.
A damaged history row is found where the resume reads the history (recovery itself stays one
scan): that resume is given up at once, logged with the row named and nothing written, so the
record stays owed for a person to repair, instead of a resume that fails on every attempt and
forfeits the turn. Other sessions are recovered regardless. :func:`unreadable` names the first
damaged body of a history (``turnkeeper inspect`` reports it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent_session._continuation import Marker
from agent_session._rows import decode_body
from message_queue import Correlation, EntryKind, SendOptions
from persistence import (
    CorruptRecord,
    CutRecord,
    CutState,
    HistoryRow,
    RecoverableCut,
    RowKind,
    clip,
)
from stream_manager import ModelFallbackProgress

#: Rows that may follow the owed row while the cut is still at the tail (PS-6).
TAIL_KINDS = frozenset({RowKind.SENTINEL, RowKind.SYSTEM})


@dataclass(frozen=True, slots=True)
class Resume:
    """Owe the rebuilt marker and let the sweep resume it."""

    marker: Marker
    row_id: str
    stale: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Abandon:
    """Resume nothing; end the listed rows' records (none when the record must stay).

    The latest record ends ``state`` (``voided`` unless a later row superseded it: then
    ``withdrawn``, R35); stale ones are always voided.
    """

    why: str
    void: tuple[str, ...]
    state: CutState = CutState.VOIDED


RecoveryPlan = Resume | Abandon


def marker_from(cut: CutRecord, stream: str) -> Marker:
    """The in-memory marker a durable cut record stands for (PS-6)."""
    correlation = None
    if cut.handle_id is not None and cut.owner_session is not None and cut.turn_id is not None:
        correlation = Correlation(
            handle_id=cut.handle_id, owner_session=cut.owner_session, turn_id=cut.turn_id
        )
    return Marker(
        cut=stream,
        model=cut.model,
        step_budget=cut.remaining,
        progress=ModelFallbackProgress(
            requested_model=cut.requested_model,
            refused_models=cut.refused_models,
            chain=cut.chain,
        ),
        options=SendOptions(model=cut.model),
        correlation=correlation,
        goal_kind=cut.goal_kind,
        goal_id=cut.goal_id,
    )


def own_stream(session: str, stream: str) -> bool:
    """Whether ``stream`` is a stream id of ``session``: ``{session}/{n}``, ``n`` a number."""
    head, _, number = stream.rpartition("/")
    return head == session and number.isascii() and number.isdigit()


def damaged_cut(found: RecoverableCut) -> CorruptRecord | None:
    """What is wrong with a session's owed rows that only this layer can tell (R61), or ``None``.

    Each owed row's stream must be one of its session's: a number the next stream is counted
    from, and the stream the record's continuation belongs to.
    """
    for row in found.owed:
        if row.stream is not None and not own_stream(row.session, row.stream):
            key = f"{clip(row.session)}/{clip(row.row_id)}"
            detail = f"$.stream: {clip(repr(row.stream))} is not a stream of this session"
            return CorruptRecord("history_rows", key, detail)
    return None


def plan_recovery(
    found: RecoverableCut, models: frozenset[str], ceiling: int | None = None
) -> RecoveryPlan:
    """What startup recovery does with one session's latest owed cut.

    The store hands over rows only (``Store.scan_recoverable``); this is the one place that
    reads them: the last owed row is the live cut, the earlier owed ones are stale, and the
    first row after it that is neither a sentinel nor a system row is what moved the
    conversation on, if anything did. ``ceiling`` is one turn's step ceiling here
    (``max_stream_steps``): a cut that says more remain is left owed.
    """
    row, cut = found.row, found.row.cut
    assert cut is not None  # the scan returns rows with an owed record only
    damage = damaged_cut(found)
    if damage is not None:  # R61: reported, nothing written: the record stays owed
        return Abandon(str(damage), ())
    stale = tuple(earlier.row_id for earlier in found.owed[:-1])
    everything = (*stale, row.row_id)
    name = clip(row.row_id)
    if row.stream is None:
        return Abandon(f"the owed row {name} names no stream", everything)
    moved_on = [later for later in found.after if later.kind not in TAIL_KINDS]
    answer = next((later.kind for later in moved_on if later.kind is not RowKind.USER), None)
    if answer is not None:
        return Abandon(
            f"the cut on {name} is not the tail: a {answer.value} row follows it",
            everything,
        )
    follower = moved_on[0] if moved_on else None
    try:
        superseded = follower is not None and not continues(follower, cut)
    except CorruptRecord as error:  # R61: never read as "nothing follows"; nothing written
        return Abandon(f"the row after the cut on {name} is unreadable: {error}", ())
    if superseded:
        assert follower is not None
        return Abandon(
            f"the cut on {name} was superseded by {clip(follower.row_id)} (R35); answering "
            "that row is startup retry's (PS-4), which this engine does not do",
            everything,
            CutState.WITHDRAWN,
        )
    if cut.remaining <= 0:
        return Abandon(f"the cut on {name} has no steps left (R65)", everything)
    if cut.model not in models:
        return Abandon(
            f"the cut on {name} ran model {clip(repr(cut.model))}, which this engine does not "
            "have; left owed",
            stale,
        )
    if ceiling is not None and cut.remaining > ceiling:
        return Abandon(
            f"the cut on {name} says {cut.remaining} steps remain, more than one turn has here "
            f"(max_stream_steps {ceiling}); left owed",
            stale,
        )
    return Resume(marker=marker_from(cut, row.stream), row_id=row.row_id, stale=stale)


def unreadable(rows: Sequence[HistoryRow]) -> str | None:
    """Why a resume could not stream from ``rows`` (the first damaged body), or ``None``."""
    for row in rows:
        try:
            decode_body(row)
        except CorruptRecord as error:
            return str(error)
    return None


def continues(follower: HistoryRow, cut: CutRecord) -> bool:
    """AS-8: a wake row, or a row with the cut's correlation, continues the cut turn."""
    body = decode_body(follower)
    if body.entry_kind == EntryKind.WAKE.value:
        return True
    correlation = body.correlation
    return (
        correlation is not None
        and cut.handle_id is not None
        and (correlation.handle_id, correlation.owner_session, correlation.turn_id)
        == (cut.handle_id, cut.owner_session, cut.turn_id)
    )
