"""The crash-point sweep's checker: what must hold after a kill at a durable boundary.

A trial (:mod:`~agent_session.harness.crashpoints`) kills a scenario's process inside the
emission of its k-th ``persisted`` event, then recovers the store in a fresh process. This
module judges the result, purely: from the killed child's trace (the events up to and including
that ``persisted`` event, as plain data) and the :class:`RecoveryFacts` the recovery gathered
from the store before and after, it returns one :class:`Finding` per violated invariant:

``store``
    The store does not open after the kill (read-only, then by the recovery engine) or after
    recovery, ``PRAGMA integrity_check`` does not say ``ok`` (after the kill or after
    recovery), or a stored record fails validation.
``ended-resumed``
    A continuation the trace reported ended (``continuation-ended``) is resumed again (a
    ``resume`` event for that cut after its ending, other than the ending's own outcome), or
    is still owed in the store after recovery.
``owed``
    An owed cut record is left in the store at quiescence.
``owed-unanswered-user``
    The same, when an unanswered user row follows the cut. Startup retry (PS-4) answers such a
    turn now, so this is a violation like ``owed``; it is kept apart because it names the
    regression (a retry that was planned and did not run, or was never planned).
``user-row-lost``
    A user row in the store right after the kill is gone after recovery, or a ``user-row`` the
    trace reported durable is missing from the store right after the kill (a send cancelled
    before acceptance, ``entry-canceled`` after its row, deletes its row on purpose).
``receipt``
    An operation is still ``requested`` or ``running`` after recovery, or has more than one
    ``receipt`` event (a second one is allowed only with ``resolved_late`` true), across the
    child's trace and the recovery's events.
``handle``
    A delegated turn's handle settles twice (two ``settled`` events across the child's trace
    and the recovery's events), or is still ``active`` in the store after recovery reached
    quiescence: nothing would ever settle it (recovery settles or resumes, never neither); or
    recovery starts a stream of a turn whose handle had settled (never both: R41's admission
    refuses it).
``recovery``
    The recovery engine raised, or did not reach quiescence.
``in-flight``, ``message-lost``, ``op-twice``
    A turn in flight at the kill is taken up; every message sent before the kill is in history
    or queued after recovery, exactly once; no operation runs twice without an
    ``indeterminate`` receipt between (:mod:`~agent_session.harness.crashturns` says how).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from agent_session.harness.crashturns import (
    OpKey,
    QueuedMessage,
    UserRowText,
    check_in_flight,
    check_messages,
    check_ops,
)

#: Event data as the checker reads it: ``msgspec.to_builtins`` of an engine event (``event``,
#: ``session`` and the event's own fields, as ``docs/trace.md`` names them).
EventData = Mapping[str, Any]

#: The violation classes, in report order.
CLASSES: tuple[str, ...] = (
    "store",
    "ended-resumed",
    "owed",
    "owed-unanswered-user",
    "user-row-lost",
    "receipt",
    "handle",
    "recovery",
    "in-flight",
    "message-lost",
    "op-twice",
)


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One violated invariant: its class and a one-line reason."""

    cls: str
    reason: str


class OwedCut(msgspec.Struct, frozen=True, kw_only=True):
    """A row whose cut record is still owed after recovery."""

    session: str
    row_id: str
    stream: str | None
    #: Rows after it are only user rows (besides sentinels and system rows): the PS-4 case.
    unanswered_user: bool


class RecoveryFacts(msgspec.Struct, kw_only=True):
    """What the recovery process saw: the store right after the kill, its events, the store after.

    ``user_rows_after_kill`` and ``user_rows_after_recovery`` map a user row's id to its body.
    """

    #: ``PRAGMA integrity_check`` right after the kill.
    integrity: str = "ok"
    #: Why the killed child's store would not open or read (then nothing else was gathered).
    open_error: str | None = None
    #: Why the recovery engine could not open or read the store (it never started).
    engine_open_error: str | None = None
    user_rows_after_kill: dict[str, bytes] = msgspec.field(default_factory=dict)
    #: The recovery engine's events, in order.
    recovery_events: list[dict[str, Any]] = msgspec.field(default_factory=list)
    #: The recovery engine raised, or did not reach quiescence.
    recovery_error: str | None = None
    #: Why the store would not open or read after recovery.
    reopen_error: str | None = None
    #: ``PRAGMA integrity_check`` after recovery.
    integrity_after_recovery: str = "ok"
    user_rows_after_recovery: dict[str, bytes] = msgspec.field(default_factory=dict)
    owed_after_recovery: list[OwedCut] = msgspec.field(default_factory=list)
    #: The cuts (stream ids) whose record was still owed right after the kill (``None``: not
    #: read). A cut told owed whose record is not owed any more ended durably before the kill
    #: (its void landed before it was told): nothing is in flight for it.
    owed_after_kill: list[str] | None = None
    #: ``(op_id, state)`` of every operation still ``requested`` or ``running``.
    open_ops_after_recovery: list[tuple[str, str]] = msgspec.field(default_factory=list)
    #: Rows of the stores that failed validation (``(what, detail)``).
    corrupt: list[tuple[str, str]] = msgspec.field(default_factory=list)
    #: ``(handle id, status)`` of every delegated turn's handle after recovery.
    handles_after_recovery: list[tuple[str, str]] = msgspec.field(default_factory=list)
    #: The store's durable queue, one item per add, right after the kill and after recovery.
    queued_after_kill: list[QueuedMessage] = msgspec.field(default_factory=list)
    queued_after_recovery: list[QueuedMessage] = msgspec.field(default_factory=list)
    #: User rows' sessions and texts by row id, right after the kill and after recovery.
    texts_after_kill: dict[str, UserRowText] = msgspec.field(default_factory=dict)
    texts_after_recovery: dict[str, UserRowText] = msgspec.field(default_factory=dict)
    #: Every operation's session, capability and target, after recovery.
    ops_after_recovery: list[OpKey] = msgspec.field(default_factory=list)


def check_trial(trace: Sequence[EventData], facts: RecoveryFacts) -> list[Finding]:
    """Every invariant ``trace`` (the killed child's events) and ``facts`` violate."""
    findings = _check_store(facts)
    if facts.open_error is not None or facts.engine_open_error is not None:
        return findings  # nothing was recovered: the store's findings are the whole story
    if facts.recovery_error is not None:
        findings.append(Finding(cls="recovery", reason=facts.recovery_error))
    ended = _check_continuations(trace, facts, findings)
    if facts.reopen_error is None:
        _check_owed(facts, ended, findings)
        _check_user_rows(trace, facts, findings)
    _check_receipts(trace, facts, findings)
    _check_handles(trace, facts, findings)
    recovery = facts.recovery_events
    found = (
        []
        if facts.recovery_error is not None
        else check_in_flight(trace, recovery, facts.owed_after_kill)
    )
    if facts.reopen_error is None:
        found += check_messages(
            trace,
            recovery,
            queued_after_kill=facts.queued_after_kill,
            queued_after_recovery=facts.queued_after_recovery,
            rows_after_kill=facts.texts_after_kill,
            rows_after_recovery=facts.texts_after_recovery,
        )
        found += check_ops(trace, recovery, facts.ops_after_recovery)
    findings.extend(Finding(cls=cls, reason=reason) for cls, reason in found)
    return findings


def _check_handles(
    trace: Sequence[EventData], facts: RecoveryFacts, findings: list[Finding]
) -> None:
    """A handle settles at most once and is never left active; a settled one never resumes.

    Never left active once recovery is quiescent; recovery starts no stream of its turn once
    it settled.
    """
    settled: dict[str, int] = {}
    recovering = len(trace)
    for index, event in enumerate((*trace, *facts.recovery_events)):
        if event.get("event") == "settled":
            handle = str(event.get("handle"))
            settled[handle] = settled.get(handle, 0) + 1
        elif index >= recovering and event.get("event") == "stream-start":
            started = event.get("handle")
            if started is not None and str(started) in settled:
                stream = event.get("stream")
                why = f"recovery started {stream} for handle {started}, already settled"
                findings.append(Finding(cls="handle", reason=why))
    findings.extend(
        Finding(cls="handle", reason=f"handle {handle} settled {count} times")
        for handle, count in settled.items()
        if count > 1
    )
    if facts.recovery_error is None and facts.reopen_error is None:
        findings.extend(
            Finding(cls="handle", reason=f"handle {handle} is still active after recovery")
            for handle, status in facts.handles_after_recovery
            if status == "active"
        )


def _check_store(facts: RecoveryFacts) -> list[Finding]:
    """Invariant 1: the store opens, before and after recovery, and is intact."""
    findings: list[Finding] = []
    if facts.integrity != "ok":
        findings.append(
            Finding(cls="store", reason=f"integrity_check after the kill: {facts.integrity}")
        )
    if facts.integrity_after_recovery != "ok":
        findings.append(
            Finding(
                cls="store",
                reason=f"integrity_check after recovery: {facts.integrity_after_recovery}",
            )
        )
    if facts.open_error is not None:
        findings.append(
            Finding(cls="store", reason=f"does not open after the kill: {facts.open_error}")
        )
    if facts.engine_open_error is not None:
        findings.append(
            Finding(
                cls="store",
                reason=f"the recovery engine cannot open it: {facts.engine_open_error}",
            )
        )
    if facts.reopen_error is not None:
        findings.append(
            Finding(cls="store", reason=f"does not open after recovery: {facts.reopen_error}")
        )
    findings.extend(
        Finding(cls="store", reason=f"corrupt {what}: {detail}") for what, detail in facts.corrupt
    )
    return findings


def _check_continuations(
    trace: Sequence[EventData], facts: RecoveryFacts, findings: list[Finding]
) -> dict[str, str]:
    """Invariant 2: an ended continuation is never resumed again; return the ended cuts.

    Per cut, in the child's trace followed by the recovery's events, a continuation ends at most
    once, and only the ``resume`` event right after its ending, in the same process, may follow
    it: that ending's own outcome (a started resume consumes the continuation just before its
    ``resume`` event).
    """
    ended: dict[str, str] = {}  # cut -> "how (why)", the first ending
    history: dict[str, list[tuple[str, EventData, bool]]] = {}
    for source, events in (("child", trace), ("recovery", facts.recovery_events)):
        for event in events:
            name = event.get("event")
            if name in ("continuation-ended", "resume"):
                cut = str(event.get("cut"))
                history.setdefault(cut, []).append((str(name), event, source == "recovery"))
    for cut, steps in history.items():
        first_end = next((i for i, (name, _, _) in enumerate(steps) if name != "resume"), None)
        if first_end is None:
            continue
        _, ending, ended_in_recovery = steps[first_end]
        ended[cut] = f"{ending.get('how')} ({ending.get('why')})"
        rest = steps[first_end + 1 :]
        if rest and rest[0][0] == "resume" and rest[0][2] == ended_in_recovery:
            rest = rest[1:]  # the ending's own outcome (never another process's)
        again = next(((e, rec) for name, e, rec in rest if name == "resume"), None)
        if again is not None:
            event, in_recovery = again
            where = "recovery" if in_recovery else "the run"
            findings.append(
                Finding(
                    cls="ended-resumed",
                    reason=(
                        f"cut {cut} ended {ended[cut]}, then {where} resumed it again (resume "
                        f"attempt {event.get('attempt')} {event.get('outcome')})"
                    ),
                )
            )
        elif any(name == "continuation-ended" for name, _, _ in rest):
            findings.append(
                Finding(cls="ended-resumed", reason=f"cut {cut} ended twice: first {ended[cut]}")
            )
    return ended


def _check_owed(facts: RecoveryFacts, ended: Mapping[str, str], findings: list[Finding]) -> None:
    """Invariants 2 and 3: nothing is owed at quiescence, least of all an ended cut."""
    for owed in facts.owed_after_recovery:
        tail = " (an unanswered user row follows it)" if owed.unanswered_user else ""
        if owed.stream is not None and owed.stream in ended:
            findings.append(
                Finding(
                    cls="ended-resumed",
                    reason=(
                        f"cut {owed.stream} ended {ended[owed.stream]}, yet its record on "
                        f"{owed.row_id} is owed after recovery{tail}"
                    ),
                )
            )
        elif owed.unanswered_user:
            findings.append(
                Finding(
                    cls="owed-unanswered-user",
                    reason=(
                        f"cut {owed.stream} on {owed.row_id} left owed at quiescence: an "
                        "unanswered user row follows it (startup retry, PS-4, should answer it)"
                    ),
                )
            )
        else:
            findings.append(
                Finding(
                    cls="owed",
                    reason=f"cut {owed.stream} on {owed.row_id} is still owed at quiescence",
                )
            )


def _check_user_rows(
    trace: Sequence[EventData], facts: RecoveryFacts, findings: list[Finding]
) -> None:
    """Invariant 4: no accepted user row is lost, by the kill or by recovery."""
    for row_id, body in facts.user_rows_after_kill.items():
        if row_id not in facts.user_rows_after_recovery:
            findings.append(
                Finding(cls="user-row-lost", reason=f"user row {row_id} is gone after recovery")
            )
        elif facts.user_rows_after_recovery[row_id] != body:
            findings.append(
                Finding(cls="user-row-lost", reason=f"user row {row_id} changed during recovery")
            )
    findings.extend(
        Finding(
            cls="user-row-lost",
            reason=f"user row {row_id} was reported durable but is not in the store",
        )
        for row_id in traced_user_rows(trace)
        if row_id not in facts.user_rows_after_kill
    )


def traced_user_rows(trace: Sequence[EventData]) -> list[str]:
    """The user rows the trace reports durable (``persisted`` ``user-row``), less those taken back.

    A send cancelled before acceptance deletes its own row (AS-3): the ``entry-canceled`` of the
    entry last ``dequeued`` in that session follows the row's ``persisted`` before any stream
    starts or fails there (only a dispatched entry has a cancel signal).
    """
    kept: list[str] = []
    dequeued: dict[str, str] = {}  # session -> the entry its drain took last
    pending: dict[str, tuple[str, str]] = {}  # session -> (row, entry) not yet past acceptance
    for event in trace:
        name, session = event.get("event"), str(event.get("session"))
        if name == "dequeued":
            dequeued[session] = str(event.get("entry"))
        elif name == "persisted" and event.get("what") == "user-row":
            row = str(event.get("id"))
            kept.append(row)
            pending.pop(session, None)
            if session in dequeued:
                pending[session] = (row, dequeued.pop(session))
        elif name == "entry-canceled":
            if dequeued.get(session) == event.get("entry"):
                del dequeued[session]
            if session in pending and pending[session][1] == event.get("entry"):
                kept.remove(pending.pop(session)[0])
        elif name in ("stream-start", "stream-error", "continuation-ended"):
            pending.pop(session, None)
    return kept


def _check_receipts(
    trace: Sequence[EventData], facts: RecoveryFacts, findings: list[Finding]
) -> None:
    """Invariant 5: one terminal or indeterminate receipt per operation, no open one left."""
    findings.extend(
        Finding(cls="receipt", reason=f"operation {op} is still {state} after recovery")
        for op, state in facts.open_ops_after_recovery
    )
    firsts: dict[str, list[str]] = {}
    lates: dict[str, int] = {}
    for event in (*trace, *facts.recovery_events):
        if event.get("event") != "receipt":
            continue
        op = str(event.get("op"))
        if event.get("resolved_late") is True:
            lates[op] = lates.get(op, 0) + 1
        else:
            firsts.setdefault(op, []).append(str(event.get("state")))
    for op, states in firsts.items():
        if len(states) > 1:
            findings.append(
                Finding(
                    cls="receipt",
                    reason=f"operation {op} has {len(states)} receipts: {', '.join(states)}",
                )
            )
    for op, count in lates.items():
        if count > 1 or op not in firsts:
            findings.append(
                Finding(
                    cls="receipt",
                    reason=(
                        f"operation {op} has {count} late receipt(s) after "
                        f"{len(firsts.get(op, []))} first one(s)"
                    ),
                )
            )
