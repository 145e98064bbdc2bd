"""Tool calls as operations: every call ends with a durable receipt (``docs/operations.md``).

Theory of operation
-------------------
At a tool boundary the loop hands the step's client calls to :meth:`OperationRunner.run_calls`:

1. Each call gets an id from its position (stream, step, call index) and a privacy-minimised
   target; a call whose capability and target match an ``indeterminate`` operation is refused
   (OP-9: a ``failed`` receipt, ``op-blocked``, a structured error for the model, nothing run).
2. Every other call's ``requested`` receipt is written durably, then ``op-start`` (OP-1). The
   step's receipts are one write (one transaction); the call that runs first starts at once,
   so its receipt is written ``running`` already (requested and running in the same write).
3. The calls run one at a time (SM-6). A call is ``running`` once written so; its ``execute``
   runs in a task of its own, inside a cancel scope the runner owns, and the loop waits for the
   first of: the execute ending, the tool layer recording its completion (OP-5, a lost
   completion signal), the deadline (OP-2).
4. At the deadline the cancellation request is written durably and the scope cancelled; the
   loop waits at most the grace interval more for the execute to end, writes ``timed_out``
   (acknowledged) or ``indeterminate``, and the model gets a structured timeout result.
5. When the stream is stopped while a call runs, the same happens with the stop's reason
   (``cancelled`` only on acknowledgement, OP-3), and calls still waiting behind it are
   ``cancelled`` before dispatch: they never run (OP-4). A stop that lands while the step's
   receipts are being written writes them again with the request, tells them in order
   (``op-start``, ``op-cancel-requested``, the receipt) and runs none of them.

Nothing a missing event can hold: the loop's wait always ends by the deadline (OP-6), and a
tool that never stops keeps only its own task. A late end of an ``indeterminate`` operation
by the same layer resolves it, recorded as resolved late (OP-8); a late "unconfirmed" resolves
nothing, and from the engine's shutdown on nothing is resolved. Provider-executed calls get
receipts too (and ``op-start``, without a deadline): their result completes them; a stream cut
before it arrives leaves them ``indeterminate`` (OP-7).

The decisions are ``_op_states``'s; this module awaits. The runner holds its collaborators:
a :class:`~stream_manager._op_receipts.ReceiptWriter` writes and reports every receipt, an
:class:`~stream_manager._op_parts.OverlapGuard` keeps the indeterminate operations (OP-9), and
:class:`~stream_manager._op_receipts.ProviderCalls` (``provider_calls``) gives
provider-executed calls their receipts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import anyio

from persistence import (
    MemoryStore,
    OperationRecord,
    OpState,
    Resolution,
    Store,
    found_receipt,
    resolved,
)
from stream_manager._events import (
    OpBlocked,
    OpCancelRequested,
    OperationStarted,
    OpProgress,
    Persisted,
    StreamEvent,
)
from stream_manager._op_answers import receipt_answer
from stream_manager._op_parts import (
    Op,
    OverlapGuard,
    OverlapPolicy,
    Spawn,
    Worker,
    checked_result,
    failed_result,
    operation_id,
)
from stream_manager._op_receipts import ProviderCalls, ReceiptWriter
from stream_manager._op_states import (
    UNCONFIRMED,
    UNCONFIRMED_AT_SHUTDOWN,
    CancelWhy,
    OutcomeCode,
    advance,
    cancel_requested,
    requested,
    target_digest,
)
from stream_manager._parts import ToolCallPart, ToolResultPart
from stream_manager.errors import TerminationUnconfirmed, WriteFailed
from stream_manager.ports import Capability, Clock, Tool, ToolContext, ToolKind
from stream_manager.tools import ArgumentsCheck

log = logging.getLogger("turnkeeper.operations")


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
        arguments: ArgumentsCheck | None = None,
    ) -> None:
        self._tools = tools
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
        self._guard = OverlapGuard(policy)
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

    def close(self) -> None:
        """The engine is shutting down: an operation that ends from now on resolves nothing.

        Its receipt stays as written (``indeterminate`` when it never acknowledged): an end
        seen while the engine tears its tasks down is no acknowledgement it can vouch for.
        """
        self._closing = True

    def bind(self, spawn: Spawn | None) -> None:
        """Run tool executes and finalizers as tasks of the engine's task group."""
        self._spawn = spawn

    @property
    def bound(self) -> bool:
        """Whether an engine's task group runs the tool tasks (streams need no group then)."""
        return self._spawn is not None

    def remember_indeterminate(self, record: OperationRecord) -> None:
        """Load an indeterminate receipt into the overlap guard (at startup)."""
        if record.state is OpState.INDETERMINATE:
            self._guard.hold(record)

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
        op = self._lingering.get(op_id)  # its record in memory is the newest
        record = op.record if op is not None else found_receipt(query, op_id)
        settled = resolved(record, as_, at=self._clock.now(), note=note)
        if op is not None:
            op.record = settled  # before the write: a late end sees it settled
        try:
            await self._receipts.write(settled)
        except WriteFailed:
            if op is not None:
                op.record = record
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
    ) -> list[ToolResultPart]:
        """Run a step's client calls one at a time, each as an operation; results in order.

        ``spawn`` starts the tool tasks when no engine group is bound (the stream's group).
        """
        spawn = self._spawn or spawn
        if spawn is None:
            raise RuntimeError("no task group to run tool calls in: bind one or pass spawn")
        admitted = [
            self._admit(session, stream, step, index, call) for index, call in enumerate(calls)
        ]
        ops = [op for op in admitted if isinstance(op, Op)]
        first = ops[0] if ops and ops[0].tool is not None else None
        unstarted = first.record if first is not None else None
        if first is not None:  # it runs at once: requested and running, one write
            first.record = advance(first.record, OpState.RUNNING, now=first.record.started_at)
        try:
            await self._receipts.write_all(
                [a.record if isinstance(a, Op) else a[0] for a in admitted]
            )
        except anyio.get_cancelled_exc_class():
            if first is not None and unstarted is not None:
                first.record = unstarted  # it never ran
            with anyio.CancelScope(shield=True):
                await self._stopped_at_admission(admitted, ops, stop_why())
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
                with anyio.CancelScope(shield=True):
                    await self._write_failed(item, waiting)
                self._answers[stream] = _answers(admitted, results)  # a stop may win (abort)
                raise
            except BaseException:
                waiting = [w for w in admitted[position + 1 :] if isinstance(w, Op)]
                with anyio.CancelScope(shield=True):
                    await self._stopped(item, waiting, stop_why(), spawn)
                self._answers[stream] = _answers(admitted, results)
                raise
        return results

    def take_answers(self, stream: str) -> list[ToolResultPart]:
        """The results of ``stream``'s step that a stop cut short (taken once).

        The ones its calls gave, then, for each call that gave none, its receipt's answer
        (``_op_answers``): the partial row keeps every call answered.
        """
        return self._answers.pop(stream, [])

    async def _write_failed(self, op: Op, waiting: list[Op]) -> None:
        """A receipt of ``op`` could not be written: the stream fails (``WriteFailed``).

        The operation keeps the receipt last written (an open one is ``indeterminate`` at the
        next startup, OP-7); a call still running is cancelled, and the calls waiting behind
        it never run: their cancellation is written if the store takes it.
        """
        op.stop_timers()
        if not op.done:
            op.scope.cancel()
            self._retire_worker_of(op)  # OP-6: whatever it does, it holds only its own task
        for other in waiting:
            try:
                await self._request_cancel_before_dispatch(other, CancelWhy.STREAM_STOPPED)
                await self._cancel_before_dispatch(other)
            except WriteFailed as error:
                log.warning("operation %s: %s", other.record.op_id, error)

    async def _stopped_at_admission(
        self,
        admitted: list[Op | tuple[OperationRecord, ToolResultPart]],
        ops: list[Op],
        why: CancelWhy,
    ) -> None:
        """The stream stopped while the step's receipts were being written (OP-3, OP-4).

        The step's receipts are written again, as one write, each with its cancel request;
        then they are told in order (``op-start``, ``op-cancel-requested``, the receipt), and
        none of them runs.
        """
        now = self._clock.now()
        for op in ops:
            op.record = cancel_requested(op.record, now=now, why=why)
        await self._receipts.write_all([a.record if isinstance(a, Op) else a[0] for a in admitted])
        for item in admitted:
            self._admitted(item)
        if self._emit is not None:
            for op in ops:
                self._emit(
                    OpCancelRequested(session=op.record.session, op=op.record.op_id, why=why)
                )
        for op in ops:
            await self._cancel_before_dispatch(op)

    async def _stopped(self, op: Op, waiting: list[Op], why: CancelWhy, spawn: Spawn) -> None:
        """The stream stopped while ``op`` ran (OP-3, OP-4).

        Every open operation's cancel request is durable before anything is awaited; then the
        running one has at most the grace interval to acknowledge; the waiting ones never run.
        """
        if op.done and op.result is not None and not op.cancelling:
            await self._settle(op, op.result)  # it had ended by itself (a result or a failure)
        elif not op.cancelling:
            await self._request_cancel(op, why)
        for other in waiting:
            await self._request_cancel_before_dispatch(other, why)
        if op.cancelling:
            await self._finalize(op, spawn)
        for other in waiting:
            await self._cancel_before_dispatch(other)

    def _admit(
        self, session: str, stream: str, step: int, index: int, call: ToolCallPart
    ) -> Op | tuple[OperationRecord, ToolResultPart]:
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
        blocker = self._guard.blocker(record.op_id, session, capability, target)
        if blocker is None:
            return Op(record=record, call=call, tool=tool)
        record = advance(
            record,
            OpState.FAILED,
            now=now,
            outcome=OutcomeCode.BLOCKED_BY_INDETERMINATE,
            acknowledged=True,
            blocked_by=blocker,
            explanation="not run: an earlier call on this target is indeterminate",
        )
        return record, failed_result(call, "blocked_by_indeterminate", blocked_by=blocker)

    def _admitted(self, item: Op | tuple[OperationRecord, ToolResultPart]) -> None:
        """The events of one admitted call, once the step's receipts are durable."""
        if isinstance(item, Op):
            record, name = item.record, item.call.name
        else:
            record, name = item[0], item[1].name
        if self._emit is None:
            return
        self._emit(Persisted(session=record.session, what="receipt", id=record.op_id))
        if isinstance(item, Op):
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
        """The stream ended: its worker exits once its current call (if any) has ended."""
        worker = self._workers.pop(stream, None)
        if worker is not None:
            worker.retire()

    def _retire_worker_of(self, op: Op) -> None:
        """The call ignores its cancellation: its worker stays with it; later calls get another."""
        worker = self._workers.get(op.record.stream)
        if worker is not None and worker.current is op:
            worker.retire()
            del self._workers[op.record.stream]

    # ------------------------------------------------------------ one call

    async def _not_run(self, op: Op, now: float, outcome: OutcomeCode, explanation: str) -> None:
        """The call ends ``failed`` before it ran: its receipt, written and told."""
        op.record = advance(
            op.record,
            OpState.FAILED,
            now=now,
            outcome=outcome,
            acknowledged=True,
            explanation=explanation,
        )
        await self._receipts.write(op.record)
        self._receipts.receipt_event(op.record, op.call.name)

    async def _run(self, op: Op, spawn: Spawn) -> ToolResultPart:
        now = self._clock.now()
        if op.tool is None:  # OP-12: nothing ran; the controller could not reach a tool
            await self._not_run(op, now, OutcomeCode.TRANSPORT_ERROR, "no such tool; nothing ran")
            return failed_result(op.call, f"unknown tool {op.call.name!r}")
        problems = self._arguments.problems(op.call)
        if problems:  # the model sent arguments its schema refuses: nothing runs
            explanation = "not run: its arguments failed the tool's schema"
            await self._not_run(op, now, OutcomeCode.INVALID_ARGUMENTS, explanation)
            return failed_result(op.call, "invalid_arguments", problems=problems)
        if op.record.state is OpState.REQUESTED:  # it waited behind a sibling
            op.record = advance(op.record, OpState.RUNNING, now=now)
            await self._receipts.write(op.record)
        assert op.record.deadline_at is not None
        op.timers.append(self._clock.call_at(op.record.deadline_at, op.on_deadline))
        self._worker(op.record.stream, spawn).submit(op)
        self._running[op.record.op_id] = op
        self._spawns[op.record.op_id] = spawn
        try:
            await op.settled.wait()
        except BaseException:
            op.stop_timers()  # run_calls records the cancellation (OP-3) and finalizes
            raise
        finally:
            self._running.pop(op.record.op_id, None)
            self._spawns.pop(op.record.op_id, None)
        op.stop_timers()
        if op.cancelling:  # a person cancelled it (cancel_op)
            await self._finalize(op, spawn)
            return failed_result(op.call, "cancelled", op=op.record.op_id)
        if op.done:
            return await self._settle(op, op.result)
        if op.recorded is not None:  # OP-5: the completion never reached us; its record did
            op.scope.cancel()
            if not op.done:
                self._retire_worker_of(op)  # OP-6: the stuck execute keeps only its own task
            return await self._settle(op, op.recorded, lost=True)
        await self._request_cancel(op, CancelWhy.DEADLINE)
        await self._finalize(op, spawn)  # the model waits at most the grace interval more
        return failed_result(
            op.call,
            "timeout",
            op=op.record.op_id,
            detail="the call passed its deadline; cancellation was requested",
        )

    async def _execute(self, op: Op) -> None:
        """The tool's own task: execute inside the operation's scope, record how it ended."""
        assert op.tool is not None
        assert op.record.deadline_at is not None
        context = ToolContext(
            session=op.record.session,
            stream=op.record.stream,
            op_id=op.record.op_id,
            deadline_at=op.record.deadline_at,
            record_completion=op.on_recorded,
            report_progress=lambda progress, total, message: self._progress(
                op, progress, total, message
            ),
        )
        try:
            with op.scope:
                op.result = checked_result(op.call, await op.tool.execute(op.call, context))
        except TerminationUnconfirmed:
            op.unconfirmed = True
        except Exception as error:  # a tool that raises is a failed result (issue 3)
            op.raised = True
            op.result = failed_result(op.call, f"{type(error).__name__}: {error}")
        finally:
            op.done = True
            op.settled.set()
            if op.finished is not None and op.ended is not None:
                op.finished.set()
                op.ended.set()

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

    async def _settle(
        self, op: Op, result: ToolResultPart | None, *, lost: bool = False
    ) -> ToolResultPart:
        """The execute ended by itself (or its completion was recorded): the terminal receipt."""
        if result is None:  # it ended without a result: cancelled from outside, or unconfirmed
            result = failed_result(op.call, "the tool ended without a result")
            op.raised = True
        if op.raised:
            state, outcome = OpState.FAILED, OutcomeCode.TOOL_ERROR
        elif result.is_error:
            state, outcome = OpState.FAILED, OutcomeCode.CAPABILITY_ERROR
        else:
            state = OpState.COMPLETED
            outcome = OutcomeCode.COMPLETION_SIGNAL_LOST if lost else OutcomeCode.OK
        op.record = advance(op.record, state, now=self._clock.now(), outcome=outcome)
        await self._receipts.write(op.record)
        self._receipts.receipt_event(op.record, op.call.name)
        return result

    # ------------------------------------------------------------ cancellation

    def cancel_nowait(self, *, op_id: str | None = None, tool: str | None = None) -> bool:
        """A person stops a running operation (by id, or the running call to ``tool``).

        Returns:
            Whether a running operation was found (its cancellation then proceeds as OP-3).
        """
        found = next(
            (
                (candidate, op)
                for candidate, op in self._running.items()
                if candidate == op_id or (tool is not None and op.call.name == tool)
            ),
            None,
        )
        if found is None:
            return False
        candidate, op = found
        if not op.cancelling:
            op.cancelling = True
            self._spawns[candidate](lambda: self._cancel_by_person(op))
        return True

    async def _cancel_by_person(self, op: Op) -> None:
        try:
            await self._request_cancel(op, CancelWhy.USER)
        except WriteFailed as error:  # not durable: the call is stopped all the same
            log.warning("operation %s: %s", op.record.op_id, error)
            op.scope.cancel()

    async def _request_cancel(self, op: Op, why: CancelWhy) -> None:
        """OP-3: the request is durable before anything waits; then the scope is cancelled."""
        op.cancelling = True
        op.why = why
        op.record = cancel_requested(op.record, now=self._clock.now(), why=why)
        await self._receipts.write(op.record)
        if self._emit is not None:
            self._emit(OpCancelRequested(session=op.record.session, op=op.record.op_id, why=why))
        op.scope.cancel()

    async def _request_cancel_before_dispatch(self, op: Op, why: CancelWhy) -> None:
        """OP-3 for a call still waiting behind a sibling: its request is durable at once."""
        op.record = cancel_requested(op.record, now=self._clock.now(), why=why)
        await self._receipts.write(op.record)
        if self._emit is not None:
            self._emit(OpCancelRequested(session=op.record.session, op=op.record.op_id, why=why))

    async def _cancel_before_dispatch(self, op: Op) -> None:
        """OP-4: a call still waiting behind a sibling never runs: cancelled, acknowledged."""
        now = self._clock.now()
        op.record = advance(
            op.record,
            OpState.CANCELLED,
            now=now,
            outcome=OutcomeCode.CANCELLED,
            acknowledged=True,
            explanation="cancelled before it was dispatched; nothing ran",
        )
        await self._receipts.write(op.record)
        self._receipts.receipt_event(op.record, op.call.name)

    async def _finalize(self, op: Op, spawn: Spawn) -> None:
        """Wait, at most the grace interval, for the acknowledgement; write the receipt.

        An unacknowledged operation is ``indeterminate``; if the same layer ends it later, a
        task resolves the receipt then, recorded as resolved late (OP-8).
        """
        deadline = op.why is CancelWhy.DEADLINE
        finished, _ = op.watch_ending()
        if not op.done:
            op.timers.append(
                self._clock.call_at(self._clock.now() + self._grace_s, op.on_grace_over)
            )
            await finished.wait()
            op.stop_timers()
            if not op.done:
                self._retire_worker_of(op)
        await self._write_cancel_outcome(op, deadline=deadline)
        if op.record.state is OpState.INDETERMINATE and not op.unconfirmed and not self._closing:
            self._lingering[op.record.op_id] = op
            spawn(lambda: self._late(op, deadline=deadline))

    async def _write_cancel_outcome(self, op: Op, *, deadline: bool) -> None:
        now = self._clock.now()
        outcome = OutcomeCode.TIMEOUT if deadline else OutcomeCode.CANCELLED
        if op.done and not op.unconfirmed:
            if op.result is not None and not op.scope.cancelled_caught and not op.raised:
                state = OpState.COMPLETED  # it finished its work before it saw the request
                outcome = OutcomeCode.OK
            else:
                state = OpState.TIMED_OUT if deadline else OpState.CANCELLED
            op.record = advance(op.record, state, now=now, outcome=outcome, acknowledged=True)
        else:
            op.record = advance(
                op.record,
                OpState.INDETERMINATE,
                now=now,
                outcome=outcome,
                acknowledged=False,
                explanation=UNCONFIRMED_AT_SHUTDOWN
                if op.why is CancelWhy.SHUTDOWN
                else UNCONFIRMED,
            )
            self._guard.hold(op.record)
        await self._receipts.write(op.record)
        self._receipts.receipt_event(op.record, op.call.name)

    async def _late(self, op: Op, *, deadline: bool) -> None:
        """The same layer ends after all: resolve the indeterminate receipt, recorded late."""
        _, ended = op.watch_ending()
        try:
            await ended.wait()
        finally:
            self._lingering.pop(op.record.op_id, None)
        if op.unconfirmed or self._closing or op.record.state is not OpState.INDETERMINATE:
            return  # no acknowledgement, or a person settled it: the receipt says what is known
        with anyio.CancelScope(shield=True):
            held = op.record
            self._guard.release(held)
            try:
                await self._write_cancel_outcome(op, deadline=deadline)
            except WriteFailed as error:  # it stays indeterminate, as the store says
                log.warning("operation %s: %s", held.op_id, error)
                op.record = held
                self._guard.hold(held)


def _answers(
    admitted: list[Op | tuple[OperationRecord, ToolResultPart]], results: list[ToolResultPart]
) -> list[ToolResultPart]:
    """Every call of a stopped step answered: its own result, or its receipt's answer."""
    answers = list(results)
    for item in admitted[len(results) :]:
        if isinstance(item, Op):
            answers.append(receipt_answer(item.call, item.record))
        else:
            answers.append(item[1])
    return answers
