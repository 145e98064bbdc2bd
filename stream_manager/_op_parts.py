"""The pieces an operation is made of (see ``_operations`` for how they move).

The ledger port, the overlap policy, one-shot flags, the stream's worker task and the state of
an operation in flight.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import msgspec

from persistence import OperationRecord, OpState, ReceiptQuery
from stream_manager._op_states import CancelWhy
from stream_manager._parts import ToolCallPart, ToolResultPart
from stream_manager.clock import Timer
from stream_manager.ports import Tool

_encoder = msgspec.json.Encoder()

Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], object]


class Ledger(Protocol):
    """Where receipts go: a ``persistence.Store`` is one."""

    async def put_operation(self, record: OperationRecord) -> None:
        """Write a receipt durably (upsert by op id)."""
        ...

    async def put_operations(self, records: Sequence[OperationRecord]) -> None:
        """Write receipts durably, in one transaction (upsert by op id)."""
        ...

    async def receipts(
        self,
        session: str | None = None,
        *,
        states: frozenset[OpState] | None = None,
        recent: int | None = None,
    ) -> ReceiptQuery:
        """Receipts, open ones first."""
        ...


class MemoryLedger:
    """A ledger in memory, for a StreamManager used without a store."""

    def __init__(self) -> None:
        self.records: dict[str, OperationRecord] = {}

    async def put_operation(self, record: OperationRecord) -> None:
        """Keep the receipt."""
        self.records[record.op_id] = record

    async def put_operations(self, records: Sequence[OperationRecord]) -> None:
        """Keep the receipts."""
        for record in records:
            self.records[record.op_id] = record

    async def receipts(
        self,
        session: str | None = None,
        *,
        states: frozenset[OpState] | None = None,
        recent: int | None = None,
    ) -> ReceiptQuery:
        """Every receipt kept (filters applied)."""
        del recent
        return ReceiptQuery(
            records=tuple(
                r
                for r in self.records.values()
                if (session is None or r.session == session)
                and (states is None or r.state in states)
            )
        )


class OverlapPolicy(enum.StrEnum):
    """What a call meets while an earlier call is indeterminate (OP-9)."""

    #: Refuse a call on the same capability and target (the default).
    BLOCK = "block"
    #: Run it, noting the earlier operation in the log.
    WARN = "warn"
    #: Refuse any call in the session while one of its operations is indeterminate.
    SESSION = "session"


def operation_id(stream: str, step: int, index: int) -> str:
    """The id of the ``index``-th client call of ``step`` in ``stream`` (position, not luck)."""
    return f"{stream}/{step}/{index}"


def failed_result(call: ToolCallPart, error: str, **extra: object) -> ToolResultPart:
    """A structured failed result for ``call``: the model sees why, the loop goes on."""
    return ToolResultPart(
        call_id=call.call_id, name=call.name, output={"error": error, **extra}, is_error=True
    )


class Flag:
    """A one-shot event on the running asyncio loop, far cheaper than ``anyio.Event``.

    The hot path makes one per tool call; ``anyio.Event`` costs several µs to create (a backend
    lookup), a bare future under one. turnkeeper runs on asyncio (aiosqlite needs it), and anyio's
    cancel scopes cancel a task waiting on a future like any other await.
    """

    __slots__ = ("_future", "_set")

    def __init__(self) -> None:
        self._set = False
        self._future: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if self._set:
            return
        if self._future is None or self._future.done():
            self._future = asyncio.get_running_loop().create_future()
        await self._future


class Worker:
    """A stream's task that runs its tool executes one after another (SM-6).

    Starting a task per call costs more than the rest of the call's bookkeeping; a worker is
    started once per stream. When a call it runs ignores its cancellation, the worker is retired
    (it finishes that call whenever the tool lets it, then exits) and the next call gets a new
    worker, so a tool that never stops holds nothing but its own task.
    """

    __slots__ = ("current", "pending", "retired", "wake")

    def __init__(self) -> None:
        self.pending: deque[Op] = deque()
        self.wake = Flag()
        self.current: Op | None = None
        self.retired = False

    def submit(self, op: Op) -> None:
        self.pending.append(op)
        self.wake.set()

    def retire(self) -> None:
        self.retired = True
        self.wake.set()

    async def run(self, execute: Callable[[Op], Coroutine[Any, Any, None]]) -> None:
        while not self.retired:
            if not self.pending:
                self.wake = Flag()
                await self.wake.wait()
                continue
            op = self.pending.popleft()
            self.current = op
            try:
                await execute(op)
            finally:
                self.current = None


@dataclass(eq=False)
class Op:
    """One operation in flight (shell state)."""

    record: OperationRecord
    call: ToolCallPart
    tool: Tool | None
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    #: Set when the loop may go on: the execute ended, a completion was recorded, a deadline.
    settled: Flag = field(default_factory=Flag)
    #: Made on the cancel path only (events are not free): set when the execute ended or the
    #: grace interval ran out; and set when the execute ended, whenever that is.
    finished: anyio.Event | None = None
    ended: anyio.Event | None = None
    result: ToolResultPart | None = None
    recorded: ToolResultPart | None = None
    raised: bool = False
    unconfirmed: bool = False
    done: bool = False
    #: Cancellation was requested (a deadline, a stop, a person), and why.
    cancelling: bool = False
    why: CancelWhy = CancelWhy.USER
    timers: list[Timer] = field(default_factory=list)

    def on_deadline(self) -> None:
        self.settled.set()

    def on_recorded(self, result: ToolResultPart) -> None:
        if self.recorded is None and not self.done:
            self.recorded = result
            self.settled.set()

    def on_grace_over(self) -> None:
        if self.finished is not None:
            self.finished.set()

    def watch_ending(self) -> tuple[anyio.Event, anyio.Event]:
        """The cancel path's events, made now; already set when the execute has ended."""
        if self.finished is None or self.ended is None:
            self.finished, self.ended = anyio.Event(), anyio.Event()
            if self.done:
                self.finished.set()
                self.ended.set()
        return self.finished, self.ended

    def stop_timers(self) -> None:
        for timer in self.timers:
            timer.cancel()
        self.timers.clear()


def checked_result(call: ToolCallPart, result: object) -> ToolResultPart:
    if not isinstance(result, ToolResultPart):
        return failed_result(call, f"tool returned {type(result).__name__}, not a tool result")
    try:
        _encoder.encode(result.output)
    except (TypeError, msgspec.EncodeError) as error:
        return failed_result(call, f"tool result is not serialisable: {error}")
    if result.call_id != call.call_id or result.name != call.name:
        return msgspec.structs.replace(result, call_id=call.call_id, name=call.name)
    return result
