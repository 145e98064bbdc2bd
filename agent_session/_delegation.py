"""Delegated turns, the owner's side (TD-1 to TD-10): the engine's in-process owner.

A session delegates a turn to another session of the same engine under a handle
(:meth:`Engine.delegate <agent_session.Engine.delegate>`). The target session tells its owner
what each stream did that the owner must hear of (a :data:`ChildEvent`: a stream's end, abort
or error, a forfeited continuation); :class:`Delegations` decides (defer after the target's
claim, ST-15; settle ``completed``, ``interrupted`` or ``error``; or ignore, TD-1), writes the
handle record (B10), and only then tells ``claim`` and ``settled`` (decide, persist, tell).

A settlement whose write fails is kept and retried on the engine's clock with backoff until it
is written (R54), whatever happens to the target session meanwhile; the in-memory record moves
at once, so a second event for a settled handle changes nothing (TD-10).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from functools import partial
from typing import Any, Final, Protocol

import anyio
import msgspec

from agent_session._events import EngineEvent, HandleClaimed, HandleSettled
from agent_session._rows import decode_body
from message_queue import (
    CancelToken,
    Correlation,
    DispatchMode,
    EntryKind,
    MessageMetadata,
    MetadataType,
    NewMessage,
    SendFailure,
)
from persistence import (
    Boundary,
    HandleRecord,
    HandleStatus,
    RowKind,
    SessionLoad,
    TurnkeeperError,
    UsageError,
)
from stream_manager import AbortReason, Clock, FinishReason, Persisted

log = logging.getLogger("turnkeeper.delegation")

#: The first retry of a settlement whose write failed, in seconds; doubled each time (R54).
RETRY_FIRST_S: Final = 1.0
#: The longest wait between two attempts of one settlement write.
RETRY_MAX_S: Final = 30.0

#: Why a turn settled ``interrupted`` when an unrelated entry cut it (TD-3, the claim's no).
SUPERSEDED: Final = "superseded by new input"
#: Why a turn settled ``interrupted`` when an uncorrelated stream ended in its session (TD-4).
SUPERSEDED_UNCORRELATED: Final = "superseded by an uncorrelated stream in its session"
#: Why a turn settled ``interrupted`` when its report wake-up was cancelled (TD-9).
REPORT_CANCELED: Final = "its report wake-up was cancelled before it ran"
#: The ``interrupted`` settlements a later correlated stream-end of the same turn may prove
#: stale, and so re-settle (TD-3): the ones the owner inferred, never one that someone asked
#: for (the owner's interrupt, a user's stop, a hard stop) or a forfeit of the continuation.
STALE_INTERRUPTIONS: Final = frozenset({SUPERSEDED, SUPERSEDED_UNCORRELATED, REPORT_CANCELED})


class ChildEnded(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A stream of the target ended (``stream-end``); ``report``: its final text."""

    target: str
    correlation: Correlation | None
    stream: str
    finish: FinishReason
    report: str = ""


class ChildAborted(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A stream of the target was aborted (``stream-abort``) with ``reason``."""

    target: str
    correlation: Correlation | None
    stream: str
    reason: AbortReason


class ChildFailed(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A stream of the target failed (``stream-error``) and nothing recovers it (TD-6)."""

    target: str
    correlation: Correlation | None
    stream: str
    kind: str


class ChildForfeited(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The target forfeited the owed continuation of a delegated turn (ST-6, TD-10, TD-11)."""

    target: str
    correlation: Correlation
    why: str


class ChildHardStopped(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The target's task is hard-stopped (TD-7): its delegated turns are interrupted first."""

    target: str


class ChildUnsent(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A send of the delegated turn went nowhere and nothing else carries the turn (TD-6)."""

    target: str
    correlation: Correlation


class ChildDisposed(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The target session is disposed (AS-31, R27): nothing will run its delegated turns."""

    target: str


ChildEvent = (
    ChildEnded
    | ChildAborted
    | ChildFailed
    | ChildForfeited
    | ChildHardStopped
    | ChildDisposed
    | ChildUnsent
)


class Claimer(Protocol):
    """What the owner asks of a target session: ST-15's claim, answered synchronously."""

    def claim(self, correlation: Correlation, stream: str) -> bool: ...


class UnknownHandle(UsageError):
    """No delegated turn has that handle."""


class HandleInUse(UsageError):
    """A delegated turn already has that handle (an id is never reused, settled or not)."""


class Delegation:
    """One delegated turn, as the host holds it: await :meth:`settled` for its settlement."""

    __slots__ = ("_delegations", "_failed", "handle")

    def __init__(self, delegations: Delegations, handle: str) -> None:
        self.handle = handle
        self._delegations = delegations
        self._failed: BaseException | None = None

    @property
    def record(self) -> HandleRecord:
        """The handle's record now (its status moves when the settlement is decided)."""
        return self._delegations.record(self.handle)

    async def settled(self) -> HandleRecord:
        """Wait until the turn settled and its settlement is durable; return the record.

        Raises:
            TurnkeeperError: the delegation never started (its handle could not be written).
        """
        if self._failed is None:
            await self._delegations.wait_settled(self.handle)
        if self._failed is not None:
            raise self._failed
        return self.record


Write = Callable[[str, Boundary], Awaitable[object]]
#: A decided handle write: the record, what to tell once it is durable, whether it settles.
_Write = tuple[HandleRecord, tuple["EngineEvent", ...], bool]
Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]


class Delegations:
    """The engine's in-process owner: every handle, the claims and settlements, the retries."""

    def __init__(
        self,
        *,
        clock: Clock,
        emit: Callable[[EngineEvent], None],
        spawn: Spawn,
        write: Write,
        claimer: Callable[[str], Claimer | None],
        holds: Callable[[str], bool] | None = None,
    ) -> None:
        self._clock = clock
        #: On a store many processes share: whether a session is open in this engine. A
        #: handle whose owner runs elsewhere is written under its target's lease (LS-11).
        self._holds = holds
        self._emit = emit
        self._spawn = spawn
        self._write = write
        self._claimer = claimer
        self._handles: dict[str, HandleRecord] = {}
        #: Handle ids read back damaged: never active, never reused.
        self._corrupt: set[str] = set()
        self._settled: dict[str, anyio.Event] = {}
        #: Active handles whose turn has begun in the target (a stream of it started): only
        #: those can be superseded by an uncorrelated stream-end there (TD-4).
        self._begun: set[str] = set()
        #: Settlement writes that failed and wait for their retry (R54), by handle id.
        self.retrying: set[str] = set()
        #: Fault injection for the harness (``fail_next settlement``): writes left to fail.
        self.fail_next = 0
        #: Writes decided and not yet handed out (:meth:`_take_writes`), in decision order.
        self._writes: list[_Write] = []

    # ------------------------------------------------------------ reading

    def record(self, handle: str) -> HandleRecord:
        """The record of ``handle``.

        Raises:
            UnknownHandle: no delegated turn has that handle.
        """
        try:
            return self._handles[handle]
        except KeyError:
            raise UnknownHandle(f"no delegated turn has the handle {handle!r}") from None

    def find(self, handle: str) -> HandleRecord | None:
        """The record of ``handle``, or ``None`` (unknown, or damaged)."""
        return self._handles.get(handle)

    @property
    def records(self) -> tuple[HandleRecord, ...]:
        """Every handle record, by handle id."""
        return tuple(self._handles[h] for h in sorted(self._handles))

    def active_into(self, target: str) -> bool:
        """Whether a delegated turn runs in ``target`` (its uncorrelated ends matter, TD-4)."""
        return any(
            r.target == target and r.status is HandleStatus.ACTIVE for r in self._handles.values()
        )

    def knows(self, handle: str) -> bool:
        """Whether ``handle`` is one of this owner's (a damaged record too)."""
        return handle in self._handles or handle in self._corrupt

    def refusal(self, correlation: Correlation, target: str) -> str | None:
        """R41's handle admission: why ``target`` may not go on with ``correlation``'s turn.

        The handle must exist, be this target's and this turn's, and still be active; a
        damaged record is never active.
        """
        handle = correlation.handle_id
        if handle in self._corrupt:
            return f"the handle {handle} is damaged in the store"
        record = self._handles.get(handle)
        if record is None:
            return f"no delegated turn has the handle {handle}"
        if (
            record.target != target
            or record.owner != correlation.owner_session
            or record.turn_id != correlation.turn_id
        ):
            return f"the handle {handle} is another turn's"
        if record.status is not HandleStatus.ACTIVE:
            return f"the handle {handle} is settled {record.status}"
        return None

    def follow_up_refusal(self, correlation: Correlation, target: str) -> str | None:
        """TD-8, R41 for a follow-up (an entry continuing the turn): refused once stopped.

        Only a turn someone stopped refuses its follow-ups (the owner's interrupt, a user's
        stop, a hard stop, a forfeit: an ``interrupted`` that is not stale) and a damaged
        record; a follow-up of a turn settled ``error`` or superseded may still heal it
        (TD-3), and one of a handle this owner does not hold is not its to refuse.
        """
        handle = correlation.handle_id
        if handle in self._corrupt:
            return f"the handle {handle} is damaged in the store"
        record = self._handles.get(handle)
        if (
            record is not None
            and record.status is HandleStatus.INTERRUPTED
            and record.reason not in STALE_INTERRUPTIONS
        ):
            return f"the handle {handle} is settled {record.status}"
        return None

    def load(self, records: Iterable[HandleRecord], corrupt: Iterable[str]) -> None:
        """The handles the store holds, read at startup (a damaged one is never active).

        An active one has begun (TD-4): its prompt row was written in an earlier process, so
        every stream-end this process sees comes after it.
        """
        for record in records:
            self._handles[record.handle_id] = record
            if record.status is HandleStatus.ACTIVE:
                self._begun.add(record.handle_id)
        self._corrupt.update(corrupt)

    def adopt(self, record: HandleRecord, *, begun: bool) -> None:
        """LS-11: a handle read from the store, whose turn now runs in a session held here.

        Its owner may run in another process (it wrote the handle and posted the prompt);
        this engine, holding the target, decides the turn's claims and settlement from now
        on. ``begun``: a stream of the turn may have started already (a claim's recovery).
        """
        self._handles[record.handle_id] = record
        if begun and record.status is HandleStatus.ACTIVE:
            self._begun.add(record.handle_id)
        self._corrupt.discard(record.handle_id)

    def elsewhere(self, record: HandleRecord) -> bool:
        """LS-11: whether ``record``'s target runs in another process (its holder decides)."""
        return self._holds is not None and not self._holds(record.target)

    def _awaited(self, record: HandleRecord) -> bool:
        """An active turn of an owner held here, running in another process (LS-11)."""
        return (
            record.status is HandleStatus.ACTIVE
            and self._holds is not None
            and self._holds(record.owner)
            and not self._holds(record.target)
        )

    def awaited_owners(self) -> set[str]:
        """The owners held here with an active turn running in another process (LS-11)."""
        return {r.owner for r in self._handles.values() if self._awaited(r)}

    def heard(self, records: Iterable[HandleRecord]) -> None:
        """LS-11: handles of this engine's owners, as their targets' holders wrote them.

        A turn running elsewhere that settled there is settled here too: told ``settled``
        (it is durable already) and woken for whoever awaits it. A claim there (a deferred
        stream) is taken in quietly. A handle not active here is not this side's to move.
        """
        for stored in records:
            mine = self._handles.get(stored.handle_id)
            if mine is None or not self._awaited(mine):
                continue  # a peer's turn (a startup read every handle), or decided here
            self._handles[stored.handle_id] = stored
            if stored.status is HandleStatus.ACTIVE:
                continue
            self._begun.discard(stored.handle_id)
            self._emit(
                HandleSettled(
                    session=stored.owner, handle=stored.handle_id, status=stored.status.value
                )
            )
            self._wake(stored.handle_id)

    async def wait_settled(self, handle: str) -> None:
        """Return once ``handle`` is settled and its settlement durable (or it never started)."""
        record = self._handles.get(handle)
        if record is None or (
            record.status is not HandleStatus.ACTIVE and handle not in self.retrying
        ):
            return  # never started (its write failed), or settled and durable
        await self._settled.setdefault(handle, anyio.Event()).wait()

    # ------------------------------------------------------------ delegating

    def open(self, owner: str, target: str, handle: str) -> tuple[HandleRecord, Correlation]:
        """A new active handle for ``owner``'s turn delegated to ``target`` (in memory).

        Raises:
            HandleInUse: ``handle`` names a delegated turn already (or a damaged record).
            UsageError: ``owner`` and ``target`` are the same session, or ``handle`` is blank.
        """
        if not handle.strip():
            raise UsageError("a delegated turn needs a non-blank handle")
        if handle in self._handles or handle in self._corrupt:
            raise HandleInUse(f"the handle {handle!r} is taken: a handle id is never reused")
        if owner == target:
            raise UsageError(f"session {owner!r} cannot delegate a turn to itself")
        record = HandleRecord(
            handle_id=handle, owner=owner, target=target, turn_id=handle, created_at=self._now()
        )
        self._handles[handle] = record
        return record, Correlation(handle_id=handle, owner_session=owner, turn_id=handle)

    def delegated(self, delegation: Delegation, error: BaseException) -> None:
        """The handle of ``delegation`` could not be written: the turn never starts."""
        delegation._failed = error
        self._handles.pop(delegation.handle, None)
        self._wake(delegation.handle)

    # ------------------------------------------------------------ what targets tell

    def on_child(self, event: ChildEvent) -> Awaitable[None] | None:
        """A target session's stream event or forfeit: defer, settle, or ignore (TD-1).

        Decided at once; returns the handle write to await (then ``claim`` / ``settled`` are
        told), or ``None`` when nothing changed. The target awaits it in its own flow.
        """
        self._decide_child(event)
        return self._take_writes()

    def _decide_child(self, event: ChildEvent) -> None:
        if isinstance(event, ChildForfeited):
            self._settle_active(event.correlation, HandleStatus.INTERRUPTED, event.why)
            return
        if isinstance(event, ChildHardStopped):
            self._interrupt_all(event.target, "its session was hard-stopped (TD-7)")
            return
        if isinstance(event, ChildUnsent):
            why = "its prompt was refused before a stream started, and nothing continues it"
            self._settle_active(event.correlation, HandleStatus.ERROR, why)
            return
        if isinstance(event, ChildDisposed):  # R27: neither a stream event nor a marker will
            self._interrupt_all(event.target, "its session was disposed (R27)")
            return
        correlation = event.correlation
        if correlation is None:
            if isinstance(event, ChildEnded | ChildFailed):  # TD-4; a failed supersede too
                self._superseded(event.target)
            return
        if isinstance(event, ChildAborted):
            if event.reason is AbortReason.USER:  # TD-5: only a user's abort settles
                self._settle_active(correlation, HandleStatus.INTERRUPTED, "stopped by the user")
            return
        if isinstance(event, ChildFailed):
            why = f"the stream failed ({event.kind}) and nothing recovers it"
            self._settle_active(correlation, HandleStatus.ERROR, why)
            return
        self._ended(event, correlation)

    def interrupt(self, handle: str) -> bool:
        """TD-8: the owner stops the turn under ``handle``; ``False`` if it already was.

        Raises:
            UnknownHandle: no delegated turn has that handle.
            UsageError: the turn already settled ``completed`` or ``error``.
        """
        if not self.interruptible(handle):
            return False
        record = self.record(handle)
        self._settle(record, HandleStatus.INTERRUPTED, "interrupted by its owner")
        self._write_in_a_task()
        return True

    def interruptible(self, handle: str) -> bool:
        """TD-8's check: ``True`` while the turn is active, ``False`` once interrupted.

        Raises:
            UnknownHandle: no delegated turn has that handle.
            UsageError: the turn already settled ``completed`` or ``error``.
        """
        record = self.record(handle)
        if record.status is HandleStatus.INTERRUPTED:
            return False
        if record.status is not HandleStatus.ACTIVE:
            raise UsageError(f"the delegated turn {handle!r} already settled {record.status}")
        return True

    def settle_orphan(self, handle: str, why: str, *, report: str | None = None) -> None:
        """Settle the active ``handle`` at startup: nothing continues its turn.

        ``interrupted``; or ``completed`` with ``report`` when the turn's last stream had
        ended ``stop`` in a durable row (:func:`final_report`) before its settlement was.
        """
        record = self._handles.get(handle)
        if record is None or record.status is not HandleStatus.ACTIVE:
            return
        if report is None:
            self._settle(record, HandleStatus.INTERRUPTED, why)
        else:
            self._settle(record, HandleStatus.COMPLETED, "completed", report=report)
        self._write_in_a_task()

    # ------------------------------------------------------------ report wake-ups (TD-9)

    def report_correlation(self, target: str, handle: str | None = None) -> Correlation | None:
        """The active delegated turn of ``target`` a report queued there would continue.

        ``handle``: only that one (``None`` when it is not active in ``target``); else the
        latest delegated into ``target`` of those still active.
        """
        active = [
            record
            for record in self._handles.values()
            if record.target == target
            and record.status is HandleStatus.ACTIVE
            and handle in (None, record.handle_id)
        ]
        if not active:
            return None
        record = max(active, key=lambda r: (r.created_at, r.handle_id))
        return Correlation(
            handle_id=record.handle_id, owner_session=record.owner, turn_id=record.turn_id
        )

    def report_message(
        self,
        text: str,
        correlation: Correlation | None,
        *,
        entry: str | None,
        mode: DispatchMode | str,
        token: CancelToken,
    ) -> NewMessage:
        """A report wake-up: with ``correlation``, callbacks that settle its turn (TD-9).

        Cancelled before acceptance (withdrawn, removed, cleared): ``interrupted``; accepted
        and failed before its stream: ``error``. Both act only on a still-active handle
        (TD-10); an uncorrelated report settles nothing.
        """
        if correlation is None:
            return NewMessage(text=text, kind=EntryKind.REPORT, id=entry, mode=mode,
                              cancel_token=token)  # fmt: skip
        turn = correlation

        def canceled(reason: str) -> None:
            self.report_settles(turn, HandleStatus.INTERRUPTED, REPORT_CANCELED)

        def failed(failure: SendFailure) -> None:
            why = f"its report wake-up failed before its stream ({failure.type}: {failure.message})"
            self.report_settles(turn, HandleStatus.ERROR, why)

        return NewMessage(
            text=text,
            kind=EntryKind.REPORT,
            id=entry,
            mode=mode,
            metadata=MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=correlation),
            cancel_token=token,
            workspace_turn_continuation=True,
            on_canceled=canceled,
            on_accepted_pre_stream_failure=failed,
        )

    def report_settles(self, correlation: Correlation, status: HandleStatus, why: str) -> None:
        """A report wake-up of ``correlation`` went nowhere: settle its turn if still active."""
        self._settle_active(correlation, status, why)
        self._write_in_a_task()

    def _ended(self, event: ChildEnded, correlation: Correlation) -> None:
        record = self._active(correlation, event.target)
        if record is None:
            self._heal(event, correlation)
            return
        if event.stream in record.deferred:
            return  # TD-1: deferred on already
        if event.finish is FinishReason.TOOL_CALLS:  # TD-2: one claim
            claimer = self._claimer(event.target)
            if claimer is not None and claimer.claim(correlation, event.stream):
                deferred = msgspec.structs.replace(
                    record, deferred=(*record.deferred, event.stream)
                )
                self._handles[record.handle_id] = deferred
                told = HandleClaimed(
                    session=event.target, handle=record.handle_id, cut=event.stream, answer="defer"
                )
                self._persist(deferred, (told,))
                return
            claimed = HandleClaimed(
                session=event.target, handle=record.handle_id, cut=event.stream, answer="settle"
            )
            self._settle(record, HandleStatus.INTERRUPTED, SUPERSEDED, (claimed,))
        elif event.finish is FinishReason.STOP:  # TD-3
            self._settle(record, HandleStatus.COMPLETED, "completed", report=event.report)
        else:
            why = f"ended before completion (finish {event.finish})"
            self._settle(record, HandleStatus.ERROR, why)

    def turn_began(self, handle: str) -> None:
        """A stream of the delegated turn ``handle`` started: its prompt row is in history."""
        if handle in self._handles:
            self._begun.add(handle)

    def _superseded(self, target: str) -> None:
        """TD-4: an uncorrelated stream-end in the target supersedes its delegated turns.

        So does an uncorrelated stream that fails: the send that started it withdrew the
        delegated turn's continuation (R35) for its own end to settle the turn, and no end
        comes. Not a turn that has not begun yet: that stream precedes the turn's prompt row.
        """
        self._interrupt_all(target, SUPERSEDED_UNCORRELATED, begun_only=True)

    def _heal(self, event: ChildEnded, correlation: Correlation) -> None:
        """TD-3: a correlated stream-end re-settles a handle settled ``error`` or stale.

        The turn went on after that settlement (a correlated entry ran it) and this end says
        how it really ended: ``stop`` completes it with the report; another non-``tool-calls``
        finish turns a stale ``interrupted`` into ``error``. A ``tool-calls`` end changes
        nothing (the turn is still going; a later end of it may heal it). Never a
        ``completed`` handle, an ``interrupted`` one someone asked for (TD-5, TD-7, TD-8) or
        a forfeit's, and not while the earlier settlement is still being written (R54).
        Missing or out of scope: ignored (TD-1).
        """
        record = self._matching(correlation, event.target)
        if record is None or record.handle_id in self.retrying:
            return
        stale = record.status is HandleStatus.ERROR or (
            record.status is HandleStatus.INTERRUPTED and record.reason in STALE_INTERRUPTIONS
        )
        if not stale or event.finish is FinishReason.TOOL_CALLS:
            return
        if event.finish is FinishReason.STOP:
            self._settle(record, HandleStatus.COMPLETED, "completed", report=event.report)
        elif record.status is HandleStatus.INTERRUPTED:
            why = f"ended before completion (finish {event.finish})"
            self._settle(record, HandleStatus.ERROR, why)

    def _interrupt_all(self, target: str, why: str, *, begun_only: bool = False) -> None:
        for record in list(self._handles.values()):
            if record.target != target or record.status is not HandleStatus.ACTIVE:
                continue
            if not begun_only or record.handle_id in self._begun:
                self._settle(record, HandleStatus.INTERRUPTED, why)

    def _active(self, correlation: Correlation, target: str) -> HandleRecord | None:
        record = self._matching(correlation, target)
        if record is None or record.status is not HandleStatus.ACTIVE:
            return None
        return record

    def _matching(self, correlation: Correlation, target: str) -> HandleRecord | None:
        """The handle ``correlation`` names, if it is that turn's in ``target`` (TD-1)."""
        record = self._handles.get(correlation.handle_id)
        if (
            record is None
            or record.target != target
            or record.owner != correlation.owner_session
            or record.turn_id != correlation.turn_id
        ):
            return None
        return record

    def _settle_active(self, correlation: Correlation, status: HandleStatus, why: str) -> None:
        """TD-10: settle the handle if it exists, matches and is still active; else nothing."""
        record = self._handles.get(correlation.handle_id)
        if (
            record is not None
            and record.status is HandleStatus.ACTIVE
            and record.owner == correlation.owner_session
            and record.turn_id == correlation.turn_id
        ):
            self._settle(record, status, why)

    # ------------------------------------------------------------ settling

    def _settle(
        self,
        record: HandleRecord,
        status: HandleStatus,
        why: str,
        before: tuple[EngineEvent, ...] = (),
        *,
        report: str | None = None,
    ) -> None:
        """Decide the settlement now (in memory), write it, then tell it (R54: retried)."""
        settled = msgspec.structs.replace(
            record,
            status=status,
            reason=why,
            report=report if status is HandleStatus.COMPLETED else None,
            deferred=(),  # TD-10: a settlement clears the deferred ids
            delivered=True,  # this owner is the engine: written is delivered
            settled_at=self._now(),
        )
        self._handles[record.handle_id] = settled
        self._begun.discard(record.handle_id)
        told = HandleSettled(session=record.owner, handle=record.handle_id, status=status.value)
        self._persist(settled, (*before, told), settles=True)

    def _persist(
        self, record: HandleRecord, tell: tuple[EngineEvent, ...], *, settles: bool = False
    ) -> None:
        """Queue the write of ``record`` (then ``tell``): :meth:`_take_writes` hands it out."""
        if settles:
            self.retrying.add(record.handle_id)
        self._writes.append((record, tell, settles))

    def _write_in_a_task(self) -> None:
        """What a host's call decided, written in a task of the engine's (no flow awaits it)."""
        write = self._take_writes()
        if write is not None:
            self._spawn(lambda: write)

    def _take_writes(self) -> Coroutine[Any, Any, None] | None:
        """The decided writes, in order, as one awaitable; ``None`` when there are none."""
        writes, self._writes = self._writes, []
        if not writes:
            return None
        return self._write_all(writes)

    async def _write_all(
        self, writes: list[tuple[HandleRecord, tuple[EngineEvent, ...], bool]]
    ) -> None:
        for record, tell, settles in writes:
            try:
                await self._write_record(record, settles=settles)
            except (TurnkeeperError, OSError) as error:
                if not settles:
                    log.warning("the handle %s was not written: %s", record.handle_id, error)
                    continue
                self._spawn(partial(self._retry, record, tell, error))
                continue
            self._told(record, tell, settles=settles)

    async def _retry(
        self, record: HandleRecord, tell: tuple[EngineEvent, ...], error: BaseException
    ) -> None:
        """R54: a settlement whose write failed, retried with backoff until it is written."""
        delay = RETRY_FIRST_S
        while True:
            log.warning(
                "the settlement of %s was not written (%s); retrying in %g s",
                record.handle_id,
                error,
                delay,
            )
            await self._clock.sleep_until(self._now() + delay)
            delay = min(delay * 2, RETRY_MAX_S)
            try:
                await self._write_record(record, settles=True)
            except (TurnkeeperError, OSError) as again:
                error = again
                continue
            self._told(record, tell, settles=True)
            return

    def _told(self, record: HandleRecord, tell: tuple[EngineEvent, ...], *, settles: bool) -> None:
        """``record`` is durable: say so, tell what it decided, wake who waits on it."""
        self._emit(
            Persisted(session=self.written_under(record), what="handle", id=record.handle_id)
        )
        for event in tell:
            self._emit(event)
        if settles:
            self.retrying.discard(record.handle_id)
            self._wake(record.handle_id)

    async def _write_record(self, record: HandleRecord, *, settles: bool) -> None:
        if settles and self.fail_next > 0:
            self.fail_next -= 1
            raise SettlementFailed(f"the settlement of {record.handle_id} failed (injected)")
        await self._write(self.written_under(record), Boundary(handles=(record,)))

    def written_under(self, record: HandleRecord) -> str:
        """The session whose lease a write of ``record`` goes under.

        Its owner's, unless the owner runs in another process (LS-11: then its target's,
        which this engine holds).
        """
        if self._holds is None or self._holds(record.owner):
            return record.owner
        return record.target

    def _wake(self, handle: str) -> None:
        event = self._settled.pop(handle, None)
        if event is not None:
            event.set()

    def _now(self) -> float:
        return self._clock.now()


def final_report(handle: str, load: SessionLoad) -> str | None:
    """The report of the turn ``handle`` if its last stream ended ``stop`` in a durable row.

    Read from the target's history at startup: the last stream of the handle (its turn
    envelopes name it) wrote a complete assistant row with the finish ``stop``, and no row of
    the turn follows it. ``None`` otherwise (the turn did not finish, or ended otherwise),
    and for a row that cannot be read (its damage is reported where it is read).
    """
    streams = [envelope.stream for envelope in load.envelopes if envelope.handle == handle]
    if not streams:
        return None
    mine = frozenset(streams)
    last = next(
        (row for row in reversed(load.rows) if row.stream in mine and row.kind is not RowKind.USER),
        None,
    )
    if last is None or last.kind is not RowKind.ASSISTANT or last.stream != streams[-1]:
        return None
    try:
        body = decode_body(last)
    except TurnkeeperError as error:
        log.warning("the last row of %s's turn is unreadable: %s", handle, error)
        return None
    return body.text if body.finish == FinishReason.STOP.value else None


class SettlementFailed(TurnkeeperError):
    """A settlement could not be recorded (it is retried, R54)."""


__all__ = [
    "ChildAborted",
    "ChildDisposed",
    "ChildEnded",
    "ChildEvent",
    "ChildFailed",
    "ChildForfeited",
    "ChildHardStopped",
    "ChildUnsent",
    "Delegation",
    "Delegations",
    "HandleInUse",
    "SettlementFailed",
    "UnknownHandle",
    "final_report",
]
