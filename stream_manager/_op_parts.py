"""The pieces an operation is made of (see ``_operations`` for how they move).

The overlap policy and its guard, one-shot flags, the stream's worker task and the state of an
operation in flight. (Receipts go through the ``persistence.Store`` port.)
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

from persistence import OperationRecord
from stream_manager._op_states import CancelWhy
from stream_manager._parts import ToolCallPart, ToolResultPart
from stream_manager.clock import Timer
from stream_manager.ports import Capability, Tool

log = logging.getLogger("turnkeeper.operations")

_encoder = msgspec.json.Encoder()

Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], object]


class OverlapPolicy(enum.StrEnum):
    """What a call meets while an earlier call is indeterminate (OP-9)."""

    #: Refuse a call on the same capability and target (the default).
    BLOCK = "block"
    #: Run it, noting the earlier operation in the log.
    WARN = "warn"
    #: Refuse any call in the session while one of its operations is indeterminate.
    SESSION = "session"


class OverlapGuard:
    """OP-9: the indeterminate operations, and the later calls they block (by policy).

    An operation holds its session's target while it is indeterminate. A target is the
    capability's text and a digest of the arguments (``client:bash#<digest>``), so one target
    means one capability and one set of arguments.
    """

    def __init__(self, policy: OverlapPolicy) -> None:
        self._policy = policy
        #: (session, target) -> the indeterminate operations holding it, first held first
        #: (several after a crash: identical calls of one step were all open).
        self._held: dict[tuple[str, str], dict[str, None]] = {}

    def hold(self, record: OperationRecord) -> None:
        """``record`` is indeterminate: it holds its session's target."""
        self._held.setdefault((record.session, record.target), {})[record.op_id] = None

    def release(self, record: OperationRecord) -> None:
        """``record`` was resolved (late, or by a person): it holds nothing any more."""
        key = (record.session, record.target)
        holders = self._held.get(key)
        if holders is not None:
            holders.pop(record.op_id, None)
            if not holders:
                del self._held[key]

    def blocker(self, op_id: str, session: str, capability: Capability, target: str) -> str | None:
        """The indeterminate operation that refuses call ``op_id``, or ``None``: it may run."""
        if self._policy is OverlapPolicy.SESSION:
            return next(
                (next(iter(ops)) for (s, _), ops in self._held.items() if s == session), None
            )
        holders = self._held.get((session, target))
        blocker = next(iter(holders)) if holders else None
        if blocker is not None and self._policy is OverlapPolicy.WARN:
            log.warning(
                "%s runs although %s, on the same %s target, is indeterminate (overlap: warn)",
                op_id,
                blocker,
                capability.text,
            )
            return None
        return blocker


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
