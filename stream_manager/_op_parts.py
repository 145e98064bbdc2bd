"""The pieces an operation is made of (see ``_operations`` for how they move).

One-shot flags, the stream's worker task and the shell of an operation in flight (its
lifecycle is ``_op_life``'s). The overlap guard is ``_op_guard``'s.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import anyio
import msgspec

from persistence import OperationRecord
from stream_manager._op_answers import failed_result
from stream_manager._op_life import Effect, OpLife
from stream_manager._parts import ToolCallPart, ToolResultPart
from stream_manager.clock import Timer
from stream_manager.ports import Tool

_encoder = msgspec.json.Encoder()

Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], object]


def operation_id(stream: str, step: int, index: int) -> str:
    """The id of the ``index``-th client call of ``step`` in ``stream`` (position, not luck)."""
    return f"{stream}/{step}/{index}"


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

    def clear(self) -> None:
        """Unset it (a waiter of the old future was woken already)."""
        if self._set:
            self._set = False
            self._future = None

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


class Op:
    """One call in flight (shell state): its lifecycle, the effects still to perform, its task.

    Inputs reach :attr:`life` from timers, the execute's task and a person's cancel; their
    effects queue here, in order, and the call's driver (the runner) performs them.
    """

    __slots__ = (
        "call",
        "dispatched",
        "effects",
        "exit_flag",
        "given",
        "given_at",
        "life",
        "overlaps",
        "scope",
        "timers",
        "tool",
        "wake",
    )

    def __init__(self, life: OpLife, tool: Tool | None) -> None:
        self.life = life
        self.call = life.call
        self.tool = tool
        self.scope = anyio.CancelScope()
        self.effects: deque[Effect] = deque()
        #: Set when effects were queued (the driver waits on a fresh one each time).
        self.wake = Flag()
        #: Set when the execute has ended: made for a lingering operation only (it waits on it).
        self.exit_flag: Flag | None = None
        #: The model's result, once given.
        self.given: ToolResultPart | None = None
        #: Where its result stands in the stream's parts, once appended (B4).
        self.given_at: int | None = None
        self.timers: list[Timer] = []
        #: Its execute was handed to a worker (it may be running).
        self.dispatched = False
        #: The indeterminate operation it runs beside (overlap: warn), if any.
        self.overlaps: str | None = None

    @property
    def record(self) -> OperationRecord:
        """The receipt as last decided."""
        return self.life.record

    def feed(self, effects: Sequence[Effect]) -> None:
        """Queue what an input decided, and wake the driver."""
        if effects:
            self.effects.extend(effects)
            self.wake.set()

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
