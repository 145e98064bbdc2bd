"""AgentSession: one conversation's turns, a thin shell around the turn machine.

Theory of operation
-------------------
The session composes five parts: the turn machine (``_machine``: every rule, all the state,
no I/O), the one writer (``_writer``), the send pipeline and the stream launcher (``_pipeline``,
``_launcher``: I/O adapters that give the machine what they await as inputs) and the store
and stream manager the engine shares. A host call, a stream event or an outcome becomes an
input of the machine (``TurnMachine.handle``); the shell's interpreter performs the effects
the machine returns, in order (``_effects``): it tells events, commits each ``Commit`` with
the writer (telling its events only after ``COMMIT``) and gives the machine the result as its
next input. A host call made while the shell calls host code waits in the inbox (``_host``).
Everything that decides is synchronous and runs inside the call or event that triggers it;
everything that awaits (store writes, the model stream) runs in tasks the engine's task group
owns. Three kinds of work start turns:

* a direct ``send`` on an idle session (a manual send "in preflight" until it claims
  PREPARING, R3);
* the queue drain (AS-13): one head entry at a time, PREPARING claimed synchronously at dequeue;
* the stranded-turn sweep (ST-7), which claims PREPARING synchronously before any await (R7).

All three reach the same launcher, and every outcome comes back to the machine, which moves the
phase on, drains the queue and so, on every arrival at IDLE, schedules the sweep (AS-2). The
stream manager's events reach the session synchronously (``on_stream_event``) after the
engine's observers have seen them, so a stream-start consumes the owed continuation exactly
when the fact is recorded (ST-4).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar, assert_never

import anyio
import msgspec

from agent_session import _inputs as _in
from agent_session._compaction import summarise
from agent_session._delegation import ChildEvent
from agent_session._delivery import Delivery, DeliveryState
from agent_session._effects import (
    AbortPrepared,
    AbortResume,
    BackOff,
    CancelRemoved,
    Commit,
    Dispatch,
    Effect,
    Emit,
    Next,
    Reply,
    RunCompaction,
    ScheduleSweep,
    StartResume,
    StopStream,
    Successors,
    TellOwner,
    Work,
)
from agent_session._events import (
    EngineEvent,
    PhaseChanged,
    SessionBroken,
)
from agent_session._launcher import StreamLauncher
from agent_session._machine import TurnMachine
from agent_session._phases import BrokenSession, Phase
from agent_session._pipeline import SendPipeline
from agent_session._retry import RetryPolicy, retry_policy
from agent_session._rows import decode_body, to_messages
from agent_session._session_store import SessionStore
from agent_session._statistics import SessionStatistics, nothing_running
from agent_session._turn import Accepted, CanceledBeforeAcceptance, SendRefused, TurnInput
from agent_session._writer import WriteCutShort, Writer
from agent_session.ports import PreStreamFailure
from message_queue import (
    CancelToken,
    Correlation,
    DispatchMode,
    EntryCallbacks,
    EntryKind,
    MessageMetadata,
    MetadataType,
    NewMessage,
    Queued,
    Rejected,
    SendOptions,
    notify_all_canceled,
)
from persistence import (
    CorruptRecord,
    HistoryRow,
    LeasedStore,
    LeaseLost,
    RowKind,
    Store,
    StoredPartial,
    TurnkeeperError,
    UsageError,
)
from stream_manager import (
    AbortReason,
    AbortSignal,
    ModelUsage,
    Refused,
    StartCause,
    StepUsage,
    StreamAborted,
    StreamEvent,
    StreamManager,
    StreamOutcome,
    StreamStarted,
    ToolCallEnded,
    ToolCallStarted,
    Withdrawn,
    merge_usage,
)

if TYPE_CHECKING:
    from agent_session._admission import Admission, Ticket
    from agent_session._compaction import CompactionPolicy
    from agent_session._continuation import Continuation, Marker
    from agent_session._queue_keeper import QueueKeeper
    from agent_session._turn import PipelineResult, StreamContext
    from agent_session.ports import EngineConfig, PreStreamGate
    from message_queue import MessageQueue

log = logging.getLogger("turnkeeper.session")

Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]


class SessionDisposed(UsageError):
    """The session was disposed; it accepts nothing more."""


class AgentSession:
    """One conversation: its phase, queue, owed continuation and turns (``docs/session.md``)."""

    # Slots: thousands of idle sessions share one process; a per-instance dict costs ~1.6 KB.
    __slots__ = (
        "_admission",
        "_deliveries",
        "_emit",
        "_gate",
        "_idle",
        "_inbox",
        "_machine",
        "_manager",
        "_out",
        "_prepared_abort",
        "_resume_abort",
        "_spawn",
        "_store",
        "_tasks",
        "_tell_owner",
        "_writer",
        "_writing",
        "id",
    )

    def __init__(
        self,
        *,
        session_id: str,
        model: str,
        store: Store,
        manager: StreamManager,
        config: EngineConfig,
        gate: PreStreamGate,
        emit: Callable[[EngineEvent], None],
        spawn: Spawn,
        known_models: frozenset[str],
        owner: str | None = None,
        writer: Writer | None = None,
        next_seq: int = 1,
        next_stream: int = 1,
        tell_owner: Callable[[ChildEvent], Awaitable[None] | None] | None = None,
        goal: str | None = None,
        admission: Admission | None = None,
        queue: MessageQueue | None = None,
        keeper: QueueKeeper | None = None,
        policies: tuple[RetryPolicy, CompactionPolicy] | None = None,
    ) -> None:
        self.id = session_id
        #: The store port the engine shares (reads go through a ``SessionStore`` made for the
        #: work that reads: an idle session holds no view of its own).
        self._store = store
        #: The one writer of this session's durable decisions (the machine's ``Commit``s): the
        #: engine's, shared by its sessions (an idle session holds no writer of its own).
        self._writer = writer if writer is not None else Writer(store, owner)
        self._manager = manager
        self._gate = gate
        self._emit = emit
        #: The owner side of delegated turns (the engine's ``Delegations``): what a correlated
        #: stream of this session did, and forfeits of a delegated turn's continuation.
        self._tell_owner = tell_owner
        #: What a resume asks before it launches (goal, workspace, handle: ST-8, ST-9).
        self._admission = admission
        self._spawn = spawn
        # the engine's (one pair for every session), else this config's
        retry, compaction = policies or (retry_policy(config), config.compaction())
        self._machine = TurnMachine(
            session_id,
            model,
            known_models=known_models,
            resume_attempt_cap=config.resume_attempt_cap,
            next_seq=next_seq,
            next_stream=next_stream,
            goal=goal,
            queue=queue,
            keeper=keeper,
            retry=retry,
            compaction=compaction,
        )
        #: Queued user messages not yet durable, by the queue version that holds them.
        self._deliveries: list[tuple[int, Delivery]] | None = None
        self._prepared_abort: AbortSignal | None = None
        self._resume_abort: AbortSignal | None = None
        #: ``None`` while idle (made only when someone could wait: events are not free).
        self._idle: anyio.Event | None = None
        self._tasks = 0
        #: Host code the shell is calling right now (observers of an event it tells, callbacks,
        #: a stop it requests): a host call made meanwhile waits in the inbox (``_host``).
        self._out = 0
        #: Effects of host calls made while calling out, performed once the call-out returns.
        self._inbox: list[Effect] | None = None
        self._writing = 0  # commits in flight (``_write``)

    # ------------------------------------------------------------ what the machine knows

    @property
    def model(self) -> str:
        """The session's model."""
        return self._machine.model

    @property
    def goal(self) -> str | None:
        """The goal the session's turns are attributed to, if any."""
        return self._machine.goal

    @property
    def phase(self) -> Phase:
        """Where the session's turn is."""
        return self._machine.phase

    @property
    def queue(self) -> MessageQueue:
        """The session's message queue."""
        return self._machine.queue

    @property
    def continuation(self) -> Continuation:
        """The owed-continuation bookkeeping."""
        return self._machine.continuation

    @property
    def disposed(self) -> bool:
        """Whether the session was disposed (it can become so across any await)."""
        return self._machine.disposed

    @property
    def thinking_level(self) -> str | None:
        """The session's thinking level between turns."""
        return self._machine.thinking_level

    @property
    def scratchpad(self) -> str | None:
        """The live scratchpad text passed to every request (R26)."""
        return self._machine.scratchpad

    @property
    def busy(self) -> bool:
        """A turn is claimed or a manual send is in preflight: a ``send`` now queues (AS-12).

        Not the opposite of :attr:`settled`: a turn that just went IDLE is not busy, and not
        settled until its task and the sweep it scheduled are done.
        """
        return self._machine.busy

    @property
    def settled(self) -> bool:
        """Nothing running, scheduled or being written: what ``wait_idle`` waits for.

        The phase is IDLE (or DISPOSED, or BROKEN), no task of the session runs or is
        scheduled, the idle sweep is not scheduled and no commit is in flight
        (``statistics().settled``).
        """
        machine = self._machine
        return nothing_running(machine.phase, self._tasks, machine.sweep_scheduled, self._writing)

    def statistics(self) -> SessionStatistics:
        """One view of the session now: phase, owed cut, queue, tasks, writes (built on demand)."""
        return self._machine.statistics(tasks=self._tasks, writing=self._writing)

    def owes(self) -> bool:
        """Whether a continuation is owed right now."""
        return self._machine.owes()

    def describe(self) -> str:
        """One line of :meth:`statistics` for logs and tests: the phase, then what is set.

        For example ``<AgentSession s1 streaming owed=s1/2(3) queue=1 tools=1 tasks=1>``.
        """
        return self.statistics().line("AgentSession")

    # ------------------------------------------------------------ performing effects

    def _do(self, effects: list[Effect], *, hold_resume: bool = False) -> object:
        """Perform ``effects`` from a synchronous call: a write runs in a task of its own.

        A ``Next`` is handled in place (its effects run before the ones after it), in a loop
        rather than by recursion: a turn gives the machine a few dozen inputs. Returns the
        last ``Reply`` (the machine's answer to the call). With ``hold_resume``, a resume that
        is the last effect is returned instead of started in a task of its own: the caller
        (the sweep's task) runs it. Effects are final Structs, so ``type() is`` picks the
        kind (cheaper than ``isinstance`` on this hot path).

        What host calls asked for while an effect called out (the inbox, ``_host``) is
        performed after that effect, before the next one.
        """
        machine = self._machine
        queue, reply = effects, None
        while queue:  # one lap per decision fed in (a ``Next``) or inbox taken
            rest, queue = queue, []
            last = len(rest) - 1
            for index, effect in enumerate(rest):
                if self._inbox is not None:  # asked for during the last call-out: first
                    queue, self._inbox = [*self._inbox, *rest[index:]], None
                    break
                kind = type(effect)
                if kind is Emit:  # the most frequent kinds first
                    self._tell(effect.event)  # type: ignore[union-attr]
                elif kind is Next:
                    if machine.broken is not None:
                        continue  # the rest of a broken decision is void
                    if type(effect.input) is _in.FlushRecords:  # type: ignore[union-attr]
                        self._flush_later()
                        continue
                    fed = machine.handle(effect.input)  # type: ignore[union-attr]
                    if index == last or machine.broken is not None:
                        queue = fed
                    else:
                        queue = [*fed, *rest[index + 1 :]]
                    break
                elif kind is Reply:
                    reply = effect.value  # type: ignore[union-attr]
                elif kind is Commit:  # nothing to await here: the write and what follows, in a task
                    self._run(self._performer([effect]))
                elif hold_resume and kind is StartResume and index == last:
                    return effect
                else:
                    self._act(effect)
            else:  # asked for during the last effect's call-out
                queue, self._inbox = self._inbox or [], None
        return reply

    def _flush_later(self) -> None:
        """A record flush asked for synchronously: decided and written in a task, if due."""
        if self._machine.pending:
            self._run(self._performer([Next(_in.FlushRecords())]))

    async def _perform(self, effects: list[Effect], then: Successors | None = None) -> object:
        """Perform ``effects`` in order, awaiting each write where it stands (``Next``: _do).

        ``then`` is the running task's successors (``Perform``), given only where the effects
        are the last thing the task does. Returns the last ``Reply``. What host calls asked
        for while an effect called out (the inbox) is performed after that effect, as the
        synchronous calls they are (``_do``), before the next one.
        """
        machine = self._machine
        queue, reply = effects, None
        while queue:  # one lap per decision fed in (a ``Next``, a write's result)
            rest, queue = queue, []
            last = len(rest) - 1
            for index, effect in enumerate(rest):
                if self._inbox is not None:
                    self._inbox_due()
                kind = type(effect)
                if kind is Emit:
                    self._tell(effect.event)  # type: ignore[union-attr]
                    continue
                if kind is Reply:
                    reply = effect.value  # type: ignore[union-attr]
                    continue
                if kind is Next:
                    if machine.broken is not None:
                        continue  # the rest of a broken decision is void
                    fed = machine.handle(effect.input)  # type: ignore[union-attr]
                elif kind is Commit:
                    fed = await self._commit(effect)  # type: ignore[arg-type]
                elif kind is TellOwner:  # the owner's write is awaited where it stands
                    await self._owner_writes(effect)  # type: ignore[arg-type]
                    continue
                else:
                    self._act(effect, then)
                    continue
                if index == last or machine.broken is not None:  # what it fed in goes first
                    queue = fed
                else:
                    queue = [*fed, *rest[index + 1 :]]
                break
        if self._inbox is not None:  # asked for during the last effect's call-out
            self._inbox_due()
        return reply

    def _owner_hears(self, effect: TellOwner) -> Awaitable[None] | None:
        """Tell the owner (a call-out: it may claim meanwhile); what it must write, if any."""
        tell = self._tell_owner
        if tell is None:
            return None
        return self._calling_out(lambda: tell(effect.child))

    async def _owner_writes(self, effect: TellOwner) -> None:
        """The owner hears ``effect``; what its claim decided runs, then its write is awaited.

        Awaited in the session's flow (before the drain that follows a stream's end), so the
        owner's ``claim`` and ``settled`` come at the same point whatever the store.
        """
        write = self._owner_hears(effect)
        if self._inbox is not None:
            self._inbox_due()
        if write is not None:
            await write

    @staticmethod
    def _notify_canceled(removed: list[EntryCallbacks], reason: str) -> None:
        for entry_id, error in notify_all_canceled(removed, reason):
            log.warning("cancellation callback of %s failed: %r", entry_id, error)

    def _performer(self, effects: list[Effect]) -> Work:
        """``effects`` as a task's work (what a synchronous call cannot await)."""

        async def perform(then: Successors) -> None:
            await self._perform(effects, then)

        return perform

    async def _commit(self, effect: Commit) -> list[Effect]:
        """The one writer: commit the boundary, then tell, then give the machine the result.

        Nothing is told before ``COMMIT`` returned; a failed write tells nothing and gives the
        machine the effect's ``failed`` input with the error (a result like any other).
        """
        machine = self._machine
        self._writing += 1  # in flight: the session is not settled
        try:
            try:
                await self._writer.write(self.id, effect.boundary, exact=effect.exact)
            finally:
                self._writing -= 1
                self._check_idle()
        except anyio.get_cancelled_exc_class():
            # Cut short (the cleanup bound, or the engine closing): whether it landed is
            # unknown, so it is decided as failed (nothing of it is told), then cancelled on.
            log.warning("session %s: %s cut short before it returned", self.id, effect.what)
            cut_short = WriteCutShort(f"the {effect.what} write was cut short")
            if effect.boundary.queue is not None and self._deliveries is not None:
                self._delivered(effect.boundary.queue.version, cut_short)  # nobody waits forever
            if effect.failed is not None and machine.broken is None:
                self._do(machine.handle(msgspec.structs.replace(effect.failed, error=cut_short)))
            raise
        except (TurnkeeperError, OSError) as error:
            return self._not_written(effect, error)
        if effect.boundary.queue is not None and self._deliveries is not None:
            self._delivered(effect.boundary.queue.version, None)
        for event in effect.tell:
            self._tell(event)
        if effect.then is None or machine.broken is not None:
            return []
        return machine.handle(effect.then)

    def _not_written(self, effect: Commit, error: TurnkeeperError | OSError) -> list[Effect]:
        """A write the store refused: nothing of it is told; the machine hears why.

        A lost lease (LS-3) stops the session here (a peer owns it now); any other failure is
        the effect's ``failed`` input, a result like any other.
        """
        machine = self._machine
        if isinstance(error, LeaseLost):
            log.warning("session %s: %s refused, stopping here: %s", self.id, effect.what, error)
        else:
            log.warning("session %s: %s not written: %s", self.id, effect.what, error)
        if effect.boundary.queue is not None and self._deliveries is not None:
            self._delivered(effect.boundary.queue.version, error)
        if machine.broken is not None:
            return []
        if isinstance(error, LeaseLost):
            return machine.handle(_in.LeaseGone(error=error))
        failed = effect.failed
        if failed is None:
            return []
        return machine.handle(msgspec.structs.replace(failed, error=error))

    def unsettled_deliveries(self, why: str) -> None:
        """What is still pending is not durable: ``why`` (the engine closed before the write)."""
        pending, self._deliveries = self._deliveries, None
        for _, delivery in pending or ():
            delivery.settle(DeliveryState.NOT_DURABLE, why)

    def _delivered(self, version: int, error: Exception | None) -> None:
        """The queue's ``version`` is durable (``error``: it failed): the messages it holds.

        Durable, every message queued at that version or before is safe (a later snapshot
        holds what is still queued; what left it was accepted or removed). Failed, the
        messages queued at exactly that version are queued in memory only.
        """
        pending = self._deliveries
        if pending is None:
            return
        kept: list[tuple[int, Delivery]] = []
        for at, delivery in pending:
            if error is None and at <= version:
                delivery.settle(DeliveryState.QUEUED)
            elif error is not None and at == version:
                delivery.settle(DeliveryState.NOT_DURABLE, f"the queue write failed: {error}")
            else:
                kept.append((at, delivery))
        self._deliveries = kept or None

    def _tell(self, event: EngineEvent) -> None:
        """Emit ``event``; a phase move also keeps ``wait_idle`` true to the phase.

        The observers are host code: what they ask of the session meanwhile waits in the
        inbox and is performed once every observer has seen ``event`` (``_host``).
        """
        if type(event) is PhaseChanged:
            settles = (
                event.to is Phase.IDLE or event.to is Phase.DISPOSED or event.to is Phase.BROKEN
            )
        elif type(event) is SessionBroken:  # told once, by the machine that broke
            settles = False
            log.error(
                "session %s broke in phase %s on %s: %s; it takes no input but disposal "
                "(Engine.reopen_session opens it again from the store)",
                self.id,
                event.phase,
                event.input,
                event.error,
            )
        else:  # most events: told, nothing more
            self._out += 1
            try:
                self._emit(event)
            finally:
                self._out -= 1
            return
        self._out += 1
        try:
            self._emit(event)
        finally:
            self._out -= 1
        if settles:
            self._check_idle()

    def _host(self, effects: list[Effect]) -> object:
        """Perform a host call's effects; return its answer (the decision's top-level ``Reply``).

        The machine decides at once (its state is settled between effects, and the call's
        answer comes from the decision). A call made while the shell is calling host code (an
        observer inside an event it tells, a cancellation callback, a stop it requests) does
        not re-enter the interpreter there: its effects wait in the inbox and are performed
        as soon as that call-out returns, before the next effect (``docs/architecture.md``).
        """
        if not effects:
            return None
        reply = None
        for effect in effects:
            if type(effect) is Reply:
                reply = effect.value
        if self._out:  # the interpreter that called out performs them next
            if self._inbox is None:
                self._inbox = []
            self._inbox += effects
            return reply
        if self._inbox is not None:  # asked for earlier: first
            effects, self._inbox = [*self._inbox, *effects], None
        self._do(effects)
        return reply

    def _inbox_due(self) -> None:
        """Perform what host calls asked for during the last call-out, in order."""
        effects, self._inbox = self._inbox, None
        if effects is not None:
            self._do(effects)

    def _calling_out(self, call: Callable[[], _T]) -> _T:
        """Run host-facing ``call`` (callbacks, a stop request) with host calls deferred."""
        self._out += 1
        try:
            return call()
        finally:
            self._out -= 1

    def _fire(self, signal: AbortSignal | None, reason: AbortReason) -> None:
        if signal is not None:
            self._calling_out(lambda: signal.fire(reason))

    def _act(self, effect: Effect, then: Successors | None = None) -> None:
        """Perform an effect that neither tells, writes nor feeds: it acts on something."""
        match effect:
            case ScheduleSweep():
                self._run(self._sweep, then)
            case BackOff(delay_s=delay, generation=generation):
                self._run(self._backing_off(delay, generation))
            case StopStream(reason=why, soft=soft):
                stop = self._manager.request_stop_nowait
                self._calling_out(lambda: stop(self.id, soft=soft, reason=why))
            case AbortPrepared(reason=cause):
                self._fire(self._prepared_abort, cause)
            case AbortResume(reason=why):  # its continuation ended
                self._fire(self._resume_abort, why)
            case Dispatch(turn, token):
                self._dispatch(turn, token, then)
            case StartResume() | RunCompaction():  # a resume, or a compaction request
                self._run(self._background(effect), then)
            case CancelRemoved(removed, reason):
                self._calling_out(lambda: self._notify_canceled(list(removed), reason))
            case TellOwner():  # from a host call: the owner's write runs in a task
                write = self._owner_hears(effect)
                if write is not None:
                    self._run(_awaiting(write), then)
            case Emit() | Next() | Reply() | Commit():
                raise AssertionError(f"{effect!r} is the interpreter's")  # pragma: no cover
            case _:
                assert_never(effect)

    # ------------------------------------------------------------ collaborators

    def _history(self) -> SessionStore:
        """A read view of this session's history (made per use: an idle session holds none)."""
        return SessionStore(self._store, self.id)

    def _pipeline(self) -> SendPipeline:
        """The pipeline for one send (made per send: an idle session holds none)."""
        return SendPipeline(
            self._machine,
            store=self._history(),
            gate=self._gate,
            emit=self._emit,
            perform=self._perform,
            launch=self._launch_turn,
            admit=self._admit_follow_up,
            pause_goal=self._pause_goal,
            outcome=self._outcome_input,
        )

    def _launcher(self, ticket: Ticket | None = None) -> StreamLauncher:
        """The launcher for one stream (made per launch: an idle session holds none)."""
        return StreamLauncher(
            self._machine,
            store=self._history(),
            manager=self._manager,
            perform=self._perform,
            ticket=ticket,
        )

    # ------------------------------------------------------------ tasks and idleness

    def _check_idle(self) -> None:
        """Release ``wait_idle``'s waiters once the session is :attr:`settled`."""
        event = self._idle
        if event is None or self._tasks or self._writing:  # nobody waits, or still running
            return
        machine = self._machine
        if nothing_running(machine.phase, 0, machine.sweep_scheduled, 0):
            self._idle = None
            event.set()

    def hold(self) -> Callable[[], None]:
        """Count the session unsettled (``wait_idle`` waits) until the returned release is called.

        Startup recovery holds a recovered session from its plan until its resume has an
        outcome. Releasing twice releases once.
        """
        self._tasks += 1
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._tasks -= 1
                self._check_idle()

        return release

    def _run(self, work: Work, then: Successors | None = None) -> None:
        """Start ``work``, counted for ``wait_idle``.

        In a task of its own in the engine's task group; given the running task's successors
        ``then``, after that task's work, in the same task (``_task``).
        """
        self._tasks += 1
        if then is not None:
            then.append(work)
        else:
            self._spawn(partial(self._task, work))

    async def _task(self, work: Work) -> None:
        """Run ``work``, then the first work it left to run after it, and so on, in this task.

        A task whose last effects start another (a turn's outcome dispatching the next queued
        send, a withdrawn send scheduling the sweep) goes on as that one: it starts when a task
        of its own would have (once this work is done), without a new task's cost (two fewer
        on the resume path: ``bench/README.md``, table 7). Any further successors get tasks of
        their own. A loop, not recursion: a queue of a thousand sends is a thousand laps.
        """
        while True:
            then: Successors = []
            try:
                await work(then)
            except BrokenSession as error:  # told once already, where it broke
                log.debug("session %s: work stopped: %s", self.id, error)
            except Exception:  # a bug here must not take the engine's other sessions down
                log.exception("session %s: a task failed: %s", self.id, self.describe())
            except BaseException:  # cancelled (the engine is closing): the successors never run
                self._tasks -= len(then)
                raise
            finally:
                self._tasks -= 1
                self._check_idle()
            if not then:
                return
            work = then[0]
            for other in then[1:]:
                self._spawn(partial(self._task, other))
            # What is ready already (a host's task started from an observer) goes first, as it
            # would before a task of its own; a checkpoint costs a fraction of a new task.
            try:
                await anyio.lowlevel.checkpoint()
            except BaseException:  # cancelled: the successor never runs
                self._tasks -= 1
                self._check_idle()
                raise

    async def wait_idle(self) -> None:
        """Return once the session is :attr:`settled` (nothing running, scheduled or written)."""
        while True:
            if not self.settled:
                event = self._idle
                if event is None:  # made only when someone could wait (``_check_idle`` sets it)
                    event = self._idle = anyio.Event()
                await event.wait()
            await anyio.lowlevel.checkpoint()
            if self.settled:
                return

    def _alive(self) -> None:
        machine = self._machine
        if machine.disposed:
            raise SessionDisposed(f"session {self.id!r} is disposed")
        if machine.broken is not None:
            raise BrokenSession(self.id, machine.broken)

    # ------------------------------------------------------------ stream events

    def on_stream_event(
        self, event: StreamEvent, *, tell: Callable[[StreamEvent], None] | None = None
    ) -> None:
        """React to the stream manager's events for this session (AS-19 to AS-21, AS-27).

        ``tell``: the engine's observers, told ``event`` first; a session call they make waits
        in the inbox and is performed once they all saw it, before this session's reaction.
        """
        if tell is not None:  # every stream event passes here: no closure made for it
            self._out += 1
            try:
                tell(event)
            finally:
                self._out -= 1
        react = _REACTIONS.get(type(event))  # most stream events ask nothing of the session
        if react is not None and self._machine.broken is None:  # broken: the stream is stopping
            react(self, event)
        if self._inbox is not None and not self._out:
            self._inbox_due()

    def _stream_began(self, event: StreamStarted) -> None:
        self._host(self._machine.handle(_in.StreamBegan(event.stream, event.cause)))

    def _tool_started(self, event: ToolCallStarted) -> None:
        self._machine.handle(_in.ToolStarted(event.call))

    def _tool_ended(self, event: ToolCallEnded) -> None:
        self._host(self._machine.handle(_in.ToolEnded(event.call, event.provider)))

    def _step_usage(self, event: StepUsage) -> None:
        used = _in.UsageReported(event.stream, event.model, event.input_tokens)
        self._host(self._machine.handle(used))  # AS-36: a crossing stops the stream

    def _stream_aborted(self, event: StreamAborted) -> None:
        if not event.stream:  # a synthetic abort: no stream of this session ran
            self._host(self._machine.handle(_in.SyntheticAbort(event.reason)))

    # ------------------------------------------------------------ turns

    def _dispatch(
        self, turn: TurnInput, token: CancelToken | None, then: Successors | None = None
    ) -> None:
        """AS-13: the dequeued entry goes through the pipeline; the session goes on after."""

        async def dispatch(after: Successors) -> None:
            try:
                result = await self._pipeline().run(turn, after)
            finally:
                self._machine.handle(_in.Dispatched(token))  # accepted, cancelled or failed
            if isinstance(result, SendRefused) and turn.callbacks is not None:
                callback = turn.callbacks.on_accepted_pre_stream_failure
                if callback is not None:
                    try:
                        callback(result.failure)
                    except Exception as error:  # the host's bug must not strand the session
                        log.warning(
                            "on_accepted_pre_stream_failure of %s failed: %r", turn.entry_id, error
                        )
            if not isinstance(result, Accepted):
                await self._perform(self._machine.handle(_in.SendWentNowhere(turn)), after)

        self._run(dispatch, then)

    async def _launch_turn(self, context: StreamContext, ticket: Ticket | None) -> StreamOutcome:
        """AS-10, AS-22: an accepted turn's stream under a new abort signal; its outcome."""
        self._prepared_abort = abort = AbortSignal()
        return await self._launcher(ticket).launch(context, abort)

    async def _sweep(self, then: Successors) -> None:
        """AS-2: the scheduled sweep, in a task; a resume it starts runs on in this task.

        Record changes whose write failed are written again first (told once durable).
        """
        machine = self._machine
        if machine.pending:
            await self._perform(machine.handle(_in.FlushRecords()))
        start = self._do(machine.handle(_in.SweepDue()), hold_resume=True)
        if isinstance(start, StartResume):
            await self._armed(start)(then)

    def _backing_off(self, delay_s: float, generation: int) -> Work:
        """PS-3, AS-32: wait ``delay_s`` on the engine's clock, then let the sweep retry."""

        async def wait(then: Successors) -> None:
            clock = self._manager.clock
            await clock.sleep_until(clock.now() + delay_s)
            await self._perform(self._machine.handle(_in.BackOffOver(generation)), then)

        return wait

    def _background(self, effect: StartResume | RunCompaction) -> Work:
        """The work a resume (armed now) or a compaction request runs in a task."""
        if isinstance(effect, StartResume):
            return self._armed(effect)
        return self._compacting(effect)

    def _compacting(self, effect: RunCompaction) -> Work:
        """AS-36: the compaction request: the history and the prompt, one call, its text."""

        async def compact(then: Successors) -> None:
            machine = self._machine
            try:
                rows, _ = await self._history().history()
                history = (*to_messages(rows), *effect.tail)
                purpose = f"{effect.stream}:compaction"
                complete = self._manager.complete_text
                text = await summarise(complete, effect.model, history, effect.prompt, purpose)
            except (TurnkeeperError, OSError) as error:  # ModelError and CorruptRecord too
                log.warning(
                    "session %s: compaction of %s failed: %s", self.id, effect.stream, error
                )
                await self._perform(machine.handle(_in.CompactionFailed(str(error))), then)
                return
            await self._perform(machine.handle(_in.Summarized(text)), then)

        return compact

    def _armed(self, start: StartResume) -> Work:
        """The resume ``start`` asks for, under a new abort signal (armed now, run later)."""
        abort = self._resume_abort = AbortSignal()
        marker, attempt = start.marker, start.attempt
        return lambda then: self._resume(marker, attempt, abort, then)

    async def sweep_here(self) -> bool:
        """Run the idle sweep in the caller's task; return whether it started a resume.

        A resume it starts runs on in this task (counted for ``wait_idle`` like a task of the
        session's own) until the resumed turn and the work it leaves are done; its outcome is
        reported as its ``resume`` event meanwhile. Startup recovery sweeps this way.
        """
        start = self._do(self._machine.handle(_in.Sweep()), hold_resume=True)
        if not isinstance(start, StartResume):
            return False
        self._tasks += 1
        await self._task(self._armed(start))
        return True

    def adopt_owed(self, marker: Marker, row_id: str) -> None:
        """PS-6: owe ``marker``, rebuilt at startup from the durable record on ``row_id``.

        The record on that row then follows the marker as if this process had cut the turn
        (consumed when a stream starts, voided when the continuation is withdrawn or
        forfeited). Nothing starts yet: :meth:`sweep_here` (or the next idle transition) does.
        """
        self._machine.handle(_in.AdoptOwed(marker, row_id))

    @property
    def anchor(self) -> str | None:
        """The user row the session's current (or last) turn answers (PS-8's marker names it)."""
        return self._machine.anchor

    def knows_abandon(self, *, stored: bool, anchor: str | None) -> None:
        """PS-8: what the store holds of the abandon marker, and the turn's user row."""
        self._machine.abandon_stored = stored
        self._machine.anchor = anchor

    def knows_partials(self, partials: tuple[StoredPartial, ...]) -> None:
        """PS-2: the partials the store holds (B4): the next row this session appends takes them."""
        self._machine.stored_partials = partials

    async def usage(self) -> tuple[ModelUsage, ...]:
        """What this session's model steps used, by the model that ran them (SM-14, R59).

        Every assistant and partial row records its stream's usage (a fallback's under the
        fallback); what no row records (an abandoned or empty partial, a failure that left
        no parts) is in the session's side ledger, kept in memory since the session was made.

        Raises:
            CorruptRecord: a row of the history is unreadable (``turnkeeper inspect`` names it).
        """
        rows = await self._history().rows()
        total = self._machine.usage_ledger
        for row in rows:
            if row.kind in (RowKind.ASSISTANT, RowKind.PARTIAL):
                total = merge_usage(total, decode_body(row).usage)
        return total

    def knows_auto_retry(self, *, on: bool) -> None:
        """AS-32: the session's persisted auto-retry preference, as the store holds it."""
        self._machine.handle(_in.KnowsAutoRetry(on))

    async def set_auto_retry(self, on: bool) -> None:
        """AS-32: turn auto-retry on or off for this session; durable before it returns.

        Turning it off abandons a retry now waiting (``retry-abandoned``); the next message the
        user sends turns it on again. The preference holds in memory even when its write
        fails (the error is raised: a restart would read the stored one).

        Raises:
            WriteFailed: the preference could not be written.
        """
        self._alive()
        failed = await self._perform(self._machine.handle(_in.SetAutoRetry(on)))
        if isinstance(failed, Exception):
            raise failed

    def adopt_follow_up(self, marker: Marker, row: HistoryRow) -> None:
        """PS-7: owe the follow-up pending on summary ``row`` (the sweep launches it)."""
        self._machine.handle(_in.AdoptFollowUp(marker, row))

    def adopt_retry(self, marker: Marker) -> None:
        """PS-4: owe the startup retry ``marker`` (no durable record); the sweep resumes it."""
        self._machine.handle(_in.AdoptRetry(marker))

    async def _resume(
        self, marker: Marker, attempt: int, abort: AbortSignal, then: Successors
    ) -> None:
        """ST-8 to ST-10: gates, then the history path under the marker's budget and chain."""
        log.info(
            "Retrying failed stream: cut=%s model=%s budget=%d correlation=%s attempt=%d"
            if marker.cause is StartCause.RETRY
            else "Resuming turn stranded by a withdrawn queued message: cut=%s model=%s "
            "budget=%d correlation=%s attempt=%d",
            marker.cut,
            marker.model,
            marker.step_budget,
            marker.correlation,
            attempt,
        )  # ST-14, R45
        machine = self._machine
        context = machine.resume_context(marker, attempt)
        try:
            await self._gate.check(self.id, "resume")
            admitted = self._admit(marker)  # ST-8: goal, workspace, handle (R8, R41)
            if abort.reason is not None:
                outcome: StreamOutcome = Withdrawn(abort.reason)
            elif isinstance(admitted, str):
                outcome = Refused(admitted)
            else:  # the probe rides through the launch (ST-9, R17)
                outcome = await self._launcher(admitted).launch(context, abort)
        except CorruptRecord as error:  # R61: damage a retry cannot mend; never a forfeit
            log.error(
                "resume of %s given up: the history it needs is unreadable (the record stays "
                "owed for a person to repair; `turnkeeper inspect` names the row): %s",
                marker.cut,
                error,
            )
            await self._perform(machine.handle(_in.ResumeUnreadable(marker, attempt)), then)
            return
        except (PreStreamFailure, TurnkeeperError, OSError) as error:
            log.info("resume of %s failed before its stream started: %s", marker.cut, error)
            await self._perform(machine.handle(_in.ResumeFailed(marker, attempt)), then)
            return
        if isinstance(outcome, Refused | Withdrawn):
            not_started = machine.handle(_in.NotStarted(outcome, context))
            await self._perform([*not_started, Next(_in.FlushRecords())], then)
        else:
            await self._perform(machine.handle(self._outcome_input(outcome, context)), then)

    def _outcome_input(self, outcome: StreamOutcome, context: StreamContext) -> _in.Input:
        """The machine's input for a launched turn's outcome.

        A stream that ended because the store fenced one of its writes (LS-3: a receipt, a
        partial, the final row) is no outcome to act on: a peer owns the session now, so it
        stops here (``LeaseGone``), and no retry or failure record is decided for it.
        """
        store = self._store
        if isinstance(store, LeasedStore) and self.id in store.leases.lost:
            return _in.LeaseGone(error=LeaseLost(self.id, held=None, epoch=None, holder=None))
        return _in.Outcome(outcome, context)

    def _admit(self, marker: Marker) -> Ticket | str | None:
        """ST-8's admission of a resume of ``marker``: its ticket, or why it is refused.

        Raises:
            AdmissionUnreadable: a port could not answer (a failure before start).
        """
        if self._admission is None:
            return None
        return self._admission.admit(self.id, marker.goal_id, marker.correlation)

    def _pause_goal(self, why: str) -> None:
        """AS-4: the session's goal is paused (a user's message to it was refused)."""
        goal = self._machine.goal
        if self._admission is not None and goal is not None:
            self._admission.pause_goal(goal, why)

    def _admit_follow_up(self, turn: TurnInput) -> Ticket | str | None:
        """R41 for a turn of a delegated turn's correlation (its prompt, a wake continuing it).

        A turn its owner (or a user, a hard stop, a forfeit) stopped refuses it (TD-8); goal
        and workspace are asked by resumes only. ``None`` for any other turn.

        Raises:
            AdmissionUnreadable: a port could not answer.
        """
        correlation = turn.correlation
        if self._admission is None or correlation is None:
            return None
        return self._admission.admit_follow_up(self.id, correlation)

    # ------------------------------------------------------------ the queue

    def _queue(self, message: NewMessage, *, key: str | None = None) -> Queued | Rejected:
        outcome = self._host(self._machine.handle(_in.Enqueue(message, key)))
        assert isinstance(outcome, Queued | Rejected)
        token = message.cancel_token
        if isinstance(outcome, Queued) and token is not None:
            fired = _in.TokenFired(outcome.message_id)

            def withdrawn(_: str) -> None:
                self._host(self._machine.handle(fired))

            token.add_listener(withdrawn)
        return outcome

    def enqueue(
        self,
        text: str,
        *,
        kind: EntryKind | str,
        entry: str | None = None,
        mode: DispatchMode | str = DispatchMode.TOOL_END,
        dedupe_key: str | None = None,
        correlation: Correlation | None = None,
        sealed: bool = False,
        cancel_token: CancelToken | None = None,
    ) -> CancelToken:
        """Queue an agent-initiated entry (a wake, report or system message) with a cancel token.

        An idle session drains it at once. Returns the entry's cancel token: firing it
        withdraws the entry (``withdraw`` does the same by name).

        Raises:
            SessionDisposed: the session is disposed.
            InvalidEntry: an unknown kind or mode, a duplicate entry id.
            UsageError: the queue refused the add (blank text, a held dedupe key).
        """
        self._alive()
        token = cancel_token or CancelToken()
        metadata = None
        if correlation is not None:
            metadata = MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=correlation)
        message = NewMessage(
            text=text,
            kind=kind,
            mode=mode,
            id=entry,
            metadata=metadata,
            sealed=sealed,
            cancel_token=token,
            workspace_turn_continuation=correlation is not None,
        )
        self.enqueue_message(message, dedupe_key=dedupe_key)
        return token

    def enqueue_message(self, message: NewMessage, *, dedupe_key: str | None = None) -> Queued:
        """Queue ``message`` as given: what ``enqueue`` does, for a host that needs more.

        ``message`` may carry what ``enqueue`` does not: send options, a cancel state, the
        ``on_accepted``, ``on_accepted_pre_stream_failure`` and ``on_canceled`` callbacks, or no
        cancel token at all (then it may join the tail entry, MQ-2). As with ``enqueue``: an
        ``EntryQueued`` event, an ``EntryWithdrawn`` event when its cancel token fires, and an
        idle session drains it at once.

        Returns:
            The accepted add (its message and entry ids, the entry it joined).

        Raises:
            SessionDisposed: the session is disposed.
            InvalidEntry: an unknown kind or mode, a duplicate entry id.
            UsageError: the queue refused the add (blank text, a held dedupe key).
        """
        self._alive()
        outcome = self._queue(message, key=dedupe_key)
        if isinstance(outcome, Rejected):
            raise UsageError(f"session {self.id}: {outcome.detail}")
        self._host(self._machine.handle(_in.Queued()))
        return outcome

    def withdraw(self, entry: str, reason: str = "withdrawn") -> bool:
        """Fire the cancel token of ``entry``, queued or dequeued and not yet accepted.

        Queued, readers look past it from now on (MQ-7). Dequeued, the send pipeline sees the
        signal at its next check and cancels the entry before acceptance (AS-3).

        Returns:
            ``True`` when this call withdrew it, ``False`` when it was already withdrawn.

        Raises:
            UnknownEntry: no queued or dispatching entry has that id.
            InvalidEntry: the entry has no cancel token.
        """
        return self._host(self._machine.handle(_in.Withdraw(entry, reason))) is True

    def adopt_queue(self, queue: MessageQueue, keeper: QueueKeeper) -> None:
        """Take the queue a restart rebuilt from the store (before anything was queued here)."""
        machine = self._machine
        if len(machine.queue) or machine.keeper.enqueues:
            raise UsageError(f"session {self.id}: its queue is in use; nothing was adopted")
        machine.queue, machine.keeper = queue, keeper

    async def take_up_queue(self, dropped: tuple[str, ...]) -> None:
        """The rebuilt queue goes on: ``dropped`` are told gone (``restart``), then it drains."""
        await self._perform(self._machine.handle(_in.TakeUpQueue(dropped)))

    def queued_handles(self) -> set[str]:
        """The handles of the delegated turns whose live entries are queued here."""
        return {
            e.metadata.correlation.handle_id
            for e in self._machine.queue
            if not e.withdrawn and e.metadata is not None and e.metadata.correlation is not None
        }

    def listen_for_owner(self) -> None:
        """A delegated turn runs here: its owner hears of uncorrelated stream ends too (TD-4)."""
        self._machine.owner_listens = True

    def running_handle(self) -> str | None:
        """The handle of the delegated turn whose stream runs here now, if one does."""
        return self._machine.running_handle()

    def owed_handle(self) -> str | None:
        """The handle of the delegated turn this session owes a continuation, if it does."""
        marker = self._machine.continuation.marker
        if marker is None or marker.correlation is None:
            return None
        return marker.correlation.handle_id

    def queued_or_dispatching(self, correlation: Correlation) -> bool:
        """ST-16: is a live entry of ``correlation`` queued or dispatching (withdrawn: no)?"""
        return self._machine.queued_or_dispatching(correlation)

    def unrelated_live(self, correlation: Correlation) -> bool:
        """TD-9: is a live entry of another turn (or of none) queued or dispatching here?"""
        return self._machine.unrelated_live(correlation)

    def claim(self, correlation: Correlation, stream: str) -> bool:
        """ST-15: the owner's claim: will anything continue the turn that ``stream`` cut?

        Evaluated at once, in ST-15's order (consumed cuts, the engaged cutter, the first live
        queued entry, the owed marker, a running stream of the turn). ``False`` is binding:
        the owed marker for exactly that cut is withdrawn and never resumes.
        """
        return self._host(self._machine.handle(_in.Claim(correlation, stream))) is True

    def clear_queue(self, reason: str = "cleared", *, hard_stop: bool = False) -> None:
        """AS-16: clear the queue; a hard-stop clear forfeits the owed continuation first (R23).

        A plain (user) clear keeps the continuation and a pending soft stop (R53). Removed
        entries hear of it after any forfeit (R32); then the sweep runs.
        """
        self._alive()
        self._host(self._machine.handle(_in.Clear(reason, hard_stop)))

    def remove_dedupe(self, prefix: str, reason: str = "removed") -> int:
        """AS-16: remove the queued messages whose dedupe keys start with ``prefix``."""
        self._alive()
        removed = self._host(self._machine.handle(_in.RemoveDedupe(prefix, reason)))
        assert isinstance(removed, int)
        return removed

    def drop_only_dedupe_key(self, key: str, reason: str = "removed") -> bool:
        """AS-16: drop the queue's only entry when its only message holds ``key``.

        Whether it went; anything else queued (or batched with it) keeps it. The dropped
        entry hears of it as for any removal, then the sweep runs.
        """
        self._alive()
        dropped = self._host(self._machine.handle(_in.DropOnlyDedupeKey(key, reason)))
        assert isinstance(dropped, bool)
        return dropped

    def remove_workspace_turn(self, handle: str, reason: str = "removed") -> int:
        """TD-8: remove the entries queued for the delegated turn ``handle``; how many left.

        Only entries correlated to that handle go (a correlated entry is sealed: it holds that
        turn's messages alone); their cancellations run as for any removal (R32), then the
        sweep.
        """
        self._alive()
        removed = self._host(self._machine.handle(_in.RemoveWorkspaceTurn(handle, reason)))
        assert isinstance(removed, int)
        return removed

    def restore_queue(self) -> str:
        """AS-17: give user-authored text back for the composer and cancel the rest.

        Returns:
            The restored text (empty when nothing user-authored was queued).
        """
        self._alive()
        text = self._host(self._machine.handle(_in.Restore()))
        assert isinstance(text, str)
        return text

    # ------------------------------------------------------------ sending

    def send(
        self,
        text: str,
        *,
        entry: str | None = None,
        mode: DispatchMode | str = DispatchMode.TOOL_END,
        options: SendOptions | None = None,
        correlation: Correlation | None = None,
    ) -> Delivery:
        """A user message: queued while the session is busy (AS-12), else sent now.

        Returns its :class:`~agent_session.Delivery` at once; ``await`` it to know the
        message is safe (``delivery.safe``): committed to the durable queue, or its user row
        committed to history. It runs whether or not anyone awaits it.

        ``correlation``: the message is a delegated turn's prompt (``Engine.delegate``); its
        streams carry the turn's handle, and its owner hears how they end.

        Raises:
            SessionDisposed: the session is disposed.
            UsageError: the queue refused the message (blank text, a duplicate entry id).
        """
        self._alive()
        machine = self._machine
        if machine.busy:
            metadata = None
            if correlation is not None:
                metadata = MessageMetadata(
                    type=MetadataType.WORKSPACE_TURN, correlation=correlation
                )
            message = NewMessage(text=text, id=entry, mode=mode, options=options, metadata=metadata)
            outcome = self._queue(message)
            if isinstance(outcome, Rejected):
                raise UsageError(f"session {self.id}: {outcome.detail}")
            delivery = Delivery(outcome.message_id)
            if machine.keeper.enqueues:  # its commit is in flight: settled when it lands
                if self._deliveries is None:
                    self._deliveries = []
                self._deliveries.append((machine.keeper.version, delivery))
            else:  # settled already (a synchronous store): what became of it
                delivery.settle(DeliveryState.QUEUED)
            return delivery
        delivery = Delivery(entry)
        machine.handle(_in.DirectSend())  # R3: the sweep yields until this send claims or fails
        accepted = EntryCallbacks(
            entry_id=entry or "",
            on_accepted=lambda: delivery.settle(DeliveryState.ACCEPTED),
        )
        turn = TurnInput(
            text=text, entry_id=entry, options=options, correlation=correlation, callbacks=accepted
        )

        async def direct(then: Successors) -> None:
            result = await self._pipeline().run(turn, then)
            if not isinstance(result, Accepted):
                delivery.settle(DeliveryState.REFUSED, _why_unsent(result))
                await self._perform(machine.handle(_in.SendWentNowhere(turn)), then)

        self._run(direct)
        return delivery

    # ------------------------------------------------------------ turn settings

    def set_thinking(self, level: str) -> None:
        """Change the thinking level: mid-turn it is applied at the next step; else from now."""
        self._alive()
        self._machine.handle(_in.SetThinking(level))

    def set_scratchpad(self, text: str | None) -> None:
        """The live scratchpad text passed to every request (never persisted, R26)."""
        self._machine.scratchpad = text

    # ------------------------------------------------------------ user actions

    def stop(self) -> str:
        """AS-30: a user Stop.

        The owed continuation is withdrawn first (R6, R11), the stream (or the preparing turn)
        is stopped with reason ``user``, then the queue is restored to the input.

        Returns:
            The queued user-authored text given back for the composer (AS-17); synthetic
            entries are cancelled, never given back.
        """
        self._alive()
        self._host(self._machine.handle(_in.Stop()))
        return self.restore_queue()

    def hard_stop(self) -> None:
        """TD-7: a task hard stop: clear the queue with ``hard_stop`` first, then stop (system)."""
        self._alive()
        self._host(self._machine.handle(_in.HardStop()))

    def send_now(self) -> bool:
        """AS-18: send the oldest queued user message now, interrupting what runs (``user``).

        Returns:
            ``False`` when no user-authored entry is queued (nothing changes).
        """
        self._alive()
        return self._host(self._machine.handle(_in.SendNow())) is True

    async def edit(self, row_id: str, text: str) -> str:
        """AS-6: replace user row ``row_id`` and everything after it with a new send of ``text``.

        A running turn is interrupted (``user``) and its partial abandoned; the owed
        continuation is withdrawn (ST-5); queued input is restored (and returned) before the
        history is truncated; then ``text`` is sent like any message.

        Raises:
            UsageError: ``row_id`` is not a row of this session's history.
        """
        self._alive()
        machine = self._machine
        rows = await self._history().rows()
        target = next((row for row in rows if row.row_id == row_id), None)
        if target is None:
            raise UsageError(f"session {self.id}: no history row {row_id!r} to edit")
        failure = machine.validate(TurnInput(text=text))
        if failure is not None:  # AS-5: validated before any history change
            raise UsageError(f"session {self.id}: {failure.message}")
        await self._perform(machine.handle(_in.EditBegins()))
        try:
            self._do(machine.handle(_in.EditInterrupts()))
            await self.wait_idle()
            machine.handle(_in.EditSettled())
            restored = self.restore_queue()
            history = await self._history().rows()
            doomed = tuple(row.row_id for row in history if row.seq >= target.seq)
            failed = await self._perform(machine.handle(_in.Truncate(doomed)))
            if isinstance(failed, Exception):
                raise failed
        finally:
            machine.handle(_in.EditDone())
        self.send(text)
        return restored

    def discard_context(self) -> None:
        """R27: a context-discarding history mutation forfeits the owed continuation.

        The history is cleared (in a task; ``wait_idle`` waits for it). Allowed only while the
        session is idle.

        Raises:
            UsageError: the session is busy.
        """
        self._alive()
        if self.busy:
            raise UsageError(f"session {self.id}: history can be discarded only while idle")
        machine = self._machine
        self._host(machine.handle(_in.Discard()))

        async def discard(then: Successors) -> None:
            await self._perform([Next(_in.FlushRecords())])
            try:
                rows = await self._history().rows()
            except (TurnkeeperError, OSError) as error:  # the history stays as it was
                log.warning("session %s: history not discarded: %s", self.id, error)
                return
            await self._perform(machine.handle(_in.DiscardHistory(tuple(r.row_id for r in rows))))

        self._run(discard)

    async def dispose(self) -> None:
        """AS-31: forfeit the owed continuation (R27), abort a resume (R18), stop the stream."""
        machine = self._machine
        if machine.disposed:
            return
        await self._perform([*machine.handle(_in.Dispose()), Next(_in.FlushRecords())])
        self._do(machine.handle(_in.DisposedNow()))
        await self._manager.stop_stream(self.id, reason=AbortReason.SYSTEM)
        self._do(machine.handle(_in.DisposalDone()))
        if machine.pending:  # the record changes' write failed, and no sweep runs any more
            self._run(self._flush_until_written)
        self._check_idle()

    async def _flush_until_written(self, then: Successors) -> None:
        """A disposed session's record changes, retried on the clock until written (R54).

        A forfeit that stayed unwritten would leave its cut owed in the store, and the next
        startup would resume a turn that had ended (and whose owner was settled).
        """
        delay = FLUSH_RETRY_FIRST_S
        clock = self._manager.clock
        while self._machine.pending:
            await clock.sleep_until(clock.now() + delay)
            delay = min(delay * 2, FLUSH_RETRY_MAX_S)
            await self._perform([Next(_in.FlushRecords())])


_T = TypeVar("_T")

#: A disposed session's failed record write is tried again after this many seconds, doubling.
FLUSH_RETRY_FIRST_S: Final = 1.0
#: The longest wait between two of those attempts.
FLUSH_RETRY_MAX_S: Final = 30.0

#: What a stream event asks of its session, by the event's type (every other event: nothing).
_REACTIONS: dict[type, Callable[[AgentSession, Any], None]] = {
    StreamStarted: AgentSession._stream_began,
    ToolCallStarted: AgentSession._tool_started,
    ToolCallEnded: AgentSession._tool_ended,
    StreamAborted: AgentSession._stream_aborted,
    StepUsage: AgentSession._step_usage,
}


def _awaiting(awaitable: Awaitable[None]) -> Work:
    """``awaitable`` as a session task's work."""

    async def work(then: Successors) -> None:
        await awaitable

    return work


def _why_unsent(result: PipelineResult) -> str:
    """Why a direct send kept no row: its refusal, or its cancellation."""
    if isinstance(result, SendRefused):
        return f"{result.failure.type}: {result.failure.message}"
    if isinstance(result, CanceledBeforeAcceptance):
        return f"cancelled before acceptance: {result.reason}"
    return type(result).__name__
