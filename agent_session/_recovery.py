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
  (PS-4, below);
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent_session._compaction import FollowUp, read_follow_up
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
    SessionTail,
    clip,
)
from stream_manager import ModelFallbackProgress, StartCause

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
    #: The turn is given up (R61 damage, R65 nothing left): told ``retry-abandoned`` too.
    gives_up: bool = False


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
        return Abandon(str(damage), (), gives_up=True)
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
        why = f"the row after the cut on {name} is unreadable: {error}"
        return Abandon(why, (), gives_up=True)
    if superseded:
        assert follower is not None
        return Abandon(
            f"the cut on {name} was superseded by {clip(follower.row_id)} (R35); the startup "
            "retry answers that row (PS-4)",
            everything,
            CutState.WITHDRAWN,
        )
    if cut.remaining <= 0:
        return Abandon(f"the cut on {name} has no steps left (R65)", everything, gives_up=True)
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


# ------------------------------------------------------------ startup retry (PS-4, PS-5)


@dataclass(frozen=True, slots=True)
class Retry:
    """Take the interrupted turn up again: owe ``marker`` (no durable record) and sweep it.

    ``anchor``: the row the turn answers (an abandon marker of the retried turn names it).
    """

    marker: Marker
    why: str
    anchor: str | None = None


@dataclass(frozen=True, slots=True)
class NoRetry:
    """Leave the unanswered turn as it is, saying why (``retry-abandoned``, PS-8, R61).

    ``anchor``: the row the turn answered (its abandon marker names it, so the next startup
    does not plan it again). ``quiet``: decided before (a stored abandon marker, a cut that
    already ended): nothing to write or tell.
    """

    why: str
    anchor: str | None = None
    quiet: bool = False


@dataclass(frozen=True, slots=True)
class FollowUpRecovery:
    """PS-7: owe the follow-up a crash left pending on summary ``row``; the sweep runs it."""

    marker: Marker
    row: HistoryRow
    why: str


@dataclass(frozen=True, slots=True)
class DropFollowUp:
    """PS-7, R48: the pending follow-up on ``row`` cannot run: clear it, saying why."""

    row: HistoryRow
    why: str


RetryPlan = Retry | NoRetry


def plan_follow_up(
    tail: SessionTail, summary: HistoryRow, *, models: frozenset[str], ceiling: int
) -> FollowUpRecovery | DropFollowUp | NoRetry:
    """PS-7: a history that ends on a summary row with a pending follow-up (B7, then a crash).

    The follow-up runs under what it persisted (R40, R48): a budget that is not a
    non-negative integer, or 0, drops it (never a fresh ceiling); a model this engine does
    not run leaves it pending for one that does.
    """
    name = clip(summary.row_id)
    try:
        pending = decode_body(summary).follow_up
    except CorruptRecord as error:  # R61: reported, left as it is
        return NoRetry(f"the summary {name} is unreadable: {error}", summary.row_id)
    if pending is None:
        return NoRetry(f"the summary {name} owes no follow-up", quiet=True)
    follow = read_follow_up(pending)
    if isinstance(follow, str):
        return DropFollowUp(summary, f"the follow-up on {name} is dropped: {follow}")
    if follow.model not in models:
        why = f"the follow-up on {name} runs model {clip(repr(follow.model))}, not run here"
        return NoRetry(why, summary.row_id)
    if follow.step_budget > ceiling:
        why = f"the follow-up on {name} says {follow.step_budget} steps remain, more than {ceiling}"
        return NoRetry(why, summary.row_id)
    cut = summary.stream or f"{tail.session.id}/0"
    marker = follow.marker(cut)
    why = f"the follow-up on {name} is pending with {follow.step_budget} steps left"
    return FollowUpRecovery(marker, summary, why)


def steps_done(stream: str, op_ids: Sequence[str]) -> int:
    """How many model steps ``stream`` finished, as far as its receipts tell.

    A step that asked for tools has its calls' receipts written before they run, each op id
    ``{stream}/{step}/{index}``; a step that asked for none ends the stream (its row says so).
    So the highest step with a receipt is a floor of what the stream spent (exact for a
    stream that died before its last step's row).
    """
    done = 0
    prefix = f"{stream}/"
    for op_id in op_ids:
        if op_id.startswith(prefix):
            step, _, _ = op_id[len(prefix) :].partition("/")
            if step.isascii() and step.isdigit():
                done = max(done, int(step))
    return done


def plan_retry(
    tail: SessionTail,
    *,
    spent: int,
    models: frozenset[str],
    ceiling: int,
    chain: Callable[[str], tuple[str, ...]],
) -> RetryPlan:
    """PS-4: whether and how startup takes up a turn a crash interrupted (no cut owed).

    The history's last row that is not a system row is the user's (its turn never ended), a
    ``[CONTINUE]`` sentinel (a resumed stream started and died: its cut record consumed), or
    a partial assistant row with no cut record (a stream aborted by the system). A stored
    abandon marker naming the turn's user row stops it (PS-8). The retry runs under what the
    turn has left: the interrupted stream's envelope budget less the steps it spent
    (``spent``: :func:`steps_done` of its receipts), on the model it started on, with the
    fallback progress and correlation the consumed cut record kept (R57, R58); a turn whose
    stream never started gets the
    ceiling (it spent nothing). Never a fresh budget when the remainder is known; 0 left, or
    a model this engine does not run, leaves it (``retry-abandoned``).
    """
    rows = tail.rows
    last = next((r for r in reversed(rows) if r.kind is not RowKind.SYSTEM), None)
    if last is None:
        return NoRetry("nothing in the history to retry", quiet=True)
    user = next((r for r in reversed(rows) if r.kind is RowKind.USER), None)
    anchor = (user or last).row_id
    cut_row = _consumed_cut(rows, last)
    stopped = _not_retried(tail, last, anchor, cut_row)
    if stopped is not None:
        return NoRetry(stopped, anchor, quiet=True)
    name = clip(anchor)
    try:
        correlation = _correlation_of(user, cut_row)
    except CorruptRecord as error:  # R55: never read as "no correlation"
        return NoRetry(f"the turn of {name} names an unreadable correlation: {error}", anchor)
    follow = _follow_up_row(user)
    if isinstance(follow, str):  # R48: never a fresh ceiling
        return NoRetry(f"the follow-up {name} is dropped: {follow}", anchor)
    cut, remaining, model, why = _left(tail, last, cut_row, ceiling, name, spent, follow)
    if remaining <= 0:
        return NoRetry(f"the turn of {name} has no steps left (R65)", anchor)
    if remaining > ceiling:
        why = f"the turn of {name} says {remaining} steps remain, more than {ceiling}"
        return NoRetry(why, anchor)
    if model not in models:
        return NoRetry(f"the turn of {name} ran model {clip(repr(model))}, not run here", anchor)
    record = cut_row.cut if cut_row is not None else None
    progress = ModelFallbackProgress(
        requested_model=record.requested_model if record else model,
        refused_models=record.refused_models if record else (),
        chain=record.chain if record else chain(model),
    )
    if follow is not None and record is None:  # R40: the follow-up's own progress
        progress = follow.progress
    goal_kind = record.goal_kind if record else None
    goal_id = record.goal_id if record else None
    if record is None and tail.session.goal is not None:
        goal_kind, goal_id = "goal", tail.session.goal
    marker = Marker(
        cut=cut,
        model=model,
        step_budget=remaining,
        progress=progress,
        options=SendOptions(model=model),
        correlation=correlation,
        goal_kind=goal_kind,
        goal_id=goal_id,
        cause=StartCause.RECOVERY,
        durable=False,
    )
    return Retry(marker=marker, why=why, anchor=anchor)


def _not_retried(
    tail: SessionTail, last: HistoryRow, anchor: str, cut_row: HistoryRow | None
) -> str | None:
    """Why the tail's turn is not to be retried (an abandon marker, an ended cut), or ``None``."""
    abandon = tail.abandon
    if abandon is not None and abandon.user_row in (None, anchor):
        return f"the turn of {clip(anchor)} was abandoned: {clip(abandon.reason)} (PS-8)"
    ended = last if last.kind is RowKind.PARTIAL else cut_row
    if ended is not None and ended.cut is not None and ended.cut.state is not CutState.CONSUMED:
        return f"the cut on {clip(ended.row_id)} already ended ({ended.cut.state})"
    return None


def _left(
    tail: SessionTail,
    last: HistoryRow,
    cut_row: HistoryRow | None,
    ceiling: int,
    name: str,
    spent: int,
    follow: FollowUp | None = None,
) -> tuple[str, int, str, str]:
    """The retry's cut id, remaining steps, model and why: what the turn has left."""
    envelope = tail.envelope
    running = envelope is not None and not tail.envelope_ended
    if last.kind is RowKind.PARTIAL:  # the aborted stream is this turn's
        running = envelope is not None and last.stream == envelope.stream
    anchor = tail.rows[0].seq if tail.rows and tail.rows[0].kind is RowKind.USER else None
    if envelope is not None and envelope.after_seq is not None and anchor is not None:
        # a stream constructed before the turn's user row was another turn's (R35: one that
        # a queued message superseded): nothing of this turn was spent
        running = running and envelope.after_seq >= anchor
    if running and envelope is not None:
        remaining = envelope.budget - spent
        why = f"stream {envelope.stream} was interrupted with {remaining} of {envelope.budget}"
        return envelope.stream, remaining, envelope.model, f"{why} steps left"
    if cut_row is not None and cut_row.cut is not None:  # its resume never wrote a start
        cut = cut_row.stream or f"{tail.session.id}/0"
        why = f"the resume of {cut} was interrupted with {cut_row.cut.remaining} steps left"
        return cut, cut_row.cut.remaining, cut_row.cut.model, why
    cut = f"{tail.session.id}/{1 + len(tail.streams)}"
    if follow is not None:  # PS-7: a follow-up row whose stream never started (B8)
        why = f"the follow-up {name} never started its stream: {follow.step_budget} steps left"
        return cut, follow.step_budget, follow.model, why
    return cut, ceiling, tail.session.model, f"the turn of {name} never started a stream"


def _follow_up_row(user: HistoryRow | None) -> FollowUp | str | None:
    """The retry options a follow-up row carries (PS-7), why they are unusable, or ``None``."""
    if user is None:
        return None
    try:
        body = decode_body(user)
    except CorruptRecord:
        return None  # reported where the correlation is read
    if body.entry_kind != "follow-up" or body.follow_up is None:
        return None
    return read_follow_up(body.follow_up)


def _consumed_cut(rows: Sequence[HistoryRow], last: HistoryRow) -> HistoryRow | None:
    """The row whose (consumed) cut record a ``[CONTINUE]`` tail resumed, if it has one."""
    if last.kind is not RowKind.SENTINEL:
        return None
    index = rows.index(last)
    for row in reversed(rows[:index]):
        if row.kind is RowKind.SYSTEM:
            continue
        return row if row.cut is not None else None
    return None


def _correlation_of(anchor: HistoryRow | None, cut_row: HistoryRow | None) -> Correlation | None:
    """The delegated turn the retry works for: the cut record's, else the anchor row's."""
    record = cut_row.cut if cut_row is not None else None
    if record is not None and record.handle_id and record.owner_session and record.turn_id:
        return Correlation(
            handle_id=record.handle_id, owner_session=record.owner_session, turn_id=record.turn_id
        )
    if anchor is None:
        return None
    return decode_body(anchor).correlation
