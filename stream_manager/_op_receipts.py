"""Receipts: writing them and their events, and provider-executed calls (``docs/operations.md``).

:class:`ReceiptWriter` writes receipts durably and reports them (``persisted``, ``receipt``);
the :class:`~stream_manager._operations.OperationRunner` holds one and writes every receipt
through it. :class:`ProviderCalls` gives provider-executed calls their receipts: their result
completes them; a stream cut before it arrives leaves them ``indeterminate`` (OP-7).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from persistence import Boundary, LeasedStore, OperationRecord, OpState, Store, TurnkeeperError
from stream_manager._events import OperationStarted, Persisted, ReceiptWritten, StreamEvent
from stream_manager._op_guard import OverlapGuard
from stream_manager._op_states import OutcomeCode, advance, requested, target_digest
from stream_manager._partial import PartialLog
from stream_manager._parts import ToolCallPart, ToolResultPart
from stream_manager.errors import WriteFailed
from stream_manager.ports import Capability, Clock, ToolKind


class ReceiptWriter:
    """Writes receipts durably and reports them."""

    def __init__(
        self,
        *,
        store: Store,
        owner: Callable[[], str | None],
        emit: Callable[[StreamEvent], None] | None,
    ) -> None:
        self.store = store
        #: A leased store's lease book (LS-5: no call starts while it is stale), else None.
        self._leases = store.leases if isinstance(store, LeasedStore) else None
        #: The owner token every receipt commit carries (read at each write: the engine's).
        self._owner = owner
        self._emit = emit
        #: Stream id -> its partial (B4): each receipt write of the stream carries its news.
        self.logs: dict[str, PartialLog] = {}

    # ------------------------------------------------------------ writes and events

    # A failed write is :class:`WriteFailed` (the stream cannot go on). Nothing of it is told:
    # the stored receipts stay as they were (an open one is ``indeterminate`` at the next
    # startup, OP-7). The commit is inlined in both writers: receipts are the hottest write.

    async def _write(self, record: OperationRecord) -> None:
        records = (record,)
        log = self.logs.get(record.stream) if self.logs else None
        chunk = log.chunk() if log is not None else None
        try:
            await self.store.commit(
                record.session, Boundary(operations=records, partial=chunk), owner=self._owner()
            )
        except (TurnkeeperError, OSError) as error:
            raise _unwritten(records, error) from error
        if log is not None:
            log.wrote(chunk)
        if self._emit is not None:
            self._emit(Persisted(session=record.session, what="receipt", id=record.op_id))

    async def _write_all(self, records: list[OperationRecord], *, starting: bool = False) -> None:
        """Write a step's receipts in one durable write (their events come from the caller).

        ``starting``: the write that lets the step's calls start (OP-1). On a leased store
        whose renewals have failed too long (LS-5: a peer may take the session any moment),
        nothing is written and no call starts: ``WriteFailed``, as for a write that failed.
        """
        leases = self._leases
        if starting and records and leases is not None and not leases.fresh:
            raise _unwritten(
                records,
                RuntimeError("this process's leases are stale (renewals failing): no new call"),
            )
        if records:  # one step's calls: one session's boundary
            log = self.logs.get(records[0].stream) if self.logs else None
            chunk = log.chunk() if log is not None else None
            boundary = Boundary(operations=tuple(records), partial=chunk)
            try:
                await self.store.commit(records[0].session, boundary, owner=self._owner())
            except (TurnkeeperError, OSError) as error:
                raise _unwritten(records, error) from error
            if log is not None:
                log.wrote(chunk)

    #: What the runner and the provider calls write through.
    write = _write
    write_all = _write_all

    def receipt_event(self, record: OperationRecord, tool: str) -> None:
        """``receipt``: ``record`` (of a call to ``tool``) reached a new state."""
        if self._emit is not None:
            self._emit(
                ReceiptWritten(
                    session=record.session,
                    op=record.op_id,
                    tool=tool,
                    state=record.state.value,
                    acknowledged=record.termination_acknowledged,
                    resolved_late=record.resolved_late,
                )
            )


def _unwritten(records: Sequence[OperationRecord], error: Exception) -> WriteFailed:
    what = ", ".join(f"{r.op_id} ({r.state.value})" for r in records)
    return WriteFailed(f"receipt {what} could not be written: {error}")


class ProviderCalls:
    """Receipts of provider-executed calls (OP-7): they run inside the model's response.

    A call's receipt is written ``running`` when its part arrives and ends when its result
    does; a stream that ends first leaves its open calls ``indeterminate``.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        salt: str,
        receipts: ReceiptWriter,
        guard: OverlapGuard,
        emit: Callable[[StreamEvent], None] | None,
    ) -> None:
        self._clock = clock
        self._salt = salt
        self._receipts = receipts
        self._guard = guard
        self._emit = emit
        #: Call id -> the open operation's record and its tool's name.
        self._open: dict[str, tuple[OperationRecord, str]] = {}

    async def started(
        self, *, session: str, stream: str, step: int, index: int, call: ToolCallPart
    ) -> None:
        """A provider-executed call began inside the model's response: it runs already.

        Raises:
            WriteFailed: Its receipt could not be written (or, before this process's first
                receipt, the overlap guard could not read the store's open receipts).
        """
        if not self._guard.loaded:
            await self._guard.load()
        capability = Capability(kind=ToolKind.PROVIDER, name=call.name)
        now = self._clock.now()
        record = requested(
            op_id=f"{stream}/{step}/p{index}",
            session=session,
            stream=stream,
            call_id=call.call_id,
            capability=capability,
            target=target_digest(capability, call.args, self._salt),
            now=now,
            deadline_at=None,
        )
        record = advance(record, OpState.RUNNING, now=now)
        self._open[call.call_id] = (record, call.name)
        await self._receipts.write(record)
        if self._emit is not None:  # no deadline: the provider runs it, not us
            self._emit(
                OperationStarted(
                    session=session, op=record.op_id, tool=call.name, stream=stream, deadline=0
                )
            )

    async def ended(self, result: ToolResultPart) -> None:
        """The provider's result arrived: the operation completed (or failed)."""
        opened = self._open.pop(result.call_id, None)
        if opened is None:
            return
        record = opened[0]
        state = OpState.FAILED if result.is_error else OpState.COMPLETED
        outcome = OutcomeCode.CAPABILITY_ERROR if result.is_error else OutcomeCode.OK
        record = advance(record, state, now=self._clock.now(), outcome=outcome)
        await self._receipts.write(record)
        self._receipts.receipt_event(record, result.name)

    async def cut(self, stream: str) -> None:
        """OP-7: the stream ended before these results: nobody can confirm they stopped.

        Each is held by the overlap guard before any write, so a receipt the store refuses
        (it stays open: ``indeterminate`` at the next startup) is held in this process too.

        Raises:
            WriteFailed: A receipt could not be written (the others were tried all the same).
        """
        closed = []
        for call_id, (record, tool) in list(self._open.items()):
            if record.stream != stream:
                continue
            del self._open[call_id]
            ended = advance(
                record,
                OpState.INDETERMINATE,
                now=self._clock.now(),
                outcome=OutcomeCode.STREAM_FAILURE,
                acknowledged=False,
                explanation="provider-executed; the stream ended before its result, "
                "termination not confirmed",
            )
            self._guard.hold(ended)
            closed.append((ended, tool))
        failed: WriteFailed | None = None
        for ended, tool in closed:
            try:
                await self._receipts.write(ended)
            except WriteFailed as error:
                failed = failed or error
                continue
            self._receipts.receipt_event(ended, tool)
        if failed is not None:
            raise failed
