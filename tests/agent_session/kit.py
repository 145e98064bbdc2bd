"""A rule test in ten lines: drive the real turn machine with inputs and assert what it decides.

No engine, store, stream manager or event loop: a :class:`Kit` holds a real
:class:`~agent_session._machine.TurnMachine` and plays its shell the way ``AgentSession`` does
(``_do`` for a host call, ``_perform`` for an awaited adapter, the one writer for a
:class:`~agent_session._effects.Commit`), against a fake durable state: the rows by id and the
cut-record state of each row.

How to write a rule test
------------------------
1. Reach the state the rule starts from in one line: :meth:`Kit.streaming` (a turn is
   streaming), :meth:`Kit.cut` (a wake's turn cut for a queued entry, the cutter dispatched),
   :meth:`Kit.stranded` (the same, the cutter withdrawn: idle, owed, the sweep due). From
   there the kit plays the collaborators: the queue (``queue``, ``withdraw``), the send
   pipeline (``accept``, ``direct``), the sweep and resumes (``sweep``, ``resume``) and the
   stream (``start``, ``end``, ``final``, ``abort``, ``error``, ``refuse``, ``withdrawn``).
2. Give the input under test. :meth:`Kit.give` returns the machine's raw effects and performs
   nothing: assert the decision itself (``== [Emit(...), Next(...)]``; effects are frozen
   Structs, so they print and compare). :meth:`Kit.call` performs it as a host's synchronous
   call (writes in the background, then settled), :meth:`Kit.run` as an adapter's awaited
   input (each write where it stands).
3. Assert what came out: :attr:`Kit.told` (events in the order the host heard them, each write's
   ``persisted`` among them), :meth:`Kit.names`, :meth:`Kit.ended`, the fake store
   (:attr:`Kit.rows`, :attr:`Kit.states`, :meth:`Kit.state_of`), and what the shell was asked
   to act on (:attr:`Kit.acted`: dispatches, stops, resumes, aborts, cancellations, sweeps).
   :meth:`Kit.forget` drops what was recorded so far, so the assertions see only the input's.

``kit.fail(what="final row")`` fails the next commit whose ``what`` contains that text (or
``part="cut_states"``: whose boundary has that part): nothing of it is written, the machine is
given its ``failed`` input. ``kit.during(lambda: kit.call(Stop()), part="rows")`` makes a host
call land while that commit is awaited (a race at the write's await).

A kit test names the rule it checks (``test_st7_...``) and should fail when that rule is taken
out of ``_machine.py`` (break it locally, see the test fail, revert).

Example (ST-5, R6)::

    def test_st5_r6_a_user_stop_withdraws_the_owed_continuation() -> None:
        kit = Kit()
        cut = kit.stranded(remaining=3)
        kit.call(Stop())
        kit.call(Restore())
        assert kit.ended() == [(cut, "withdrawn")]
        assert kit.state_of(cut) is CutState.WITHDRAWN
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from agent_session import _inputs as _in
from agent_session._delegation import ChildEnded, ChildEvent
from agent_session._effects import (
    AbortPrepared,
    AbortResume,
    CancelRemoved,
    Commit,
    Dispatch,
    Effect,
    Emit,
    Next,
    Reply,
    ScheduleSweep,
    StartResume,
    StopStream,
    TellOwner,
)
from agent_session._events import ContinuationEnded, EngineEvent, EntryCanceled, PhaseChanged
from agent_session._machine import TurnMachine
from agent_session._turn import StreamContext, TurnInput
from message_queue import (
    CancelToken,
    Correlation,
    DispatchMode,
    EntryKind,
    MessageMetadata,
    MetadataType,
    NewMessage,
    notify_all_canceled,
)
from persistence import CutState, HistoryRow
from stream_manager import (
    Aborted,
    AbortMetadata,
    AbortReason,
    Ended,
    ErrorKind,
    Failed,
    FinishReason,
    ModelFallbackProgress,
    Persisted,
    QueuedStopReport,
    Refused,
    StopWhy,
    StreamInfo,
    TextPart,
    Withdrawn,
)
from stream_manager.errors import ErrorType

#: The kit's values differ from every default: a session, models, a cap and a correlation.
MODELS = frozenset({"model-b", "fallback-c"})
CAP = 2
PROGRESS = ModelFallbackProgress(
    requested_model="model-b", refused_models=("model-b",), chain=("fallback-c",)
)
CORRELATION = Correlation(handle_id="handle-7", owner_session="owner-3", turn_id="turn-9")

#: What the shell acts on (everything but telling, writing, feeding and replying).
Act = ScheduleSweep | StopStream | AbortPrepared | AbortResume | Dispatch | StartResume | TellOwner
Told = EngineEvent | Persisted
T = TypeVar("T")


def _matcher(what: str | None, part: str | None) -> Callable[[Commit], bool]:
    """Whether a commit's ``what`` contains ``what`` and its boundary has ``part``."""

    def matches(commit: Commit) -> bool:
        if what is not None and what not in commit.what:
            return False
        return part is None or bool(getattr(commit.boundary, part))

    return matches


@dataclass
class Stream:
    """The stream the kit launched: its id, its context, and whether it started."""

    id: str
    context: StreamContext
    started: bool = False


@dataclass
class Kit:
    """A real turn machine, performed as the session shell does, against a fake store."""

    session: str = "s-7"
    model: str = "model-b"
    cap: int = CAP
    next_seq: int = 5
    machine: TurnMachine = field(init=False)
    #: The durable rows, by id, and the durable cut-record state of each row carrying one.
    rows: dict[str, HistoryRow] = field(default_factory=dict)
    states: dict[str, CutState] = field(default_factory=dict)
    #: What the host was told, in order (each write's ``persisted`` among the events).
    told: list[Told] = field(default_factory=list)
    #: What the shell was asked to act on, in order (a ``CancelRemoved`` ran its callbacks).
    acted: list[Act | CancelRemoved] = field(default_factory=list)
    #: Writes a host call left to run (the shell runs them in a task): :meth:`settle` runs them.
    background: list[Effect] = field(default_factory=list)
    #: Commits that failed, by their ``what``.
    failed: list[str] = field(default_factory=list)
    #: Dispatches the pipeline has not run yet (:meth:`accept`), resumes not run (:meth:`resume`).
    dispatches: list[Dispatch] = field(default_factory=list)
    resumes: list[StartResume] = field(default_factory=list)
    sweep_due: bool = False
    stream: Stream | None = None
    #: What a delegated turn's owner heard, in order (the ``TellOwner`` effects).
    owner_heard: list[ChildEvent] = field(default_factory=list)
    #: The owner, called as the shell calls it; what it returns is performed next (an inbox:
    #: :meth:`claim_when_told`).
    owner: Callable[[ChildEvent], list[Effect]] | None = None
    _failing: list[Callable[[Commit], bool]] = field(default_factory=list)
    _during: list[tuple[Callable[[Commit], bool], Callable[[], object]]] = field(
        default_factory=list
    )
    _entries: int = 0

    def __post_init__(self) -> None:
        self.machine = TurnMachine(
            self.session,
            self.model,
            known_models=MODELS,
            resume_attempt_cap=self.cap,
            next_seq=self.next_seq,
        )

    # ------------------------------------------------------------ giving inputs

    def give(self, given: _in.Input) -> list[Effect]:
        """The machine's decision for ``given``, un-performed (nothing is expanded or written)."""
        return self.machine.handle(given)

    def call(self, given: _in.Input, *, settle: bool = True) -> object:
        """``given`` as a host's synchronous call (``AgentSession._do``); returns its reply.

        A ``Next`` is handled in place; a write (a ``Commit``, a record flush) cannot be
        awaited, so it goes to :attr:`background` and the effects after it run first. With
        ``settle`` the background then runs, as the shell's task would once the call returned.
        """
        reply = self._perform(self.machine.handle(given), sync=True)
        if settle:
            self.settle()
        return reply

    def run(self, given: _in.Input) -> object:
        """``given`` as an adapter's awaited input (``AgentSession._perform``): each write where
        it stands, its ``then`` (or ``failed``) input handled before the next effect."""
        return self._perform(self.machine.handle(given), sync=False)

    def settle(self) -> None:
        """Run the writes host calls left in the background, oldest first."""
        while self.background:
            self._perform([self.background.pop(0)], sync=False)

    def fail(self, *, what: str | None = None, part: str | None = None, times: int = 1) -> None:
        """Fail the next ``times`` commits whose ``what`` contains ``what`` or whose boundary
        has ``part`` (``rows``, ``delete``, ``cut_states``, ``envelope``)."""
        self._failing.extend([_matcher(what, part)] * times)

    def during(
        self, do: Callable[[], object], *, what: str | None = None, part: str | None = None
    ) -> None:
        """Run ``do`` (a host call) while the next matching commit is awaited, before it lands."""
        self._during.append((_matcher(what, part), do))

    def forget(self) -> None:
        """Drop what was told and acted on so far (the machine and the store stay)."""
        self.told.clear()
        self.acted.clear()
        self.failed.clear()

    # ------------------------------------------------------------ the shell

    def _perform(self, effects: list[Effect], *, sync: bool) -> object:
        """Perform ``effects`` in order; return the last ``Reply`` (``None`` without one)."""
        queue, reply = list(effects), None
        while queue:
            effect = queue.pop(0)
            if isinstance(effect, Next):
                if sync and isinstance(effect.input, _in.FlushRecords):
                    self.background.append(effect)  # a task's work, as in ``_do``
                    continue
                queue[:0] = self.machine.handle(effect.input)
            elif isinstance(effect, Commit):
                if sync:
                    self.background.append(effect)
                else:
                    queue[:0] = self._commit(effect)
            elif isinstance(effect, Emit):
                self.tell(effect.event)
            elif isinstance(effect, Reply):
                reply = effect.value
            else:
                queue[:0] = self._act(effect)
        return reply

    def _commit(self, effect: Commit) -> list[Effect]:
        """The one writer: all of the boundary or nothing; told after, then the result."""
        hook = next((h for h in self._during if h[0](effect)), None)
        if hook is not None:
            self._during.remove(hook)
            hook[1]()
        failing = next((f for f in self._failing if f(effect)), None)
        if failing is not None:
            self._failing.remove(failing)
            self.failed.append(effect.what)
            if effect.failed is None:
                return []
            error = OSError(f"disk full at {effect.what}")
            return self.machine.handle(msgspec.structs.replace(effect.failed, error=error))
        boundary = effect.boundary
        for row_id in boundary.delete:
            self.rows.pop(row_id, None)
            self.states.pop(row_id, None)
        for row in boundary.rows:
            self.rows[row.row_id] = row
            if row.cut is not None:
                self.states[row.row_id] = row.cut.state
        for change in boundary.cut_states:
            self.states[change.row_id] = change.state
        for event in effect.tell:
            self.tell(event)
        return [] if effect.then is None else self.machine.handle(effect.then)

    def tell(self, event: Told) -> None:
        """The host hears ``event`` (a subclass may check something here)."""
        self.told.append(event)

    def _act(self, effect: Effect) -> list[Effect]:
        assert isinstance(effect, Act | CancelRemoved), effect
        self.acted.append(effect)
        if isinstance(effect, ScheduleSweep):
            self.sweep_due = True
        elif isinstance(effect, CancelRemoved):
            notify_all_canceled(list(effect.removed), effect.reason)
        elif isinstance(effect, Dispatch):
            self.dispatches.append(effect)
        elif isinstance(effect, StartResume):
            self.resumes.append(effect)
        elif isinstance(effect, TellOwner):
            self.owner_heard.append(effect.child)
            if self.owner is not None:
                return self.owner(effect.child)
        elif isinstance(effect, StopStream) and (self.stream is None or not self.stream.started):
            # nothing streams: the manager reports a synthetic abort at once (AS-21)
            return self.machine.handle(_in.SyntheticAbort(effect.reason))
        return []

    # ------------------------------------------------------------ reading

    def names(self) -> list[str]:
        """The told events' type names, in order (``persisted`` as ``Persisted:<what>``)."""
        return [
            f"Persisted:{e.what}" if isinstance(e, Persisted) else type(e).__name__
            for e in self.told
        ]

    def of(self, kind: type[T]) -> list[T]:
        """The told events of ``kind``."""
        return [e for e in self.told if isinstance(e, kind)]

    def ended(self) -> list[tuple[str, str]]:
        """Each ``continuation-ended`` told: (cut, how)."""
        return [(e.cut, e.how.value) for e in self.of(ContinuationEnded)]

    def phases(self) -> list[str]:
        """Each phase the session moved to, in order."""
        return [e.to.value for e in self.of(PhaseChanged)]

    def acts(self, kind: type[Effect]) -> list[Effect]:
        """What the shell was asked to act on, of ``kind``."""
        return [a for a in self.acted if isinstance(a, kind)]

    def row_of(self, cut: str) -> str:
        """The id of the durable row carrying the record of ``cut``."""
        (row_id,) = [r.row_id for r in self.rows.values() if r.stream == cut and r.cut]
        return row_id

    def rows_of_kind(self, kind: str) -> list[HistoryRow]:
        """The durable rows of ``kind`` (``user``, ``assistant``, ``partial``, ``sentinel``)."""
        return [r for r in sorted(self.rows.values(), key=lambda r: r.seq) if r.kind == kind]

    def state_of(self, cut: str) -> CutState:
        """The durable state of the record of ``cut``."""
        return self.states[self.row_of(cut)]

    # ------------------------------------------------------------ the host and the queue

    def add(
        self,
        kind: EntryKind = EntryKind.USER,
        *,
        correlated: bool = False,
        mode: DispatchMode = DispatchMode.TOOL_END,
        on_canceled: Callable[[str], None] | None = None,
    ) -> str:
        """Add an entry ``e1``, ``e2`` ... to the queue (a correlated one carries
        :data:`CORRELATION`), the machine not told yet; returns its id."""
        self._entries += 1
        entry = f"e{self._entries}"
        metadata = None
        if correlated:
            metadata = MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=CORRELATION)
        message = NewMessage(
            text=f"entry {self._entries}",
            kind=kind,
            mode=mode,
            id=entry,
            cancel_token=CancelToken(),
            metadata=metadata,
            on_canceled=on_canceled,
        )
        self.machine.queue.add(message)
        return entry

    def queue(
        self,
        kind: EntryKind = EntryKind.USER,
        *,
        correlated: bool = False,
        mode: DispatchMode = DispatchMode.TOOL_END,
        on_canceled: Callable[[str], None] | None = None,
    ) -> str:
        """Queue an entry (:meth:`add`) and tell the machine: an idle session drains it."""
        entry = self.add(kind, correlated=correlated, mode=mode, on_canceled=on_canceled)
        self.call(_in.Queued())
        return entry

    def claim(self, stream: str, correlation: Correlation = CORRELATION) -> bool:
        """The owner's claim (ST-15) on the cut ``stream``, as a host call."""
        return self.call(_in.Claim(correlation, stream)) is True

    def claim_when_told(self) -> list[bool]:
        """The owner claims each correlated ``tool-calls`` end it hears, while it is told (TD-2).

        Returns the list the answers go to; what a claim decides is performed after the
        telling, as the shell's inbox does.
        """
        answers: list[bool] = []

        def owner(child: ChildEvent) -> list[Effect]:
            if not (
                isinstance(child, ChildEnded)
                and child.finish is FinishReason.TOOL_CALLS
                and child.correlation is not None
            ):
                return []
            effects = self.machine.handle(_in.Claim(child.correlation, child.stream))
            answers.extend(e.value is True for e in effects if isinstance(e, Reply))
            return [e for e in effects if not isinstance(e, Reply)]

        self.owner = owner
        return answers

    def withdraw(self, entry: str) -> bool:
        """The producer withdraws ``entry`` (AS-3)."""
        return self.call(_in.Withdraw(entry, "withdrawn by its producer")) is True

    # ------------------------------------------------------------ the send pipeline and launcher

    def accept(self) -> str | None:
        """Run the pipeline for the oldest dispatch: user row, supersede, accept, launch.

        A withdrawn entry goes nowhere (AS-3) and ``None`` is returned; else the launched
        stream's id.
        """
        dispatch = self.dispatches.pop(0)
        self.run(_in.Dispatched(dispatch.token))
        return self._pipeline(dispatch.turn)

    def direct(self, text: str = "a direct send") -> str | None:
        """A manual send on an idle session (R3): preflight, then the pipeline."""
        self.call(_in.DirectSend())
        return self._pipeline(TurnInput(text=text))

    def _pipeline(self, turn: TurnInput) -> str | None:
        if turn.canceled():  # AS-3: the pipeline tells the cancellation itself
            if turn.entry_id is not None:
                reason = turn.cancel_token.reason if turn.cancel_token else None
                self.tell(
                    EntryCanceled(session=self.session, entry=turn.entry_id, reason=reason or "")
                )
            self.run(_in.SendWentNowhere(turn))
            return None
        row = self.run(_in.UserRowWanted(turn))
        if not isinstance(row, HistoryRow):
            self.run(_in.SendWentNowhere(turn))
            return None
        self.run(_in.Supersede(turn, "superseded by a send (R35)"))
        self.run(_in.TurnAccepted(turn))
        return self.launch(self.machine.turn_context(turn))

    def launch(self, context: StreamContext) -> str:
        """The launcher: history (with R34's sentinel), the stream's id, its envelope."""
        assert self.stream is None, "two streams at once"
        ordered = sorted(self.rows.values(), key=lambda r: r.seq)
        self.run(_in.HistoryLoaded(tuple(ordered)))
        self.machine.handle(_in.Launching(context))
        stream = Stream(self.machine.next_stream_id(), context)
        self.stream = stream
        info = StreamInfo(self.session, stream.id, context.model, context.step_budget or 8)
        self.run(_in.EnvelopeReady(info))
        return stream.id

    def resume(self, *, fails: bool = False) -> str | None:
        """Run the oldest resume the sweep started: its launch, or a failure before it (ST-10)."""
        start = self.resumes.pop(0)
        if fails:
            self.run(_in.ResumeFailed(start.marker, start.attempt))
            return None
        return self.launch(self.machine.resume_context(start.marker, start.attempt))

    def sweep(self) -> None:
        """The scheduled sweep runs (``AgentSession._sweep``): failed record writes first."""
        assert self.sweep_due, "no sweep was scheduled"
        self.sweep_due = False
        self.run(_in.FlushRecords())
        self.call(_in.SweepDue())

    # ------------------------------------------------------------ the stream

    def start(self) -> object:
        """The launched stream emits ``stream-start`` and reaches its first step.

        Returns the start write's reply: an error when it failed (the stream may run no step;
        :meth:`error` with ``ErrorType.STORE_WRITE`` is its outcome).
        """
        stream = self.stream
        assert stream is not None
        assert not stream.started
        stream.started = True
        self.call(_in.StreamBegan(stream.id, stream.context.cause))
        return self.run(_in.StartReached())

    def refuse(self) -> None:
        """The launch probe refuses the launched stream (it never starts)."""
        self._not_started(Refused("the launch probe said no"))

    def withdrawn(self, reason: AbortReason = AbortReason.USER) -> None:
        """The launched stream is withdrawn before it starts (its abort signal fired)."""
        self._not_started(Withdrawn(reason))

    def _not_started(self, outcome: Refused | Withdrawn) -> None:
        stream = self._outcome()
        if stream.context.resume_of is not None:
            self.run(_in.NotStarted(outcome, stream.context))
            self.run(_in.FlushRecords())
        else:
            self.run(_in.Outcome(outcome, stream.context))

    def _outcome(self) -> Stream:
        stream = self.stream
        assert stream is not None, "no stream is launched"
        self.stream = None
        return stream

    def end(self, remaining: int = 4, *, cut: bool = False) -> None:
        """The stream ends: cut at a tool boundary for the queued entry (``cut``), or done.

        Its final row is written first (:meth:`final`); when that write fails, the stream
        fails with ``store_write`` instead (SM-15).
        """
        ended = self.final(remaining, cut=cut)
        if not isinstance(ended, Ended):
            self.error(ErrorType.STORE_WRITE)
            return
        self.run(_in.Outcome(ended, self._outcome().context))

    def final(self, remaining: int = 4, *, cut: bool = False) -> Ended | BaseException:
        """The stream's last step: its stop report (``cut``) and its final row, no outcome yet.

        Returns the stream's end, or the error of its final row's write.
        """
        stream = self.stream
        assert stream is not None
        assert stream.started
        report = None
        if cut:
            report = QueuedStopReport(
                stream=stream.id,
                model="fallback-c",
                steps_remaining=remaining,
                fallback_progress=PROGRESS,
            )
            self.machine.handle(_in.QueuedStop(report))
        ended = Ended(
            stream=stream.id,
            model="fallback-c",
            finish=FinishReason.TOOL_CALLS if cut else FinishReason.STOP,
            why=StopWhy.QUEUED_MESSAGE if cut else StopWhy.FINISHED,
            steps=2,
            remaining=remaining,
            progress=PROGRESS,
            queued_stop=report,
            parts=(TextPart(text="an answer"),),
        )
        reply = self.run(_in.FinalReady(ended))
        return reply if isinstance(reply, BaseException) else ended

    def abort(
        self,
        reason: AbortReason = AbortReason.QUEUED_MESSAGE,
        *,
        remaining: int = 3,
        required_tool: bool = False,
        partial: str = "a partial",
    ) -> None:
        """The stream aborts (a soft stop's ``queued-message``, a user or system stop)."""
        meta = AbortMetadata(
            model="fallback-c",
            steps_remaining=remaining,
            fallback_progress=PROGRESS,
            required_tool_satisfied=required_tool,
        )
        stream = self._outcome()
        parts = (TextPart(text=partial),) if partial else ()
        aborted = Aborted(stream=stream.id, reason=reason, metadata=meta, parts=parts)
        self.run(_in.Outcome(aborted, stream.context))

    def error(self, kind: ErrorType = ErrorType.MALFORMED_OUTPUT) -> None:
        """The stream fails (by default a retryable provider error)."""
        stream = self._outcome()
        failed = Failed(
            stream=stream.id,
            type=kind,
            kind=ErrorKind.RETRYABLE,
            message="overloaded",
            remaining=2,
            model="fallback-c",
            progress=PROGRESS,
            parts=(),
        )
        self.run(_in.Outcome(failed, stream.context))

    # ------------------------------------------------------------ common states in one line

    def streaming(self, kind: EntryKind = EntryKind.WAKE, *, correlated: bool = False) -> str:
        """A queued entry's turn is streaming; returns its stream id."""
        self.queue(kind, correlated=correlated)
        stream = self.accept()
        assert stream is not None
        self.start()
        return stream

    def cut(
        self,
        remaining: int = 3,
        *,
        correlated: bool = False,
        cutter: EntryKind = EntryKind.WAKE,
    ) -> str:
        """A wake's turn cut at a tool boundary for a queued ``cutter``; returns the cut id.

        The cut owes ``remaining`` steps (nothing at 0, R65); the drain has dequeued the cutter
        (PREPARING) and its dispatch waits for :meth:`accept`.
        """
        stream = self.streaming(EntryKind.WAKE, correlated=correlated)
        self.queue(cutter)
        self.end(remaining, cut=True)
        return stream

    def stranded(self, remaining: int = 3, *, correlated: bool = False) -> str:
        """The incident: a cut whose cutter was withdrawn before it started; returns the cut id.

        The session is idle, owes the cut, and its sweep is due.
        """
        cut = self.cut(remaining, correlated=correlated)
        dispatch = self.dispatches[0]
        assert dispatch.turn.entry_id is not None
        self.withdraw(dispatch.turn.entry_id)
        assert self.accept() is None
        return cut
