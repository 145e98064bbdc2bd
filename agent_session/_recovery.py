"""Startup recovery of owed cuts (PS-6, R60, R61): a pure plan per scanned session.

A crash may leave a turn cut at a tool boundary with its continuation owed: the row that ended
the cut stream carries the durable cut record in state ``owed``. A new engine scans the store
once (:meth:`persistence.Store.recoverable`) and, for each such session, decides here:

* the owed row is the session's tail (only sentinels or system rows after it, PS-6): rebuild
  the marker from the durable record (budget, model, fallback progress, correlation, goal
  attribution) and let the normal idle sweep resume it (``recovered`` ``resume``);
* the record says zero steps remain (R65), or an answer follows it (the turn moved on and a
  void was lost): nothing is owed; void the record (``recovered`` ``abandon``);
* a user row follows it and nothing answered it (the crash came between a dispatched entry's
  row and its stream): whether that row continued the turn or superseded it is the startup
  retry's question (PS-4, not built): the record stays owed (``recovered`` ``abandon``);
* the cut's model is not one this engine runs: nothing can resume it here; the record stays
  owed, untouched, for an engine that can (``recovered`` ``abandon``).

Older rows of the same session still marked owed are voided (only the latest cut can be owed).
A record that fails validation never reaches this module: the store reports it as corrupt and
the engine abandons that session's recovery with the store's message (R61), writing nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent_session._continuation import Marker
from message_queue import Correlation, SendOptions
from persistence import CutRecord, RecoverableCut, RowKind
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
    """Resume nothing; void the listed rows' records (none when the record must stay)."""

    why: str
    void: tuple[str, ...]


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


def plan_recovery(found: RecoverableCut, models: frozenset[str]) -> RecoveryPlan:
    """What startup recovery does with one session's latest owed cut."""
    row, cut = found.row, found.row.cut
    assert cut is not None  # the scan returns rows with an owed record only
    everything = (*found.stale, row.row_id)
    if row.stream is None:
        return Abandon(f"the owed row {row.row_id} names no stream", everything)
    moved_on = [kind for kind in found.trailing if kind not in TAIL_KINDS]
    if any(kind is not RowKind.USER for kind in moved_on):
        answer = next(kind for kind in moved_on if kind is not RowKind.USER)
        return Abandon(
            f"the cut on {row.row_id} is not the tail: a {answer.value} row follows it",
            everything,
        )
    if moved_on:
        return Abandon(
            f"the cut on {row.row_id} is followed by a user row no stream answered; restarting "
            "from it is startup retry's (PS-4), which this engine does not do: left owed",
            found.stale,
        )
    if cut.remaining <= 0:
        return Abandon(f"the cut on {row.row_id} has no steps left (R65)", everything)
    if cut.model not in models:
        return Abandon(
            f"the cut on {row.row_id} ran model {cut.model!r}, which this engine does not have; "
            "left owed",
            found.stale,
        )
    return Resume(marker=marker_from(cut, row.stream), row_id=row.row_id, stale=found.stale)
