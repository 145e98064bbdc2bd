"""A real MCP server for the MCP tool adapter's tests, served over stdio.

Run as ``python tests/mcp/server.py [--silent]`` (the tests use the venv's ``sys.executable``).
It is the ``mcp`` package's own low-level ``Server`` driven by its own ``stdio_server``; the
tools model the three ways a server can treat a cancelled call:

* ``hang`` awaits forever and honours cancellation (the handler is interrupted);
* ``cooperative(seconds)`` sleeps, but stops promptly when cancelled;
* ``ignoring(seconds)`` notes the cancel and then shields itself, working on for ``seconds``;
* ``progress(steps)`` sends ``steps`` progress notifications, then hangs like ``hang``.

The SDK's stdio server never answers a cancelled request (its dispatcher settles it silently,
as the MCP spec recommends); only its 2025-era streamable-HTTP transport ends a cancelled
request with a ``REQUEST_CANCELLED`` (-32800) error once the handler has settled. By default
this server does the same over stdio through the dispatcher's public per-message hook
(``ServerMessageMetadata.on_request_unanswered``), so a handler that stopped is confirmed to the
client; ``--silent`` serves the stock stdio behaviour (a cancelled request is never answered).

Helper tools expose the server's view to the tests without sleeps: ``wait_started(count)``
blocks until ``count`` long-running calls have started and returns them with their JSON-RPC
request ids, ``wait_cancelled(request_id)`` blocks until that call observed its cancellation,
``cancels()`` lists every observed cancellation, ``pid()`` returns the process id and
``exit()`` ends the process on the spot (calls in flight never get an answer).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any, cast

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata, SessionMessage

#: JSON-RPC "request cancelled", as the SDK's streamable-HTTP transport answers a cancelled call.
REQUEST_CANCELLED = -32800
#: The calls whose start and cancellation the server records.
LONG_RUNNING = frozenset({"hang", "cooperative", "ignoring", "progress"})

_Incoming = SessionMessage | Exception
# ``stdio_server`` carries no annotations; this is the shape it yields (two memory streams).
_stdio_server = cast(
    "Callable[[], AbstractAsyncContextManager[tuple[MemoryObjectReceiveStream[_Incoming], MemoryObjectSendStream[SessionMessage]]]]",  # noqa: E501
    stdio_server,
)


class _State:
    """What the server saw, readable through the helper tools."""

    def __init__(self) -> None:
        self.started: list[dict[str, object]] = []
        self.cancels: list[dict[str, object]] = []
        self.changed = anyio.Event()

    def note(self, records: list[dict[str, object]], tool: str, request_id: object) -> None:
        records.append({"tool": tool, "request_id": request_id})
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_for(self, ready: Callable[[], bool]) -> None:
        while not ready():
            await self.changed.wait()


STATE = _State()


def _text(text: str) -> list[types.ContentBlock]:
    return [types.TextContent(type="text", text=text)]


def _schema(**properties: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
        "required": list(properties),
    }


TOOLS = [
    types.Tool(name="echo", description="Say the text back.", input_schema=_schema(text="string")),
    types.Tool(name="structured", input_schema=_schema(value="integer")),
    types.Tool(name="broken", input_schema=_schema()),
    types.Tool(name="hang", input_schema=_schema()),
    types.Tool(name="cooperative", input_schema=_schema(seconds="number")),
    types.Tool(name="ignoring", input_schema=_schema(seconds="number")),
    types.Tool(name="progress", input_schema=_schema(steps="integer")),
    types.Tool(name="wait_started", input_schema=_schema(count="integer")),
    types.Tool(name="wait_cancelled", input_schema=_schema(request_id="string")),
    types.Tool(name="cancels", input_schema=_schema()),
    types.Tool(name="pid", input_schema=_schema()),
    types.Tool(name="exit", input_schema=_schema()),
]


async def list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def _long_running(name: str, args: Mapping[str, Any], request_id: object) -> str:
    """Run one of the cancellable tools; record its start and any cancellation it sees."""
    STATE.note(STATE.started, name, request_id)
    try:
        if name == "cooperative":
            await anyio.sleep(float(args["seconds"]))
            return "slept"
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        STATE.note(STATE.cancels, name, request_id)
        if name == "ignoring":
            # Ignore the cancel: keep working, shielded, and only then unwind.
            with anyio.CancelScope(shield=True):
                await anyio.sleep(float(args["seconds"]))
        raise
    raise AssertionError("unreachable")  # pragma: no cover


async def _report_progress(ctx: ServerRequestContext[Any, Any], steps: int) -> None:
    token = (ctx.meta or {}).get("progress_token")
    assert token is not None, "the client asked for no progress"
    for done in range(1, steps + 1):
        message = f"step {done} of {steps}"
        await ctx.session.send_progress_notification(
            token, done, steps, message, related_request_id=str(ctx.request_id)
        )


async def call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    args: Mapping[str, Any] = params.arguments or {}
    name = params.name
    if name == "progress":
        await _report_progress(ctx, int(args["steps"]))
    if name in LONG_RUNNING:
        return types.CallToolResult(content=_text(await _long_running(name, args, ctx.request_id)))
    if name == "echo":
        return types.CallToolResult(content=_text(str(args["text"])))
    if name == "structured":
        value = int(args["value"])
        return types.CallToolResult(
            content=_text(f"value {value}"),
            structured_content={"value": value, "double": 2 * value},
        )
    if name == "broken":
        # What MCPServer does with a raising tool: a tool error result, not a protocol error.
        try:
            raise RuntimeError("broken on purpose")
        except RuntimeError as error:
            return types.CallToolResult(content=_text(str(error)), is_error=True)
    if name == "wait_started":
        count = int(args["count"])
        await STATE.wait_for(lambda: len(STATE.started) >= count)
        return types.CallToolResult(content=[], structured_content={"started": STATE.started})
    if name == "wait_cancelled":
        wanted = str(args["request_id"])
        await STATE.wait_for(lambda: any(str(c["request_id"]) == wanted for c in STATE.cancels))
        return types.CallToolResult(content=[], structured_content={"cancels": STATE.cancels})
    if name == "cancels":
        return types.CallToolResult(content=[], structured_content={"cancels": STATE.cancels})
    if name == "pid":
        return types.CallToolResult(content=_text(str(os.getpid())))
    if name == "exit":
        os._exit(0)  # the process dies with calls in flight: the client's session closes
    raise MCPError(code=types.INVALID_PARAMS, message=f"unknown tool {name!r}")


async def _answer_cancelled(
    write: MemoryObjectSendStream[SessionMessage], request_id: types.RequestId
) -> None:
    error = types.ErrorData(code=REQUEST_CANCELLED, message="Request cancelled")
    await write.send(SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)))


async def _confirming_relay(
    source: MemoryObjectReceiveStream[_Incoming],
    sink: MemoryObjectSendStream[_Incoming],
    write: MemoryObjectSendStream[SessionMessage],
) -> None:
    """Attach the unanswered-request hook to every incoming request (what HTTP does)."""
    async with sink:
        async for item in source:
            if isinstance(item, SessionMessage) and isinstance(item.message, types.JSONRPCRequest):
                hook: Callable[[], Awaitable[None]] = partial(
                    _answer_cancelled, write, item.message.id
                )
                item = SessionMessage(
                    item.message, ServerMessageMetadata(on_request_unanswered=hook)
                )
            await sink.send(item)


async def main(*, silent: bool) -> None:
    server: Server[Any] = Server(
        "turnkeeper-test-server", on_list_tools=list_tools, on_call_tool=call_tool
    )
    options = server.create_initialization_options()
    async with _stdio_server() as (read, write):
        if silent:
            await server.run(read, write, options)
            return
        sink, relayed = anyio.create_memory_object_stream[_Incoming](0)
        async with anyio.create_task_group() as tg, relayed:
            tg.start_soon(_confirming_relay, read, sink, write)
            await server.run(relayed, write, options)
            tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(partial(main, silent="--silent" in sys.argv[1:]))
