"""Tool calls as operations: an id from the call's position and a wrapper that owns the call.

Every client tool call runs through :meth:`OperationRunner.run`, which

* derives the operation id from the call's position (stream, step, call index), never from
  randomness, so a replayed stream reaches the same ids;
* reports ``op-start`` with the operation's absolute deadline before the tool starts;
* runs the tool inside a cancel scope it owns, so a stop cancels exactly that call;
* turns anything the tool does wrong (raising, an unknown tool, a result that cannot be
  serialized) into a failed tool result, never a crashed loop.

The durable lifecycle (deadline enforcement, cancellation acknowledgement, receipts) is the
Operations issue's; it slots in here without touching the loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import msgspec

from stream_manager._events import OperationStarted, StreamEvent
from stream_manager._parts import ToolCallPart, ToolResultPart
from stream_manager.ports import Clock, Tool, ToolContext

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

_encoder = msgspec.json.Encoder()


def operation_id(stream: str, step: int, index: int) -> str:
    """The id of the ``index``-th client call of ``step`` in ``stream`` (position, not luck)."""
    return f"{stream}/{step}/{index}"


def failed_result(call: ToolCallPart, error: str) -> ToolResultPart:
    """A structured failed result for ``call``: the model sees why, the loop goes on."""
    return ToolResultPart(
        call_id=call.call_id, name=call.name, output={"error": error}, is_error=True
    )


class OperationRunner:
    """Runs one client tool call as an operation."""

    __slots__ = ("_clock", "_deadline_s", "_emit", "_tools")

    def __init__(
        self,
        *,
        tools: Mapping[str, Tool],
        clock: Clock,
        default_deadline_s: float,
        emit: Callable[[StreamEvent], None] | None,
    ) -> None:
        self._tools = tools
        self._clock = clock
        self._deadline_s = default_deadline_s
        self._emit = emit

    async def run(
        self, *, session: str, stream: str, step: int, index: int, call: ToolCallPart
    ) -> ToolResultPart:
        """Execute ``call`` and return its result (a failed one when the tool misbehaves)."""
        op_id = operation_id(stream, step, index)
        deadline_at = self._clock.now() + self._deadline_s
        if self._emit is not None:
            self._emit(
                OperationStarted(
                    session=session,
                    op=op_id,
                    tool=call.name,
                    stream=stream,
                    deadline=round(deadline_at * 1000),
                )
            )
        tool = self._tools.get(call.name)
        if tool is None:
            return failed_result(call, f"unknown tool {call.name!r}")
        context = ToolContext(session=session, stream=stream, op_id=op_id, deadline_at=deadline_at)
        with anyio.CancelScope():
            try:
                result = await tool.execute(call, context)
            except Exception as error:  # a tool that raises is a failed result (issue 3)
                return failed_result(call, f"{type(error).__name__}: {error}")
        return _checked(call, result)


def _checked(call: ToolCallPart, result: object) -> ToolResultPart:
    if not isinstance(result, ToolResultPart):
        return failed_result(call, f"tool returned {type(result).__name__}, not a tool result")
    try:
        _encoder.encode(result.output)
    except (TypeError, msgspec.EncodeError) as error:
        return failed_result(call, f"tool result is not serialisable: {error}")
    if result.call_id != call.call_id or result.name != call.name:
        return msgspec.structs.replace(result, call_id=call.call_id, name=call.name)
    return result
