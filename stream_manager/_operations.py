"""Tool calls as operations: every call ends with a durable receipt (``docs/operations.md``).

Theory of operation
-------------------
At a tool boundary the loop hands the step's client calls to :meth:`OperationRunner.run_calls`:

1. Each call gets an id from its position (stream, step, call index) and a privacy-minimised
   target; a call whose capability and target match an ``indeterminate`` operation is refused
   (OP-9: a ``failed`` receipt, ``op-blocked``, a structured error for the model, nothing run),
   unless its tool's declaration (read-only, idempotent, ``overlap="warn"``) or the engine-wide
   policy lets it run beside it (``op-overlap-warned``).
2. Every other call's ``requested`` receipt is written durably, then ``op-start`` (OP-1). The
   step's receipts are one write (one transaction); the call that runs first starts at once,
   so its receipt is written ``running`` already (requested and running in the same write).
3. The calls run one at a time (SM-6). Each call's lifecycle is an
   :class:`~stream_manager._op_life.OpLife`: a pure machine that every input reaches (the
   execute's end, a recorded completion, the deadline, a cancel request, the grace interval's
   end) and that returns the effects to perform. This module performs them, in order: it
   writes and tells receipts, arms timers on the engine's clock, cancels the call's scope,
   holds the overlap guard, and hands the model its result. Its execute runs in the stream's
   worker task, inside a cancel scope the runner owns.
4. When the stream is stopped while a call runs, every open call's cancel request is durable
   before anything is awaited (OP-3); the running one has at most the grace interval to end,
   and the calls still waiting behind it are ``cancelled`` before dispatch: they never run
   (OP-4). A stop that lands while the step's receipts are being written writes them again
   with the request, tells them in order (``op-start``, ``op-cancel-requested``, the receipt)
   and runs none of them.

Nothing a missing event can hold: the loop's wait always ends by the deadline and the grace
interval (OP-6), and a tool that never stops keeps only its own task. A late end of an
``indeterminate`` operation by the same layer resolves it, recorded as resolved late (OP-8).
Provider-executed calls get receipts too (``_op_receipts.ProviderCalls``).

The runner holds its collaborators: a :class:`~stream_manager._op_receipts.ReceiptWriter`
writes and reports every receipt, an :class:`~stream_manager._op_guard.OverlapGuard` keeps the
operations the store says may still be running (OP-9: a cache of ``Store.open_receipts``,
confirmed by the store before it refuses a call), and
:class:`~stream_manager._op_receipts.ProviderCalls` (``provider_calls``) gives
provider-executed calls their receipts.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import anyio

from persistence import (
    OPEN_OP_STATES,
    MemoryStore,
    OperationRecord,
    OpState,
    Resolution,
    Store,
    TurnkeeperError,
    found_receipt,
    resolved,
)
from stream_manager._cleanup import CLEANUP_S, BoundedCleanup, CleanupBounds
from stream_manager._events import (
    OpBlocked,
    OpCancelRequested,
    OperationStarted,
    OpOverlapWarned,
    OpProgress,
    Persisted,
    StreamEvent,
)
from stream_manager._op_answers import failed_result, receipt_answer
from stream_manager._op_guard import OverlapGuard, OverlapPolicy, warn_overlap
from stream_manager._op_life import (
    Abandon,
    Arm,
    Exit,
    Finish,
    Hold,
    Linger,
    OpLife,
    RequestCancel,
    Resolve,
    Run,
    Write,
)
from stream_manager._op_parts import (
    Flag,
    Op,
    Spawn,
    Worker,
    checked_result,
    operation_id,
)
from stream_manager._op_receipts import ProviderCalls, ReceiptWriter
from stream_manager._op_states import (
    CancelWhy,
    OutcomeCode,
    advance,
    requested,
    target_digest,
)
from stream_manager._partial import PartialLog
from stream_manager._parts import Part, ToolCallPart, ToolResultPart
from stream_manager.errors import (
    TerminationUnconfirmed,
    ToolTransportLost,
    ToolUnavailable,
    WriteFailed,
)
from stream_manager.ports import Capability, Clock, Tool, ToolContext, ToolKind
from stream_manager.tools import ArgumentsCheck, ToolOffer, overlap_of

log = logging.getLogger("turnkeeper.operations")

Admitted = Op | tuple[OperationRecord, ToolResultPart]


class OperationRunner:
    """Runs tool calls as operations with deadlines, cancellation and durable receipts."""

    def __init__(
        self,
        *,
        tools: Mapping[str, Tool],
        clock: Clock,
        default_deadline_s: float,
        emit: Callable[[StreamEvent], None] | None,
        grace_s: float = 5.0,
        store: Store | None = None,
        owner: Callable[[], str | None] | None = None,
        salt: str = "turnkeeper",
        policy: OverlapPolicy = OverlapPolicy.BLOCK,
        arguments: ArgumentsCheck | ToolOffer | None = None,
        cleanup_s: float = CLEANUP_S,
    ) -> None:
        self._tools = tools
        self._bounds = CleanupBounds(clock, cleanup_s)
        #: The declared schemas a call's arguments must pass before it runs.
        self._arguments = arguments if arguments is not None else ArgumentsCheck(())
        self._clock = clock
        self._deadline_s = default_deadline_s
        self._grace_s = grace_s
        self._emit = emit
        self._salt = salt
        # Without a store, receipts go to a store of the runner's own (it is that one's owner).
        receipts = store if store is not None else MemoryStore.opened()
        self._receipts = ReceiptWriter(
            store=receipts, owner=owner or (lambda: receipts.owner), emit=emit
        )
        self._guard = OverlapGuard(policy, receipts)
        #: Each tool's own overlap policy (its declaration, else the engine-wide one).
        self._policies = {
            name: OverlapPolicy(overlap_of(tool, policy.value)) for name, tool in tools.items()
        }
        #: Receipts of provider-executed calls (OP-7); the step loop reports their parts.
        self.provider_calls = ProviderCalls(
            clock=clock, salt=salt, receipts=self._receipts, guard=self._guard, emit=emit
        )
        self._spawn: Spawn | None = None
        self._running: dict[str, Op] = {}  # op id -> the operation whose execute runs
        self._workers: dict[str, Worker] = {}  # stream id -> its executing task
        self._spawns: dict[str, Spawn] = {}
        #: Set when the engine shuts down: no late resolution is written after that (OP-8).
        self._closing = False
        #: Indeterminate operations whose execute may still end (a late resolution waits).
        self._lingering: dict[str, Op] = {}
        #: Stream id -> the results of its step stopped mid-way (``take_answers``).
        self._answers: dict[str, list[ToolResultPart]] = {}
        #: Stream id -> the stream's parts, where each given result is appended (B4).
        self._parts: dict[str, list[Part]] = {}
        #: The effects performed at once (no await), by type: the hot path's dispatch.
        self._now: dict[type, Callable[[Op, Any, Spawn], None]] = {
            Arm: self._arm,
            Run: self._run_now,
            Hold: self._hold,
            Abandon: self._abandon,
            Linger: self._linger,
        }

    def _cleanup(self, what: str, *, beyond_s: float = 0.0) -> BoundedCleanup:
        """A stop path's shielded scope: ``cleanup_s`` (plus ``beyond_s``) on the clock."""
        return self._bounds.bound(what, beyond_s=beyond_s)

    def close(self) -> None:
        """The engine is shutting down: an operation that ends from now on resolves nothing.

        Its receipt stays as written (``indeterminate`` when it never acknowledged): an end
        seen while the engine tears its tasks down is no acknowledgement it can vouch for.
        """
        self._closing = True
        for op in (*self._running.values(), *self._lingering.values()):
            op.feed(op.life.shutdown())

    def bind(self, spawn: Spawn | None) -> None:
        """Run tool executes and finalizers as tasks of the engine's task group."""
        self._spawn = spawn

    @property
    def bound(self) -> bool:
        """Whether an engine's task group runs the tool tasks (streams need no group then)."""
        return self._spawn is not None

    def open_partial(self, stream: str, parts: list[Part]) -> PartialLog:
        """B4: ``stream``'s receipt writes carry its ``parts`` from now on (until it closes)."""
        log = self._receipts.logs[stream] = PartialLog(stream, parts)
        return log

    def remember_lost(self, record: OperationRecord) -> None:
        """A completed call of a stream a crash cut off: its next identical call is refused once.

        Its result died with that stream (no row holds it), so a startup retry of the turn
        would run it again without knowing (OP-9: never silently); the refusal tells the model.
        """
        self._guard.hold_lost(record)

    async def load_guard(self) -> None:
        """Read the store's open receipts into the overlap guard (OP-9), before any call runs.

        The engine does it at startup, once it closed what the previous process left open; a
        runner nobody loaded loads at its first call. Every open receipt holds its target
        (``_op_guard``).

        Raises:
            WriteFailed: The store could not be read.
        """
        await self._guard.load()

    async def resolve_indeterminate(
        self, op_id: str, as_: Resolution | str, *, note: str
    ) -> OperationRecord:
        """A person settles indeterminate ``op_id``: durably, then the guard lets it go (OP-9).

        Returns the new receipt (``resolved_by`` operator, at the runner's clock). A late end
        of the same execute resolves nothing afterwards.

        Raises:
            NotResolvable: No such receipt, a damaged one, or one that is not indeterminate.
            UsageError: An unknown resolution or an empty note.
            WriteFailed: The write failed; the operation stays indeterminate and held.
        """
        query = await self._receipts.store.receipts(op_id=op_id)
        op = self._lingering.get(op_id)  # its record in memory is the newest, unless ...
        stored = next((r for r in query.records if r.op_id == op_id), None)
        if op is not None and stored is not None and stored.state not in OPEN_OP_STATES:
            del self._lingering[op_id]  # ... it was settled through the store meanwhile
            op.life.settle(stored)
            op = None
        record = op.record if op is not None else found_receipt(query, op_id)
        settled = resolved(record, as_, at=self._clock.now(), note=note)
        if op is not None:
            op.life.settle(settled)  # before the write: a late end sees it settled
        try:
            await self._receipts.write(settled)
        except WriteFailed:
            if op is not None:
                op.life.unsettle(record)
            raise
        self._lingering.pop(op_id, None)
        self._guard.release(record)
        self._receipts.receipt_event(settled, record.capability.name)
        return settled

    # ------------------------------------------------------------ the step's calls

    async def run_calls(
        self,
        *,
        session: str,
        stream: str,
        step: int,
        calls: list[ToolCallPart],
        stop_why: Callable[[], CancelWhy],
        spawn: Spawn | None,
        parts: list[Part] | None = None,
    ) -> list[ToolResultPart]:
        """Run a step's client calls one at a time, each as an operation; results in order.

        ``spawn`` starts the tool tasks when no engine group is bound (the stream's group).
        ``parts``: the stream's parts; each result is appended there as it is given (a refused
        call's before the step's receipts are written, a call's with the receipt that ends
        it), so the stream's partial holds it durably with that receipt (B4).
        """
        if parts is None:
            parts = []
        spawn = self._spawn or spawn
        if spawn is None:
            raise RuntimeError("no task group to run tool calls in: bind one or pass spawn")
        guard = self._guard
        if guard.loaded and not guard.holding:  # the hot path: no holder, nothing to confirm
            admitted = [self._admit(session, stream, step, i, c) for i, c in enumerate(calls)]
        else:
            admitted = await self._admit_step(session, stream, step, calls)
        ops = [op for op in admitted if isinstance(op, Op)]
        first = ops[0] if ops and ops[0].tool is not None else None
        unstarted = first.life.record if first is not None else None
        if first is not None and unstarted is not None:  # it runs at once: one write
            first.life.record = advance(unstarted, OpState.RUNNING, now=unstarted.started_at)
        parts.extend(item[1] for item in admitted if not isinstance(item, Op))
        self._parts[stream] = parts
        try:
            await self._receipts.write_all([_record_of(a) for a in admitted], starting=True)
        except anyio.get_cancelled_exc_class():
            if first is not None and unstarted is not None:
                first.life.record = unstarted  # it never ran
            await self._bounded(
                f"stopping the calls of step {step} of {stream}",
                self._stopped_at_admission(admitted, ops, stop_why(), spawn),
                ops,
            )
            self._answers[stream] = _answers(admitted, [])
            raise
        for item in admitted:
            self._admitted(item)
        results: list[ToolResultPart] = []
        for position, item in enumerate(admitted):
            if not isinstance(item, Op):
                results.append(item[1])
                continue
            try:
                results.append(await self._run(item, spawn))
            except WriteFailed:
                waiting = [w for w in admitted[position + 1 :] if isinstance(w, Op)]
                await self._bounded(
                    f"cancelling the calls behind operation {item.record.op_id}",
                    self._write_failed(item, waiting, spawn),
                    waiting,
                )
                self._answers[stream] = _answers(admitted, results)  # a stop may win (abort)
                raise
            except BaseException:
                waiting = [w for w in admitted[position + 1 :] if isinstance(w, Op)]
                # The stop waits out the call's grace interval (bounded already, OP-6); its
                # writes get the cleanup bound on top of it.
                await self._bounded(
                    f"stopping operation {item.record.op_id}",
                    self._stopped(item, waiting, stop_why(), spawn),
                    [item, *waiting],
                    beyond_s=self._grace_s,
                )
                self._answers[stream] = _answers(admitted, results)
                raise
            finally:
                self._running.pop(item.record.op_id, None)
                self._spawns.pop(item.record.op_id, None)
        return results

    def take_answers(self, stream: str) -> list[ToolResultPart]:
        """The results of ``stream``'s step that a stop cut short (taken once).

        The ones its calls gave, then, for each call that gave none, the result its lifecycle
        decided, or its receipt's answer (``_op_answers``): the partial row keeps every call
        answered.
        """
        return self._answers.pop(stream, [])

    async def _write_failed(self, op: Op, waiting: list[Op], spawn: Spawn) -> None:
        """A receipt of ``op`` could not be written: the stream fails (``WriteFailed``).

        The operation keeps the receipt last written (an open one is ``indeterminate`` at the
        next startup, OP-7); a call still running is cancelled, and the calls waiting behind
        it never run: their cancellation is written if the store takes it.
        """
        self._give_up(op, f"operation {op.record.op_id}: its receipt could not be written")
        for other in waiting:
            try:
                other.feed(other.life.cancel(self._clock.now(), CancelWhy.STREAM_STOPPED))
                await self._drive(other, spawn)
                other.feed(other.life.drop(self._clock.now()))
                await self._drive(other, spawn)
            except WriteFailed as error:
                other.effects.clear()
                log.warning("operation %s: %s", other.record.op_id, error)

    async def _bounded(
        self, what: str, cleanup: Awaitable[None], ops: Iterable[Op], *, beyond_s: float = 0.0
    ) -> None:
        """Run a stop path's ``cleanup`` of ``ops`` shielded, within the cleanup bound.

        Cut short, it is treated like a failed write: nothing more is decided for them; each
        keeps the receipt last written (an open one is ``indeterminate`` at the next startup,
        OP-7), nothing of the cut work is told, and a call still running is cancelled.
        """
        with self._cleanup(what, beyond_s=beyond_s) as bound:
            try:
                await cleanup
            except WriteFailed:  # a receipt of the stop: the calls not ended are given up
                for op in ops:
                    if op.given is None:
                        self._give_up(op, f"operation {op.record.op_id}: unwritten ({what})")
                raise
        if bound.fired:
            for op in ops:
                self._give_up(op, f"operation {op.record.op_id}: cut short ({what})")

    def _give_up(self, op: Op, reason: str) -> None:
        """Nothing more is decided for ``op``: a call still running is cancelled, and held.

        Its last durable receipt is open (``indeterminate`` at the next startup, OP-7); until
        then the overlap guard holds a dispatched call nobody saw end (OP-9), as a restart
        would.
        """
        op.stop_timers()
        op.effects.clear()
        op.life.abandon()
        if not op.life.exited:
            op.scope.cancel(reason)
            self._retire_worker_of(op)  # OP-6: whatever it does, it holds only its own task
            if op.dispatched:
                self._guard.hold(op.record)

    async def _stopped_at_admission(
        self, admitted: list[Admitted], ops: list[Op], why: CancelWhy, spawn: Spawn
    ) -> None:
        """The stream stopped while the step's receipts were being written (OP-3, OP-4).

        The step's receipts are written again, as one write, each with its cancel request;
        then they are told in order (``op-start``, ``op-cancel-requested``, the receipt), and
        none of them runs.
        """
        now = self._clock.now()
        for op in ops:
            op.life.cancel_at_admission(now, why)
        await self._receipts.write_all([_record_of(a) for a in admitted])
        for item in admitted:
            self._admitted(item)
        if self._emit is not None:
            for op in ops:
                self._emit(
                    OpCancelRequested(session=op.record.session, op=op.record.op_id, why=why)
                )
        for op in ops:
            op.feed(op.life.drop(self._clock.now()))
            await self._drive(op, spawn)

    async def _stopped(self, op: Op, waiting: list[Op], why: CancelWhy, spawn: Spawn) -> None:
        """The stream stopped while ``op`` ran (OP-3, OP-4).

        Every open operation's cancel request is durable before anything is awaited; then the
        running one has at most the grace interval to acknowledge; the waiting ones never run.
        """
        now = self._clock.now()
        op.feed(op.life.cancel(now, why))
        for other in waiting:
            other.feed(other.life.cancel(now, why))
        await self._drive(op, spawn)
        for other in waiting:
            await self._drive(other, spawn)
        op.feed(op.life.drop(self._clock.now()))  # it had not started: it never runs
        await self._given(op, spawn)
        for other in waiting:
            other.feed(other.life.drop(self._clock.now()))
            await self._drive(other, spawn)

    async def _admit_step(
        self, session: str, stream: str, step: int, calls: list[ToolCallPart]
    ) -> list[Admitted]:
        """OP-9, then OP-1, for the step's calls: each call admitted, or refused.

        The guard's cache decides; when a call met a held operation, the store confirms first,
        and the calls are admitted again if it let one go. Nothing is written here.
        """
        if not self._guard.loaded:
            await self._guard.load()
        while True:  # each round that confirms lets at least one holder go: it ends
            admitted = [
                self._admit(session, stream, step, index, call) for index, call in enumerate(calls)
            ]
            met = [holder for item in admitted if (holder := _met(item)) is not None]
            if not met or not await self._guard.confirm(met):
                break
        for item in admitted:
            if isinstance(item, Op) and item.overlaps is not None:
                warn_overlap(item.record.op_id, item.overlaps, item.record.capability)
        return admitted

    def _admit(
        self, session: str, stream: str, step: int, index: int, call: ToolCallPart
    ) -> Admitted:
        """OP-9 then OP-1: a blocked call's receipt and result, or the ``requested`` record.

        Nothing is written here: the step's receipts are written together, before any runs.
        """
        tool = self._tools.get(call.name)
        kind = tool.kind if tool is not None else ToolKind.CLIENT
        capability = Capability(kind=ToolKind(kind), name=call.name)
        target = target_digest(capability, call.args, self._salt)
        now = self._clock.now()
        record = requested(
            op_id=operation_id(stream, step, index),
            session=session,
            stream=stream,
            call_id=call.call_id,
            capability=capability,
            target=target,
            now=now,
            deadline_at=now + self._deadline_of(tool, call),
        )
        policy = self._policies.get(call.name, self._guard.policy)
        holder, refused = self._guard.meets(session, target, policy)
        if not refused:
            op = Op(OpLife(record, call, grace_s=self._grace_s, closing=self._closing), tool)
            op.overlaps = holder
            return op
        assert holder is not None
        if self._guard.lost(holder):  # refused once, then the target is free
            self._guard.refused_once(holder)
            record = advance(
                record,
                OpState.FAILED,
                now=now,
                outcome=OutcomeCode.BLOCKED_BY_LOST_RESULT,
                acknowledged=True,
                blocked_by=holder,
                explanation=_LOST_BLOCKER,
            )
            return record, failed_result(call, "blocked_by_lost_result", blocked_by=holder)
        damaged = self._guard.damaged(holder) is not None
        record = advance(
            record,
            OpState.FAILED,
            now=now,
            outcome=OutcomeCode.BLOCKED_BY_INDETERMINATE,
            acknowledged=True,
            blocked_by=holder,
            explanation=_DAMAGED_BLOCKER if damaged else _BLOCKER,
        )
        extra: dict[str, object] = {"blocker_receipt": "damaged"} if damaged else {}
        return record, failed_result(call, "blocked_by_indeterminate", blocked_by=holder, **extra)

    def _admitted(self, item: Admitted) -> None:
        """The events of one admitted call, once the step's receipts are durable."""
        if self._emit is None:
            return
        if isinstance(item, Op):
            record, name = item.record, item.call.name
        else:
            record, name = item[0], item[1].name
        self._emit(Persisted(session=record.session, what="receipt", id=record.op_id))
        if isinstance(item, Op):
            if item.overlaps is not None:
                self._emit(
                    OpOverlapWarned(
                        session=record.session, op=record.op_id, tool=name, overlaps=item.overlaps
                    )
                )
            self._emit(
                OperationStarted(
                    session=record.session,
                    op=record.op_id,
                    tool=name,
                    stream=record.stream,
                    deadline=round(record.deadline_at * 1000) if record.deadline_at else 0,
                )
            )
        else:
            assert record.blocked_by is not None
            self._emit(
                OpBlocked(
                    session=record.session, op=record.op_id, tool=name, blocked_by=record.blocked_by
                )
            )
            self._receipts.receipt_event(record, name)

    def _deadline_of(self, tool: Tool | None, call: ToolCallPart) -> float:
        own = getattr(tool, "deadline_for", None)
        if callable(own):
            value = own(call)
            if isinstance(value, int | float) and value > 0:
                return float(value)
        return self._deadline_s

    # ------------------------------------------------------------ workers

    def _worker(self, stream: str, spawn: Spawn) -> Worker:
        worker = self._workers.get(stream)
        if worker is None or worker.retired:
            worker = Worker()
            self._workers[stream] = worker
            spawn(lambda: worker.run(self._execute))
        return worker

    def stream_closed(self, stream: str) -> None:
        """The stream ended: its worker exits once its current call (if any) has ended.

        Lost results its session still holds (``remember_lost``) are let go: they guard the
        startup retry's stream only, never a later turn's identical call.
        """
        self._parts.pop(stream, None)
        self._receipts.logs.pop(stream, None)
        worker = self._workers.pop(stream, None)
        if worker is not None:
            worker.retire()
        if self._guard.holding:
            self._guard.forget_lost(stream.rpartition("/")[0])

    def _retire_worker_of(self, op: Op) -> None:
        """The call ignores its cancellation: its worker stays with it; later calls get another."""
        worker = self._workers.get(op.record.stream)
        if worker is not None and worker.current is op:
            worker.retire()
            del self._workers[op.record.stream]

    # ------------------------------------------------------------ one call

    async def _run(self, op: Op, spawn: Spawn) -> ToolResultPart:
        now = self._clock.now()
        call = op.call
        if op.tool is None:  # OP-12: nothing ran; the controller could not reach a tool
            unknown = failed_result(call, f"unknown tool {call.name!r}")
            explanation = "no such tool; nothing ran"
            op.feed(op.life.refuse(now, OutcomeCode.TRANSPORT_ERROR, explanation, unknown))
            return await self._given(op, spawn)
        problems = self._arguments.problems(call)
        if problems:  # the model sent arguments its schema refuses: nothing runs
            explanation = "not run: its arguments failed the tool's schema"
            refused = failed_result(call, "invalid_arguments", problems=problems)
            op.feed(op.life.refuse(now, OutcomeCode.INVALID_ARGUMENTS, explanation, refused))
            return await self._given(op, spawn)
        self._running[op.record.op_id] = op
        self._spawns[op.record.op_id] = spawn
        op.feed(op.life.start(now))
        return await self._given(op, spawn)

    async def _given(self, op: Op, spawn: Spawn) -> ToolResultPart:
        """Perform the call's effects as its inputs come, until the model has its result."""
        while True:
            await self._drive(op, spawn)
            if op.given is not None:
                return op.given
            op.wake.clear()
            if not op.effects:
                await op.wake.wait()

    async def _drive(self, op: Op, spawn: Spawn) -> None:
        """Perform the queued effects in order; one interrupted stays queued (done again)."""
        effects = op.effects
        now = self._now
        while effects:
            effect = effects[0]
            perform = now.get(type(effect))
            if perform is not None:
                perform(op, effect, spawn)
            elif isinstance(effect, Finish):  # durable, then told, then given
                parts = self._parts.get(op.record.stream)
                if parts is not None and op.given_at is None:  # its result rides its receipt
                    op.given_at = len(parts)
                    parts.append(effect.result)
                await self._receipts.write(effect.record)
                self._receipts.receipt_event(effect.record, op.call.name)
                op.given = effect.result
                if op.timers:
                    op.stop_timers()
            elif isinstance(effect, Write):
                await self._receipts.write(effect.record)
            elif isinstance(effect, RequestCancel):
                await self._request_cancel(op, effect)
            elif isinstance(effect, Resolve):
                await self._resolve_late(op, effect)
            effects.popleft()

    def _run_now(self, op: Op, effect: Run, spawn: Spawn) -> None:
        clock, life = self._clock, op.life
        op.timers.append(clock.call_at(effect.at, lambda: op.feed(life.deadline(clock.now()))))
        self._worker(life.record.stream, spawn).submit(op)
        op.dispatched = True

    def _hold(self, op: Op, effect: Hold, spawn: Spawn) -> None:
        self._guard.hold(effect.record)

    def _abandon(self, op: Op, effect: Abandon, spawn: Spawn) -> None:
        op.scope.cancel(f"operation {op.record.op_id}: abandoned ({op.record.outcome_code})")
        if not op.life.exited:
            self._retire_worker_of(op)  # OP-6: the stuck execute keeps only its own task

    def _linger(self, op: Op, effect: Linger, spawn: Spawn) -> None:
        self._lingering[op.record.op_id] = op
        op.exit_flag = Flag()
        if op.life.exited:
            op.exit_flag.set()
        spawn(lambda: self._late(op, spawn))

    def _arm(self, op: Op, arm: Arm, spawn: Spawn) -> None:
        clock, life = self._clock, op.life
        op.timers.append(clock.call_at(arm.at, lambda: op.feed(life.grace_over(clock.now()))))

    async def _request_cancel(self, op: Op, effect: RequestCancel) -> None:
        """OP-3: the request is durable before anything waits; then the scope is cancelled."""
        record = effect.record
        try:
            await self._receipts.write(record)
        except WriteFailed as error:
            if effect.why is not CancelWhy.USER:
                raise
            log.warning("operation %s: %s", record.op_id, error)  # stopped all the same
        else:
            if self._emit is not None:
                self._emit(
                    OpCancelRequested(session=record.session, op=record.op_id, why=effect.why)
                )
        op.scope.cancel(f"operation {record.op_id}: cancellation requested ({effect.why})")

    def _progress(self, op: Op, progress: float, total: float | None, message: str | None) -> None:
        """The tool layer reported progress: an ``op-progress`` event (the deadline stays)."""
        if self._emit is not None:
            self._emit(
                OpProgress(
                    session=op.record.session,
                    op=op.record.op_id,
                    progress=progress,
                    total=total,
                    message=message,
                )
            )

    async def _execute(self, op: Op) -> None:
        """The tool's own task: execute inside the operation's scope; its end is an input."""
        assert op.tool is not None
        life, call, clock = op.life, op.call, self._clock
        record = life.record
        assert record.deadline_at is not None
        context = ToolContext(
            session=record.session,
            stream=record.stream,
            op_id=record.op_id,
            deadline_at=record.deadline_at,
            record_completion=lambda result: op.feed(life.recorded(clock.now(), result)),
            report_progress=lambda progress, total, message: self._progress(
                op, progress, total, message
            ),
        )
        how, result = Exit.CANCELLED, None
        try:
            with op.scope:
                result = checked_result(call, await op.tool.execute(call, context))
                how = Exit.RETURNED
        except TerminationUnconfirmed:
            how = Exit.UNCONFIRMED
        except ToolTransportLost:
            how = Exit.LOST
        except Exception as error:  # a tool that raises is a failed result (issue 3)
            how = Exit.UNAVAILABLE if isinstance(error, ToolUnavailable) else Exit.RAISED
            result = failed_result(call, f"{type(error).__name__}: {error}")
        finally:
            op.feed(life.exit(clock.now(), how, result))
            if op.exit_flag is not None:
                op.exit_flag.set()

    # ------------------------------------------------------------ cancellation

    def cancel_nowait(self, *, op_id: str | None = None, tool: str | None = None) -> bool:
        """A person stops a running operation (by id, or the running call to ``tool``).

        Returns:
            Whether a running operation was found (its cancellation then proceeds as OP-3).
        """
        found = next(
            (
                op
                for candidate, op in self._running.items()
                if candidate == op_id or (tool is not None and op.call.name == tool)
            ),
            None,
        )
        if found is None:
            return False
        found.feed(found.life.cancel(self._clock.now(), CancelWhy.USER))
        return True

    async def _late(self, op: Op, spawn: Spawn) -> None:
        """The same layer may end after all: its end resolves the receipt, recorded late."""
        assert op.exit_flag is not None
        try:
            await op.exit_flag.wait()
            with self._cleanup(f"the late resolution of operation {op.record.op_id}"):
                await self._drive(op, spawn)
        finally:
            self._lingering.pop(op.record.op_id, None)

    async def _resolve_late(self, op: Op, effect: Resolve) -> None:
        self._guard.release(effect.held)
        if await self._settled_in_store(effect.held.op_id):
            return  # a person settled it through the store meanwhile: that stands (OP-8)
        try:
            await self._receipts.write(effect.record)
        except WriteFailed as error:  # it stays indeterminate, as the store says
            log.warning("operation %s: %s", effect.held.op_id, error)
            self._still_held(op, effect.held)
            return
        except BaseException:  # cut short (the cleanup bound): not durable, so still held
            self._still_held(op, effect.held)
            raise
        self._receipts.receipt_event(effect.record, op.call.name)

    async def _settled_in_store(self, op_id: str) -> bool:
        """Whether the store says ``op_id`` ended (a read that fails says it did not)."""
        try:
            query = await self._receipts.store.receipts(op_id=op_id)
        except (TurnkeeperError, OSError):
            return False
        return any(r.state not in OPEN_OP_STATES for r in query.records)

    def _still_held(self, op: Op, held: OperationRecord) -> None:
        op.life.record = held
        self._guard.hold(held)


_BLOCKER = "not run: an earlier call on this target is indeterminate"
_LOST_BLOCKER = (
    "not run: the same call completed before a restart and its result was lost with the "
    "interrupted stream; call it again to run it again"
)
_DAMAGED_BLOCKER = (
    "not run: an earlier call on this target has a damaged receipt, held as indeterminate"
)


def _met(item: Admitted) -> str | None:
    """The held operation the call met (refused by it, or running beside it), if any."""
    return item.overlaps if isinstance(item, Op) else item[0].blocked_by


def _record_of(item: Admitted) -> OperationRecord:
    return item.record if isinstance(item, Op) else item[0]


def _answers(admitted: list[Admitted], results: list[ToolResultPart]) -> list[ToolResultPart]:
    """A stopped step's calls that no given result answers yet, answered from their receipts.

    A refused call's result and every given one are in the stream's parts already.
    """
    return [
        receipt_answer(item.call, item.record)
        for item in admitted[len(results) :]
        if isinstance(item, Op) and item.given is None and item.given_at is None
    ]
