"""Receipts: writing them, their events, and provider-executed calls (``docs/operations.md``).

:class:`ReceiptWriter` is the half of :class:`~stream_manager._operations.OperationRunner`
that writes receipts and reports them (``persisted``, ``receipt``), and that gives
provider-executed calls their receipts: their result completes them; a stream cut before it
arrives leaves them ``indeterminate`` (OP-7).
"""

from __future__ import annotations

from collections.abc import Callable

from persistence import OperationRecord, OpState
from stream_manager._events import OperationStarted, Persisted, ReceiptWritten, StreamEvent
from stream_manager._op_parts import Ledger
from stream_manager._op_states import OutcomeCode, advance, requested, target_digest
from stream_manager._parts import ToolCallPart, ToolResultPart
from stream_manager.ports import Clock, ToolKind


class ReceiptWriter:
    """Writes receipts and reports them; receipts of provider-executed calls."""

    ledger: Ledger
    _emit: Callable[[StreamEvent], None] | None
    _clock: Clock
    _salt: str
    _provider: dict[str, OperationRecord]
    _indeterminate: dict[tuple[str, str, str], str]

    # ------------------------------------------------------------ provider-executed calls

    async def provider_started(
        self, *, session: str, stream: str, step: int, index: int, call: ToolCallPart
    ) -> None:
        """A provider-executed call began inside the model's response: it runs already."""
        capability = f"{ToolKind.PROVIDER.value}:{call.name}"
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
        self._provider[call.call_id] = record
        await self._write(record)
        if self._emit is not None:  # no deadline: the provider runs it, not us
            self._emit(
                OperationStarted(
                    session=session, op=record.op_id, tool=call.name, stream=stream, deadline=0
                )
            )

    async def provider_ended(self, result: ToolResultPart) -> None:
        """The provider's result arrived: the operation completed (or failed)."""
        record = self._provider.pop(result.call_id, None)
        if record is None:
            return
        state = OpState.FAILED if result.is_error else OpState.COMPLETED
        outcome = OutcomeCode.CAPABILITY_ERROR if result.is_error else OutcomeCode.OK
        record = advance(record, state, now=self._clock.now(), outcome=outcome)
        await self._write(record)
        self._receipt_event(record, result.name)

    async def provider_cut(self, stream: str) -> None:
        """OP-7: the stream ended before these results: nobody can confirm they stopped."""
        for call_id, record in list(self._provider.items()):
            if record.stream != stream:
                continue
            del self._provider[call_id]
            closed = advance(
                record,
                OpState.INDETERMINATE,
                now=self._clock.now(),
                outcome=OutcomeCode.STREAM_FAILURE,
                acknowledged=False,
                explanation="provider-executed; the stream ended before its result, "
                "termination not confirmed",
            )
            self._indeterminate[(closed.session, closed.capability, closed.target)] = closed.op_id
            await self._write(closed)
            self._receipt_event(closed, closed.capability.split(":", 1)[1])

    # ------------------------------------------------------------ writes and events

    async def _write(self, record: OperationRecord) -> None:
        await self.ledger.put_operation(record)
        if self._emit is not None:
            self._emit(Persisted(session=record.session, what="receipt", id=record.op_id))

    async def _write_all(self, records: list[OperationRecord]) -> None:
        """Write a step's receipts in one durable write (their events come from the caller)."""
        if len(records) == 1:
            await self.ledger.put_operation(records[0])
        elif records:
            await self.ledger.put_operations(records)

    def _receipt_event(self, record: OperationRecord, tool: str) -> None:
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
