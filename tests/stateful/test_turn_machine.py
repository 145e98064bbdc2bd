"""A hypothesis state machine that drives the real turn machine (``agent_session._machine``).

The test plays the shell: it performs the machine's effects with a fake store that remembers
what was committed, plays the stream manager (a launched stream starts, cuts, ends, aborts,
fails or is refused; a hard stop aborts it) and the host (queued wakes and user entries, their
withdrawal, Stop, hard stop, send-now, clears, discards). A flush requested by a synchronous
host call lands later, when hypothesis chooses (``background_flush``), as it does in a task.

Checked at every step:

1. durable before told: ``continuation-ended`` is told only once the cut's row carries the
   ended state durably (or no row carrying the record was ever written); ``owed`` only once the
   row carrying its record is durable (R60, PS-6);
2. nothing stranded: an idle session that owes a continuation, with an empty queue and no
   manual send in preflight, has a resume in flight or a sweep scheduled (ST-7, AS-2); an
   idle session holding queued entries has a sweep scheduled, which drains them (AS-13);
3. at most one resume in flight; the sweep is idempotent, resumes exactly when nothing blocks
   it (ST-7, R3, R7) with consecutive attempt numbers, and forfeits exactly at the cap (R21);
4. a continuation ends once: no cut is told ended twice, and none is resumed after it ended;
5. a cut is consumed only by a stream that started while it was owed; the consumed list keeps
   the newest (ST-4, R64, R33); failed attempts stay within the cap (R21);
6. every phase move is one the table allows (``next_phase`` raises otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hypothesis.strategies as st
import msgspec
from hypothesis import settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from agent_session import _inputs as _in
from agent_session._continuation import CONSUMED_CUTS_BOUND, Marker
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
from agent_session._events import ContinuationEnded, ContinuationOwed
from agent_session._machine import TurnMachine
from agent_session._phases import Phase
from agent_session._turn import StreamContext, TurnInput
from message_queue import (
    CancelToken,
    Correlation,
    EntryKind,
    MessageMetadata,
    MetadataType,
    NewMessage,
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
    QueuedStopReport,
    Refused,
    StopWhy,
    TextPart,
    Withdrawn,
)
from stream_manager.errors import ErrorType

MODELS = frozenset({"model-b", "fallback-c"})
CAP = 2  # resume attempts that may fail before the marker is forfeited (R21), not the default
PROGRESS = ModelFallbackProgress(
    requested_model="model-b", refused_models=("model-b",), chain=("fallback-c",)
)
CORRELATION = Correlation(handle_id="handle-7", owner_session="owner-3", turn_id="turn-9")
_ENDED_STATE = {
    "consumed": CutState.CONSUMED,
    "withdrawn": CutState.WITHDRAWN,
    "forfeited": CutState.FORFEITED,
    "voided": CutState.VOIDED,
}


@dataclass
class Stream:
    """A stream the machine launched: its id, context, and what the manager did to it."""

    id: str
    context: StreamContext
    started: bool = False
    hard_stop: AbortReason | None = None
    soft_stop: bool = False


@dataclass
class Shell:
    """Performs effects the way ``AgentSession`` does, against a fake store."""

    machine: TurnMachine
    rows: dict[str, HistoryRow] = field(default_factory=dict)
    #: Durable cut-record state, by row id (what the store holds).
    states: dict[str, CutState] = field(default_factory=dict)
    told: list[object] = field(default_factory=list)
    ended: set[str] = field(default_factory=set)
    dispatches: list[Dispatch] = field(default_factory=list)
    resumes: list[tuple[StartResume, bool]] = field(default_factory=list)
    flush_due: bool = False
    sweep_due: bool = False
    stream: Stream | None = None
    #: Cuts whose carrying row was never written (its write failed): nothing durable to wait for.
    unwritten: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    #: The next commit fails (nothing of it is written; its ``failed`` input is handled).
    fail_next: bool = False
    #: Queue-only commits a synchronous input decided: the shell writes them in a task.
    queue_writes: list[Commit] = field(default_factory=list)

    def perform(self, effects: list[Effect], *, sync: bool) -> None:
        for effect in effects:
            if isinstance(effect, Next):
                if sync and isinstance(effect.input, _in.FlushRecords):
                    self.flush_due = self.flush_due or bool(self.machine.pending)
                else:
                    self.perform(self.machine.handle(effect.input), sync=sync)
            elif isinstance(effect, Commit):
                if sync and effect.boundary.queue is not None and not effect.boundary.rows:
                    self.queue_writes.append(effect)  # the durable queue: written in a task
                    continue
                assert not sync, "a synchronous input committed (not through a flush)"
                self.commit(effect)
            elif isinstance(effect, Reply):
                pass
            elif isinstance(effect, Emit):
                self.tell(effect.event)
            elif isinstance(effect, ScheduleSweep):
                self.sweep_due = True
            elif isinstance(effect, Dispatch):
                self.dispatches.append(effect)
            elif isinstance(effect, StartResume):
                self.resumes.append((effect, False))
            elif isinstance(effect, TellOwner):
                pass  # no owner in this model: what it hears is checked in test_delegation.py
            else:
                self.signal(effect)

    def signal(self, effect: Effect) -> None:
        """A stop or abort signal reaches the stream, the preparing turn or the resume."""
        if isinstance(effect, StopStream):
            self.stop_stream(effect)
        elif isinstance(effect, AbortResume):
            self.resumes = [(r, True) for r, _ in self.resumes]
        else:
            assert isinstance(effect, AbortPrepared | CancelRemoved)
            if isinstance(effect, AbortPrepared) and self.stream and not self.stream.started:
                self.stream.hard_stop = effect.reason

    def commit(self, effect: Commit) -> None:
        """The one writer: all of the boundary or nothing; told after, then the result."""
        if self.fail_next:
            self.fail_next = False
            if effect.failed is not None:
                error = OSError("disk full")
                failed = msgspec.structs.replace(effect.failed, error=error)
                self.perform(self.machine.handle(failed), sync=False)
            return
        boundary = effect.boundary
        for row in boundary.rows:
            self.rows[row.row_id] = row
            if row.cut is not None:
                self.states[row.row_id] = row.cut.state
        for change in boundary.cut_states:
            self.states[change.row_id] = change.state
        for event in effect.tell:
            self.tell(event)
        if effect.then is not None:
            self.perform(self.machine.handle(effect.then), sync=False)

    def flush(self) -> None:
        self.perform(self.machine.handle(_in.FlushRecords()), sync=False)

    def rows_of(self, cut: str) -> list[str]:
        return [r.row_id for r in self.rows.values() if r.stream == cut and r.cut is not None]

    def tell(self, event: object) -> None:
        self.told.append(event)
        if isinstance(event, ContinuationEnded):
            if event.cut in self.ended:
                self.problems.append(f"{event.cut} told ended twice")
            self.ended.add(event.cut)
            want = _ENDED_STATE[event.how]
            for row_id in self.rows_of(event.cut):
                if self.states[row_id] is not want:
                    self.problems.append(
                        f"{event.cut} told {event.how} while its row {row_id} is durably "
                        f"{self.states[row_id]}"
                    )
        elif (
            isinstance(event, ContinuationOwed)
            and not self.rows_of(event.cut)
            and event.cut not in self.unwritten
        ):
            self.problems.append(f"{event.cut} told owed before a row carries its record")

    def stop_stream(self, effect: StopStream) -> None:
        stream = self.stream
        if effect.soft:
            if stream is not None and stream.started:
                stream.soft_stop = True
            return
        if stream is not None and stream.started:
            stream.hard_stop = stream.hard_stop or effect.reason
            return
        if stream is not None:
            stream.hard_stop = stream.hard_stop or effect.reason
        self.perform(self.machine.handle(_in.SyntheticAbort(effect.reason)), sync=True)


class TurnMachineTest(RuleBasedStateMachine):
    """The real machine under generated inputs (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.machine = TurnMachine(
            "s-42", "model-b", known_models=MODELS, resume_attempt_cap=CAP, next_seq=5
        )
        self.shell = Shell(self.machine)
        self.entries = 0
        self.direct: TurnInput | None = None
        #: Cuts consumed, in order (a stream started while each was owed).
        self.consumed: list[str] = []
        #: The last resume attempt number started per cut.
        self.attempts: dict[str, int] = {}

    @initialize(
        remaining=st.integers(0, 3),
        correlated=st.booleans(),
        cutter=st.sampled_from([EntryKind.WAKE, EntryKind.USER]),
        withdrawn=st.booleans(),
        failures=st.integers(0, CAP),
    )
    def a_turn_cut_for_a_queued_entry(
        self,
        remaining: int,
        correlated: bool,
        cutter: EntryKind,
        withdrawn: bool,
        failures: int,
    ) -> None:
        """Start where strandings start: a wake's turn cut at a tool boundary for a queued entry.

        The cut owes ``remaining`` steps (none at 0, R65); ``withdrawn``: the entry that cut it
        is withdrawn before it starts (the stranded-turn incident), and the resume then fails
        before its stream ``failures`` times.
        """
        self.enqueue(EntryKind.WAKE, correlated)
        self.pipeline_runs(accept=True)
        self.stream_starts_or_is_refused(refused=False)
        self.enqueue(cutter, False)
        self.stream_ends(remaining, cut=True)
        if withdrawn:
            self.machine.handle(_in.Withdraw(f"e{self.entries}", "withdrawn"))
            self.pipeline_runs(accept=True)  # the withdrawn entry cancels before acceptance
            for failed in range(failures + 1):
                if self.shell.sweep_due:
                    self.sweep_runs()  # ST-7: the stranded turn is resumed (or forfeited, R21)
                if self.shell.resumes and failed < failures:
                    self.resume_runs(fails=True)

    # ------------------------------------------------------------ helpers

    def sync(self, effects: list[Effect]) -> None:
        self.shell.perform(effects, sync=True)

    def run(self, effects: list[Effect]) -> None:
        self.shell.perform(effects, sync=False)

    def launch(self, context: StreamContext) -> None:
        assert self.shell.stream is None, "two streams at once"
        self.machine.handle(_in.Launching(context))
        self.shell.stream = Stream(self.machine.next_stream_id(), context)

    def outcome(self, outcome: Ended | Aborted | Failed | Refused | Withdrawn) -> None:
        stream = self.shell.stream
        assert stream is not None
        self.shell.stream = None
        if isinstance(outcome, Refused | Withdrawn) and stream.context.resume_of is not None:
            not_started = self.machine.handle(_in.NotStarted(outcome, stream.context))
            self.run([*not_started, Next(_in.FlushRecords())])
        else:
            self.run(self.machine.handle(_in.Outcome(outcome, stream.context)))

    def meta(self, remaining: int) -> AbortMetadata:
        return AbortMetadata(
            model="fallback-c",
            steps_remaining=remaining,
            fallback_progress=PROGRESS,
            required_tool_satisfied=False,
        )

    # ------------------------------------------------------------ the host

    @rule(kind=st.sampled_from([EntryKind.WAKE, EntryKind.USER]), correlated=st.booleans())
    def enqueue(self, kind: EntryKind, correlated: bool) -> None:
        self.entries += 1
        correlation = CORRELATION if correlated and kind is EntryKind.WAKE else None
        metadata = None
        if correlation is not None:
            metadata = MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=correlation)
        self.machine.queue.add(
            NewMessage(
                text=f"entry {self.entries}",
                kind=kind,
                id=f"e{self.entries}",
                cancel_token=CancelToken(),
                metadata=metadata,
            )
        )
        self.sync(self.machine.handle(_in.Queued()))

    @precondition(lambda self: not self.machine.busy and self.direct is None)
    @rule()
    def send_directly(self) -> None:
        self.machine.handle(_in.DirectSend())
        self.direct = TurnInput(text="direct", options=None)

    @rule(
        action=st.sampled_from(["stop", "hard stop", "send now", "clear", "discard", "withdraw"]),
        data=st.data(),
    )
    def host_acts(self, action: str, data: st.DataObject) -> None:
        machine = self.machine
        if action == "stop":
            self.sync(machine.handle(_in.Stop()))
            self.sync(machine.handle(_in.Restore()))
        elif action == "hard stop":
            self.sync(machine.handle(_in.HardStop()))
        elif action == "send now":
            self.sync(machine.handle(_in.SendNow()))
        elif action == "clear":
            self.sync(machine.handle(_in.Clear("cleared", hard_stop=False)))
        elif action == "discard" and not machine.busy:
            self.sync(machine.handle(_in.Discard()))
            self.run([Next(_in.FlushRecords())])
        elif action == "withdraw":
            ids = [e.id for e in machine.queue if not e.withdrawn]
            if ids:
                machine.handle(_in.Withdraw(data.draw(st.sampled_from(ids)), "withdrawn"))

    @precondition(lambda self: self.shell.flush_due)
    @rule()
    def background_flush(self) -> None:
        self.shell.flush_due = False
        self.shell.flush()

    @precondition(lambda self: self.shell.queue_writes)
    @rule()
    def background_queue_write(self) -> None:
        self.shell.commit(self.shell.queue_writes.pop(0))

    @precondition(lambda self: self.shell.sweep_due)
    @rule()
    def sweep_runs(self) -> None:
        machine = self.machine
        self.shell.sweep_due = False
        marker = machine.continuation.marker
        blocked = (
            not machine.queue.is_empty or machine.manual_preflight or machine.phase.value != "idle"
        )
        in_flight = machine.continuation.resume_in_flight
        at_cap = machine.continuation.failed_attempts >= CAP
        resumes = len(self.shell.resumes)
        self.sync(machine.handle(_in.SweepDue()))
        assert machine.handle(_in.Sweep()) == [], "the sweep is not idempotent (ST-7)"
        if blocked or in_flight or marker is None:
            assert len(self.shell.resumes) == resumes, "a resume started while blocked (ST-7, R3)"
        elif at_cap:  # R21: forfeited exactly at the cap, never resumed
            assert machine.continuation.marker is None
            assert len(self.shell.resumes) == resumes
        else:
            assert len(self.shell.resumes) == resumes + 1, "a clear sweep did not resume"
            resume = self.shell.resumes[-1][0]
            assert resume.marker == marker
            assert resume.attempt == self.attempts.get(marker.cut, 0) + 1, "attempts skipped"
            self.attempts[marker.cut] = resume.attempt

    # ------------------------------------------------------------ the pipeline and resume

    @precondition(lambda self: self.shell.dispatches or self.direct is not None)
    @rule(accept=st.booleans())
    def pipeline_runs(self, accept: bool) -> None:
        machine = self.machine
        if self.shell.dispatches:
            dispatch = self.shell.dispatches.pop(0)
            turn, token = dispatch.turn, dispatch.token
            canceled = turn.canceled() or not accept
            machine.handle(_in.Dispatched(token))
        else:
            assert self.direct is not None
            turn, token, self.direct = self.direct, None, None
            canceled = not accept
        if canceled or self.shell.stream is not None:
            self.run(machine.handle(_in.SendWentNowhere(turn)))
            return
        self.run(machine.handle(_in.Supersede(turn, "superseded by a send (R35)")))
        self.run(machine.handle(_in.TurnAccepted(turn)))
        self.launch(machine.turn_context(turn))

    @precondition(lambda self: self.shell.resumes and self.shell.stream is None)
    @rule(fails=st.booleans())
    def resume_runs(self, fails: bool) -> None:
        (resume, aborted) = self.shell.resumes.pop(0)
        marker: Marker = resume.marker
        context = self.machine.resume_context(marker, resume.attempt)
        if aborted:
            self.launch(context)
            self.outcome(Withdrawn(AbortReason.SYSTEM))
        elif fails:
            self.run(self.machine.handle(_in.ResumeFailed(marker, resume.attempt)))
        else:
            self.launch(context)

    # ------------------------------------------------------------ the stream

    @precondition(lambda self: self.shell.stream is not None and not self.shell.stream.started)
    @rule(refused=st.booleans())
    def stream_starts_or_is_refused(self, refused: bool) -> None:
        stream = self.shell.stream
        assert stream is not None
        if stream.hard_stop is not None:
            self.outcome(Withdrawn(stream.hard_stop))
        elif refused:
            self.outcome(Refused("launch probe said no"))
        else:
            stream.started = True
            owed = self.machine.continuation.marker
            if owed is not None:
                self.consumed.append(owed.cut)  # ST-4: this stream consumes it
            self.sync(self.machine.handle(_in.StreamBegan(stream.id, stream.context.cause)))
            self.run(self.machine.handle(_in.StartReached()))

    @precondition(lambda self: self.shell.stream is not None and self.shell.stream.started)
    @rule(provider=st.booleans())
    def a_tool_runs(self, provider: bool) -> None:
        self.machine.handle(_in.ToolStarted("call-1"))
        self.sync(self.machine.handle(_in.ToolEnded("call-1", provider)))

    @precondition(lambda self: self.shell.stream is not None and self.shell.stream.started)
    @rule(remaining=st.integers(0, 4), cut=st.booleans(), write_fails=st.booleans())
    def stream_ends(self, remaining: int, cut: bool, write_fails: bool = False) -> None:
        stream = self.shell.stream
        assert stream is not None
        if stream.hard_stop is not None or stream.soft_stop:
            self.stream_aborts()
            return
        report = None
        if cut and self.machine.queue.has_queued():
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
            finish=FinishReason.TOOL_CALLS if report else FinishReason.STOP,
            why=StopWhy.QUEUED_MESSAGE if report else StopWhy.FINISHED,
            steps=1,
            remaining=remaining,
            progress=PROGRESS,
            queued_stop=report,
            parts=(TextPart(text="answer"),),
        )
        if write_fails:
            self.shell.unwritten.add(stream.id)
            self.shell.fail_next = True
        self.run(self.machine.handle(_in.FinalReady(ended)))
        self.outcome(ended)

    @precondition(lambda self: self.shell.stream is not None and self.shell.stream.started)
    @rule()
    def stream_aborts(self) -> None:
        stream = self.shell.stream
        assert stream is not None
        reason = stream.hard_stop or AbortReason.QUEUED_MESSAGE
        self.outcome(
            Aborted(
                stream=stream.id,
                reason=reason,
                metadata=self.meta(3),
                parts=(TextPart(text="partial"),),
            )
        )

    @precondition(lambda self: self.shell.stream is not None and self.shell.stream.started)
    @rule()
    def stream_fails(self) -> None:
        stream = self.shell.stream
        assert stream is not None
        self.outcome(
            Failed(
                stream=stream.id,
                type=ErrorType.MALFORMED_OUTPUT,
                kind=ErrorKind.RETRYABLE,
                message="overloaded",
                remaining=2,
                model="fallback-c",
                progress=PROGRESS,
                parts=(),
            )
        )

    # ------------------------------------------------------------ invariants

    @invariant()
    def consumed_only_by_a_stream_that_started_bounded_newest_kept(self) -> None:
        """ST-4, R64, R33."""
        consumed = self.machine.continuation.consumed
        assert len(consumed) <= CONSUMED_CUTS_BOUND
        assert consumed == tuple(self.consumed[-CONSUMED_CUTS_BOUND:])

    @invariant()
    def failed_attempts_within_the_cap(self) -> None:
        """R21."""
        assert self.machine.continuation.failed_attempts <= CAP

    @invariant()
    def durable_before_told(self) -> None:
        assert not self.shell.problems, self.shell.problems

    @invariant()
    def nothing_stranded(self) -> None:
        m = self.machine
        if (
            m.phase is Phase.IDLE
            and m.owes()
            and m.queue.is_empty
            and m.manual_preflight == 0
            and not m.continuation.resume_in_flight
        ):
            assert m.sweep_scheduled, "an owed turn sits idle with no sweep scheduled"

    @invariant()
    def no_idle_session_holds_an_entry(self) -> None:
        """AS-13, AS-2: whatever made the session idle, a drain is coming for its queue."""
        m = self.machine
        if m.phase is Phase.IDLE and not m.queue.is_empty and m.manual_preflight == 0:
            assert m.sweep_scheduled, "an idle session holds queued entries and nothing drains"

    @invariant()
    def one_resume_in_flight(self) -> None:
        assert len(self.shell.resumes) <= 1
        assert self.machine.continuation.resume_in_flight == bool(self.shell.resumes) or (
            self.shell.stream is not None and self.shell.stream.context.resume_of is not None
        )

    @invariant()
    def no_resume_of_an_ended_cut(self) -> None:
        for resume, aborted in self.shell.resumes:
            # an ended cut's resume may still be pending, but only aborted (it never launches)
            assert aborted or resume.marker.cut not in self.shell.ended


def test_st7_st4_r3_r21_r33_r60_ps6_the_real_turn_machine_under_generated_inputs() -> None:
    """ST-7, ST-4, R3, R21, R33, R60, PS-6: the machine's rules hold under any order of inputs."""
    run_state_machine_as_test(
        TurnMachineTest,
        settings=settings(max_examples=500, stateful_step_count=50, deadline=None),
    )
