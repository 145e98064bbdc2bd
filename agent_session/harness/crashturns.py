"""The crash sweep's invariants about turns, messages and operations across a kill (issue 24).

Pure functions over plain data, called by :func:`~agent_session.harness.crashcheck.check_trial`:
the killed child's events (``trace``), the recovery engine's events (``recovery``) and what the
store held after the kill and after recovery. Each returns ``(class, reason)`` pairs:

``in-flight``
    A turn in flight at the kill (a stream started and not ended, or a cut still owed) is
    taken up by recovery: ``recovered`` ``resume`` or ``retry`` for its session followed by
    what takes it up (a stream start, the continuation's end, a launch refused or failed,
    ``retry-abandoned``), or ``recovered`` ``abandon`` or ``retry-abandoned`` with a reason.
``message-lost``
    Every user message sent before the kill is in history or queued after recovery, exactly
    once: a message told durable (``persisted what=queue`` with its id) is after the kill in
    the store's queue, accepted (its entry dequeued and a ``user-row`` persisted), or
    cancelled in the trace; a message accepted into a row durable at the kill is no longer
    queued; a user-authored message queued at the kill is after recovery either still queued
    or in exactly one new user row of its session (a batch's row joins its adds' texts with
    newlines), never cancelled by recovery.
``op-twice``
    No operation runs twice without an ``indeterminate`` receipt between: an ``op-start`` of a
    capability and target (in one session) while an earlier call of the same one has no
    receipt yet, or one that follows an ``indeterminate`` one silently (no ``op-overlap-warned``
    naming it, no resolution in between); or the same operation id started twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

EventData = Mapping[str, Any]
Violation = tuple[str, str]

#: What ends a stream's run in the trace (its row is durable, or it stopped or failed).
_STREAM_ENDS = ("stream-end", "stream-abort", "stream-error")
#: After ``recovered`` ``resume`` or ``retry``: what shows the turn was taken up.
_TAKEN_UP = (
    "stream-start",
    "continuation-ended",
    "retry-abandoned",
    "launch-refused",
    "stream-error",
)


class QueuedMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One add of an entry in the store's durable queue, as the checker reads it."""

    session: str
    entry: str
    message: str
    text: str
    #: A visible entry (MQ-15): the user's own words, never dropped at a restart.
    user_authored: bool
    withdrawn: bool = False


class UserRowText(msgspec.Struct, frozen=True, kw_only=True):
    """A user row's session and text."""

    session: str
    text: str


class OpKey(msgspec.Struct, frozen=True, kw_only=True):
    """An operation's identity for the overlap question: session, capability and target."""

    op: str
    session: str
    capability: str
    target: str


# ------------------------------------------------------------------ in-flight


def in_flight_at_kill(trace: Sequence[EventData]) -> dict[str, list[str]]:
    """Per session, what was in flight when the child died: running streams, owed cuts.

    A restart inside the child (the scenario's own ``crash`` or ``restart``) takes a session
    up with its ``recovered`` or ``retry-abandoned``; what it starts afterwards counts anew.
    """
    streams: dict[str, str] = {}
    owed: dict[str, list[str]] = {}
    retries: dict[str, str] = {}  # a failed stream's retry waits out its backoff (AS-32)
    for event in trace:
        name, session = event.get("event"), str(event.get("session"))
        if name in ("recovered", "retry-abandoned"):
            streams.pop(session, None)
            owed.pop(session, None)
            retries.pop(session, None)
        elif name == "retry-scheduled":
            retries[session] = str(event.get("stream"))
        elif name == "compaction" and event.get("outcome") == "summarized":
            retries[session] = str(event.get("stream"))  # its follow-up is owed (AS-37)
        else:
            if name == "stream-start":
                retries.pop(session, None)
            _follow_stream(event, session, streams)
            _follow_cut(event, session, owed)
    found: dict[str, list[str]] = {}
    for session, stream in streams.items():
        found.setdefault(session, []).append(f"stream {stream} was running")
    for session, failed in retries.items():
        found.setdefault(session, []).append(f"the retry or follow-up of {failed} was owed")
    for session, cuts in owed.items():
        found.setdefault(session, []).extend(f"cut {cut} was owed" for cut in cuts)
    return found


def _follow_stream(event: EventData, session: str, streams: dict[str, str]) -> None:
    name = event.get("event")
    if name == "stream-start":
        streams[session] = str(event.get("stream"))
    elif name in _STREAM_ENDS:
        if streams.get(session) == event.get("stream"):
            del streams[session]
    elif name == "persisted" and event.get("what") in ("assistant", "partial"):
        streams.pop(session, None)  # its row is durable: the stream has ended


def _follow_cut(event: EventData, session: str, owed: dict[str, list[str]]) -> None:
    name = event.get("event")
    if name == "owed":
        owed.setdefault(session, []).append(str(event.get("cut")))
    elif name == "continuation-ended":
        left = [cut for cut in owed.pop(session, []) if cut != event.get("cut")]
        if left:
            owed[session] = left
    elif name == "persisted" and event.get("what") == "cut-void":
        owed.pop(session, None)  # durable before its continuation-ended is told (one a session)


def check_in_flight(
    trace: Sequence[EventData],
    recovery: Sequence[EventData],
    owed_after_kill: Sequence[str] | None = None,
) -> list[Violation]:
    """Every turn in flight at the kill is resumed, retried or abandoned with a reason.

    ``owed_after_kill``: the cuts the store still held owed right after the kill; one the
    trace told owed that the store no longer owes ended durably before the kill (its void
    landed, its telling did not): nothing was in flight for it.
    """
    found: list[Violation] = []
    flying = in_flight_at_kill(trace)
    if owed_after_kill is not None:
        still = set(owed_after_kill)
        for session in list(flying):
            kept = [w for w in flying[session] if not _ended_durably(w, still)]
            if kept:
                flying[session] = kept
            else:
                del flying[session]
    for session, what in flying.items():
        problem = _taken_up(session, recovery)
        if problem is not None:
            found.append(("in-flight", f"session {session}: {'; '.join(what)}; {problem}"))
    return found


def _ended_durably(what: str, owed: set[str]) -> bool:
    """``cut X was owed`` for a cut the store no longer owes."""
    prefix, suffix = "cut ", " was owed"
    if not (what.startswith(prefix) and what.endswith(suffix)):
        return False
    return what[len(prefix) : -len(suffix)] not in owed


def _taken_up(session: str, recovery: Sequence[EventData]) -> str | None:
    """``None`` when recovery took the session's turn up; else what it failed to do."""
    mine = [e for e in recovery if e.get("session") == session]
    for index, event in enumerate(mine):
        name = event.get("event")
        if name == "retry-abandoned" or (name == "recovered" and event.get("action") == "abandon"):
            if str(event.get("why") or "").strip():
                return None
            return f"recovery gave it up without a reason ({name})"
        if name == "recovered":
            action = event.get("action")
            if any(e.get("event") in _TAKEN_UP for e in mine[index + 1 :]):
                return None
            return f"recovery said {action} ({event.get('why')}) but nothing took the turn up"
    return "recovery neither resumed, retried nor abandoned it"


# ------------------------------------------------------------------ messages


def check_messages(
    trace: Sequence[EventData],
    recovery: Sequence[EventData],
    *,
    queued_after_kill: Sequence[QueuedMessage],
    queued_after_recovery: Sequence[QueuedMessage],
    rows_after_kill: Mapping[str, UserRowText],
    rows_after_recovery: Mapping[str, UserRowText],
) -> list[Violation]:
    """Every message sent before the kill is in history or queued after recovery, once."""
    found: list[Violation] = []
    stored = {(m.session, m.message) for m in queued_after_kill}
    fates = _fates(trace)
    for (session, message), fate in fates.items():
        if fate.row is not None and fate.row in rows_after_kill and (session, message) in stored:
            why = f"message {message} is in history ({fate.row}) and still queued after the kill"
            found.append(("message-lost", why))
        elif fate.owed_in_store and (session, message) not in stored:
            why = f"message {message} was told durable but after the kill is neither queued "
            found.append(("message-lost", why + "nor accepted into a user row"))
    cancelled = {
        (str(e.get("session")), str(e.get("entry"))): str(e.get("reason"))
        for e in recovery
        if e.get("event") == "entry-canceled"
    }
    still = {(m.session, m.message) for m in queued_after_recovery}
    new_rows = [row for key, row in rows_after_recovery.items() if key not in rows_after_kill]
    for queued in queued_after_kill:
        if not queued.user_authored or queued.withdrawn:
            continue
        key = (queued.session, queued.entry)
        if key in cancelled:
            why = f"message {queued.message} was cancelled by recovery ({cancelled[key]})"
            found.append(("message-lost", why))
            continue
        in_rows = sum(
            1 for row in new_rows if row.session == queued.session and _holds(row.text, queued.text)
        )
        count = in_rows + ((queued.session, queued.message) in still)
        if (queued.session, queued.message) in still and in_rows == 0:
            # recovery ran to quiescence: every session idle, so a live user entry still
            # queued was never taken up (a queue rebuilt but never drained)
            why = f"message {queued.message} is still queued after recovery settled: never drained"
            found.append(("message-lost", why))
        elif count == 0:
            why = f"message {queued.message} was queued at the kill and is gone after recovery"
            found.append(("message-lost", why))
        elif count > 1:
            why = (
                f"message {queued.message} is there {count} times after recovery "
                f"({in_rows} new user row(s), {'queued' if count > in_rows else 'not queued'})"
            )
            found.append(("message-lost", why))
    return found


def _holds(row_text: str, text: str) -> bool:
    """The row is the message, or a batch with it as one of its newline-joined adds."""
    return (
        row_text == text
        or row_text.startswith(text + "\n")
        or row_text.endswith("\n" + text)
        or ("\n" + text + "\n") in row_text
    )


class _Fate(msgspec.Struct, kw_only=True):
    entry: str
    #: Its add was told durable (``persisted what=queue`` with its id).
    durable: bool = False
    dequeued: bool = False
    #: The user row that accepted it.
    row: str | None = None
    #: Cancelled, cleared, withdrawn or given back in the trace.
    gone: bool = False
    #: Told queued in a user-authored entry (an agent-initiated one may be dropped).
    user: bool = True

    @property
    def owed_in_store(self) -> bool:
        """A user's message told durable, neither accepted nor taken back: it must be stored."""
        return self.user and self.durable and not self.gone and self.row is None


def _fates(trace: Sequence[EventData]) -> dict[tuple[str, str], _Fate]:
    """What the trace says of each queued message: durable, accepted by which row, cancelled."""
    rows = {
        str(e.get("id"))
        for e in trace
        if e.get("event") == "persisted" and e.get("what") == "user-row"
    }
    fates: dict[tuple[str, str], _Fate] = {}
    taking: dict[str, str] = {}  # session -> the entry its drain took last, not yet accepted
    for event in trace:
        name, session = event.get("event"), str(event.get("session"))
        if name == "persisted" and event.get("what") == "queue":
            message = str(event.get("id"))
            if message != session and message not in rows:
                fates.setdefault((session, message), _Fate(entry=message)).durable = True
        elif name == "queued":
            message = str(event.get("entry"))
            fate = fates.setdefault((session, message), _Fate(entry=message))
            fate.entry = str(event.get("into") or message)
            fate.user = event.get("kind") in ("user", "follow-up")
        elif name == "dequeued":
            taking[session] = str(event.get("entry"))
            for fate in _of_entries(fates, session, [taking[session]]):
                fate.dequeued = True
        elif name == "persisted" and event.get("what") == "user-row" and session in taking:
            for fate in _of_entries(fates, session, [taking.pop(session)]):
                fate.row = str(event.get("id"))
        elif name in ("entry-canceled", "cleared", "withdrawn"):
            gone = event.get("entries", ()) if name == "cleared" else (event.get("entry"),)
            for fate in _of_entries(fates, session, [str(e) for e in gone]):
                fate.gone = True
    return fates


def _of_entries(
    fates: Mapping[tuple[str, str], _Fate], session: str, entries: Iterable[str]
) -> list[_Fate]:
    wanted = set(entries)
    return [fate for (s, _), fate in fates.items() if s == session and fate.entry in wanted]


# ------------------------------------------------------------------ operations


def check_ops(
    trace: Sequence[EventData], recovery: Sequence[EventData], ops: Sequence[OpKey]
) -> list[Violation]:
    """No operation runs twice without an ``indeterminate`` receipt of the first between."""
    keys = {op.op: (op.session, op.capability, op.target) for op in ops}
    found: list[Violation] = []
    started: set[str] = set()
    last: dict[tuple[str, str, str], str] = {}  # key -> the op that ran it last
    state: dict[str, str] = {}  # op -> its latest receipt's state
    warned: set[tuple[str, str]] = set()  # (op, the indeterminate op it was warned about)
    for event in (*trace, *recovery):
        name, op = event.get("event"), str(event.get("op"))
        if name == "receipt":
            state[op] = str(event.get("state"))
        elif name == "op-overlap-warned":
            warned.add((op, str(event.get("overlaps"))))
        elif name == "op-start" and event.get("deadline") != 0:  # a provider's is not ours
            if op in started:
                found.append(("op-twice", f"operation {op} started twice"))
            started.add(op)
            key = keys.get(op)
            if key is None:
                continue
            earlier = last.get(key)
            last[key] = op
            if earlier is None:
                continue
            what = f"{key[1]} on target {key[2][:12]} in session {key[0]}"
            if earlier not in state:
                why = f"{op} ran {what} while {earlier} had no receipt (its outcome unknown)"
                found.append(("op-twice", why))
            elif state[earlier] == "indeterminate" and (op, earlier) not in warned:
                why = f"{op} ran {what} again silently after {earlier} was indeterminate"
                found.append(("op-twice", why))
    return found
