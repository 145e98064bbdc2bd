"""The MCP tool adapter against a real MCP server over stdio (OP-3's nested layer).

``tests/mcp/server.py`` is started as a subprocess with this interpreter. Synchronisation is by
the server's blocking helper tools (``wait_started``, ``wait_cancelled``), never by sleeping;
every test is bounded with ``anyio.fail_after`` because it waits on a real process.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from persistence import UsageError
from stream_manager import ToolCallPart, ToolResultPart
from stream_manager.errors import TerminationUnconfirmed, ToolTransportLost, ToolUnavailable
from stream_manager.mcp import McpTool, McpUnavailable, stdio_tools
from stream_manager.ports import ToolContext, ToolKind

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

SERVER = str(Path(__file__).with_name("server.py"))
#: The confirmation bound where a test waits it out (nothing will confirm), real seconds.
CONFIRM_S = 0.5
#: The bound where confirmation is expected: generous, as a loaded machine may answer slowly.
PATIENT_S = 5.0
#: Bound on one test's real waiting (process start, round trips, shutdown).
BOUND_S = 15.0
CONTEXT = ToolContext(session="ws", stream="s1", op_id="s1/1/0", deadline_at=0.0)


def tool_call(name: str, **args: object) -> ToolCallPart:
    return ToolCallPart(call_id=f"call-{name}", name=name, args=args)


async def run(tool: McpTool, **args: object) -> ToolResultPart:
    return await tool.execute(tool_call(tool.name, **args), CONTEXT)


def structured(result: ToolResultPart) -> Mapping[str, Any]:
    assert not result.is_error, result.output
    assert isinstance(result.output, Mapping)
    return result.output


@asynccontextmanager
async def server(
    *flags: str, confirm_timeout_s: float = PATIENT_S
) -> AsyncIterator[dict[str, McpTool]]:
    async with stdio_tools(
        sys.executable, [SERVER, *flags], confirm_timeout_s=confirm_timeout_s
    ) as tools:
        yield tools


async def started_ids(tools: Mapping[str, McpTool], count: int) -> list[object]:
    """The request ids of the first ``count`` long-running calls, once the server started them."""
    started = structured(await run(tools["wait_started"], count=count))["started"]
    return [entry["request_id"] for entry in started]


async def cancels(tools: Mapping[str, McpTool]) -> list[Mapping[str, object]]:
    recorded: list[Mapping[str, object]] = structured(await run(tools["cancels"]))["cancels"]
    return recorded


class Cancelled:
    """How one cancelled ``execute`` ended."""

    def __init__(self) -> None:
        self.acknowledged = False
        self.unconfirmed: TerminationUnconfirmed | None = None
        self.result: ToolResultPart | None = None
        self.cancelled_at = 0.0
        self.ended_at = 0.0

    @property
    def took(self) -> float:
        return self.ended_at - self.cancelled_at


async def cancel_when_started(
    tools: Mapping[str, McpTool],
    tool: McpTool,
    args: Mapping[str, object] | None = None,
    *,
    after_cancel: Callable[[object], Awaitable[None]] | None = None,
) -> tuple[Cancelled, object]:
    """Run ``tool`` (the server's first long-running call) and cancel it once it started.

    ``after_cancel(request_id)`` runs right after the cancel, while the adapter waits. Returns
    how the call ended and its request id as the server saw it.
    """
    outcome = Cancelled()
    scope = anyio.CancelScope()
    request_ids: list[object] = []

    async def call() -> None:
        with scope:
            try:
                outcome.result = await run(tool, **(args or {}))
            except TerminationUnconfirmed as error:
                outcome.unconfirmed = error
        outcome.acknowledged = scope.cancelled_caught
        outcome.ended_at = anyio.current_time()

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        request_ids.extend(await started_ids(tools, 1))
        outcome.cancelled_at = anyio.current_time()
        scope.cancel()
        if after_cancel is not None:
            await after_cancel(request_ids[-1])
    return outcome, request_ids[-1]


# ---------------------------------------------------------------- results


async def test_mcp_tool_round_trip_returns_text_or_structured_output() -> None:
    with anyio.fail_after(BOUND_S):
        async with server() as tools:
            assert {"echo", "structured", "hang", "cooperative", "ignoring"} <= set(tools)
            echo = tools["echo"]
            assert (echo.name, echo.remote_name, echo.kind) == ("echo", "echo", ToolKind.CLIENT)

            # The definition is the server's tools/list entry: its description and input schema.
            assert echo.definition is not None
            assert echo.definition.description == "Say the text back."
            assert echo.definition.parameters["properties"] == {"text": {"type": "string"}}
            assert tools["pid"].definition is not None
            assert tools["pid"].definition.description == ""

            result = await echo.execute(tool_call("echo", text="hello"), CONTEXT)
            assert result == ToolResultPart(call_id="call-echo", name="echo", output="hello")

            result = await run(tools["structured"], value=21)
            assert result.output == {"value": 21, "double": 42}
            assert not result.is_error


async def test_mcp_tool_errors_are_failed_results_never_raised() -> None:
    with anyio.fail_after(BOUND_S):
        async with server() as tools:
            broken = await run(tools["broken"])
            assert broken.is_error
            assert broken.output == {"error": "broken on purpose"}

            # A protocol error (the server rejects the call): a failed result naming the tool.
            session = tools["echo"].session
            missing = McpTool(session, "lookup", remote_name="no_such_tool")
            result = await run(missing)
            assert result.is_error
            assert result.output == {
                "error": "MCP tools/call 'no_such_tool' failed: unknown tool 'no_such_tool' "
                "(JSON-RPC error -32602)"
            }

    # After the session closed the call is never sent: unavailable, not the server's answer.
    with pytest.raises(ToolUnavailable, match="MCP tools/call 'echo' was not sent"):
        await run(McpTool(session, "echo"), text="late")


async def test_mcp_stdio_tools_rejects_unknown_names_and_bad_servers() -> None:
    with anyio.fail_after(BOUND_S):
        with pytest.raises(UsageError, match="does not list the tool"):
            async with stdio_tools(sys.executable, [SERVER], names=["echo", "nope"]):
                pass  # pragma: no cover
        with pytest.raises(McpUnavailable):
            # A process that exits at once: the session closes before it initializes.
            async with stdio_tools(sys.executable, ["-c", "pass"]):
                pass  # pragma: no cover
    with pytest.raises(UsageError, match="confirm_timeout_s"):
        McpTool(None, "x", confirm_timeout_s=0)  # type: ignore[arg-type]


# ---------------------------------------------------------------- OP-3: cancellation


@pytest.mark.parametrize(
    ("name", "args"), [("hang", {}), ("cooperative", {"seconds": 60.0})], ids=["hang", "coop"]
)
async def test_op3_mcp_cancel_sends_notification_and_acknowledges(
    name: str, args: dict[str, object]
) -> None:
    with anyio.fail_after(BOUND_S):
        async with server() as tools:
            outcome, request_id = await cancel_when_started(tools, tools[name], args)

            # The cancellation propagated: termination acknowledged, no result, no error.
            assert outcome.acknowledged
            assert outcome.unconfirmed is None
            assert outcome.result is None
            # Confirmed by the server's answer, not by waiting out the bound.
            assert outcome.took < PATIENT_S
            # The server received notifications/cancelled for that request, under the
            # adapter's own request id, and stopped the handler.
            assert isinstance(request_id, str)
            assert request_id.startswith("turnkeeper-")
            assert await cancels(tools) == [{"tool": name, "request_id": request_id}]
            # The session is still usable.
            assert (await run(tools["echo"], text="after")).output == "after"


async def test_op3_mcp_ignored_cancel_is_unconfirmed() -> None:
    with anyio.fail_after(BOUND_S):
        async with server(confirm_timeout_s=CONFIRM_S) as tools:
            pid = int(str((await run(tools["pid"])).output))
            outcome, request_id = await cancel_when_started(
                tools, tools["ignoring"], {"seconds": 30.0}
            )

            assert outcome.unconfirmed is not None
            assert not outcome.acknowledged
            assert outcome.result is None
            message = str(outcome.unconfirmed)
            assert "'ignoring'" in message
            assert repr(request_id) in message
            assert "termination not confirmed" in message
            assert CONFIRM_S * 0.9 <= outcome.took < CONFIRM_S + 2.0
            # The cancel did reach the server, which chose to ignore it.
            assert await cancels(tools) == [{"tool": "ignoring", "request_id": request_id}]
    # Closing the tools stops the server even while it still works on the ignored call.
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_op3_mcp_unanswered_cancel_on_a_stock_server_is_unconfirmed() -> None:
    """The SDK's stdio server stops the handler but never answers: nothing confirms it."""
    with anyio.fail_after(BOUND_S):
        async with server("--silent", confirm_timeout_s=CONFIRM_S) as tools:
            outcome, request_id = await cancel_when_started(tools, tools["hang"])

            assert outcome.unconfirmed is not None
            assert not outcome.acknowledged
            assert CONFIRM_S * 0.9 <= outcome.took < CONFIRM_S + 2.0
            assert await cancels(tools) == [{"tool": "hang", "request_id": request_id}]


async def test_op3_mcp_cancel_confirmed_by_session_close() -> None:
    """The server process dies during the confirmation wait: the session closing confirms."""
    with anyio.fail_after(BOUND_S):
        async with server(confirm_timeout_s=BOUND_S) as tools:

            async def kill_server(request_id: object) -> None:
                # The server saw the cancel and ignores it; then the whole process ends.
                await run(tools["wait_cancelled"], request_id=str(request_id))
                with pytest.raises(ToolTransportLost):
                    await run(tools["exit"])  # the process dies before it answers

            outcome, _ = await cancel_when_started(
                tools, tools["ignoring"], {"seconds": 30.0}, after_cancel=kill_server
            )

            assert outcome.acknowledged
            assert outcome.unconfirmed is None
            assert outcome.took < BOUND_S


async def test_op3_mcp_cancel_before_the_request_is_sent_acknowledges_without_a_call() -> None:
    with anyio.fail_after(BOUND_S):
        async with server() as tools:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await run(tools["hang"])
            assert scope.cancelled_caught
            # Nothing reached the server: no call started, nothing to cancel.
            assert await started_ids(tools, 0) == []
            assert (await run(tools["echo"], text="still here")).output == "still here"


async def test_op3_mcp_cancel_on_a_plain_session_is_unconfirmed() -> None:
    """A session not built by ``client_session``: the SDK sends the cancel, nothing confirms."""
    params = StdioServerParameters(command=sys.executable, args=[SERVER])
    with anyio.fail_after(BOUND_S):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = {
                name: McpTool(session, name, confirm_timeout_s=CONFIRM_S)
                for name in ("hang", "wait_started", "wait_cancelled", "cancels")
            }

            outcome, request_id = await cancel_when_started(tools, tools["hang"])

            assert outcome.unconfirmed is not None
            assert "client_session" in str(outcome.unconfirmed)
            # The SDK's own courtesy notifications/cancelled reached the server (its own id).
            assert isinstance(request_id, int)
            await run(tools["wait_cancelled"], request_id=str(request_id))
            assert await cancels(tools) == [{"tool": "hang", "request_id": request_id}]


async def test_mcp_stdio_tools_close_leaves_no_process() -> None:
    with anyio.fail_after(BOUND_S):
        async with server() as tools:
            pid = int(str((await run(tools["pid"])).output))
            os.kill(pid, 0)  # running
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_mcp_sdk_log_records_carry_no_credential(caplog: pytest.LogCaptureFixture) -> None:
    """Under a DEBUG root the SDK's DEBUG records stay off, and what it logs at WARNING and up
    passes the redactor. Its record of a server line that is no JSON-RPC message (with a
    traceback quoting the line) is dropped: the adapter logs such a line itself, in one line
    (``test_mcp_real_servers.py``). ``_parse_line`` is the pinned SDK's stdio reader, called
    directly because its server guards stdout against stray lines."""
    from mcp.client.stdio import _parse_line

    caplog.set_level(logging.DEBUG)
    with anyio.fail_after(BOUND_S):
        async with server() as tools:
            assert (await run(tools["echo"], text="x token=FAKEmcp1111")).output
    assert isinstance(_parse_line("garbled token=FAKEmcp0000 end"), ValueError)
    sdk = [r for r in caplog.records if r.name == "client" or r.name.startswith("mcp")]
    assert not any(r.name == "mcp.client.stdio" and r.exc_text for r in sdk), sdk
    assert all(r.levelno >= logging.WARNING for r in sdk), [(r.name, r.levelname) for r in sdk]
    for record in sdk:
        logged = f"{record.msg} {record.args} {record.exc_text} {record.stack_info}"
        assert "FAKEmcp" not in logged, logged
