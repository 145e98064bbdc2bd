"""OP-3 through the layers below a tool: a real MCP server and a subprocess.

``tests/mcp/server.py`` runs as a subprocess of this interpreter. The engine runs on virtual
time that nobody advances here, so its deadline and grace interval never fire: what ends the
operation is the layer below, which confirms (or fails to confirm) in real time. Every test is
bounded with ``anyio.fail_after``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from persistence import OpState
from stream_manager import (
    OutcomeCode,
    ReceiptWritten,
    ToolCallPart,
    ToolContext,
    ToolKind,
    ToolResultPart,
)
from stream_manager._op_states import UNCONFIRMED
from stream_manager.mcp import McpTool, stdio_tools
from tests.operations.support import OpRig, call, op_id, op_rig, step, text

SERVER = str(Path(__file__).parents[1] / "mcp" / "server.py")
BOUND_S = 10.0
CONTEXT = ToolContext(session="probe", stream="probe", op_id="probe", deadline_at=0.0)
OP = op_id(1, 1, 0)


async def helper(tool: McpTool, **args: object) -> Mapping[str, Any]:
    """Call one of the server's helper tools directly (not through the engine)."""
    result = await tool.execute(ToolCallPart(call_id="probe", name=tool.name, args=args), CONTEXT)
    assert not result.is_error, result.output
    assert isinstance(result.output, Mapping)
    return result.output


async def stop_once_started(
    r: OpRig, tools: Mapping[str, McpTool]
) -> tuple[object, float, list[float]]:
    """Send, wait until the server runs the call, stop; return its request id, the stop's
    (real) time and the (real) times receipts were written."""
    receipts_at: list[float] = []
    r.on(
        lambda e: (
            receipts_at.append(anyio.current_time()) if isinstance(e, ReceiptWritten) else None
        )
    )
    r.session().send("go")
    started = (await helper(tools["wait_started"], count=1))["started"]
    stopped_at = anyio.current_time()
    r.session().stop()
    return started[0]["request_id"], stopped_at, receipts_at


async def test_op3_a_stop_reaches_the_mcp_server_and_is_cancelled_only_once_it_confirms() -> None:
    with anyio.fail_after(BOUND_S):
        async with (
            stdio_tools(sys.executable, [SERVER], confirm_timeout_s=5.0) as tools,
            op_rig(
                {"M": [step(call("ignoring", seconds=0.6)), text()]},
                extra_tools={"ignoring": tools["ignoring"]},
            ) as r,
        ):
            request_id, stopped_at, receipts_at = await stop_once_started(r, tools)
            # The server is told (notifications/cancelled for that request id) ...
            await helper(tools["wait_cancelled"], request_id=str(request_id))
            # ... and works on, shielded, for 0.6 s: until it answers, nothing is confirmed.
            waiting = await r.receipt(OP)
            assert waiting.state is OpState.RUNNING
            assert waiting.cancel_requested_at is not None
            await r.engine.wait_idle()

            receipt = await r.receipt(OP)
            assert receipt.state is OpState.CANCELLED
            assert receipt.termination_acknowledged
            assert receipt.outcome_code == OutcomeCode.CANCELLED
            assert receipt.cancel_reason == "user"
            [written] = receipts_at
            assert written - stopped_at >= 0.5  # written after the server's confirmation
            cancels = (await helper(tools["cancels"]))["cancels"]
            assert [(c["tool"], str(c["request_id"])) for c in cancels] == [
                ("ignoring", str(request_id))
            ]


async def test_op3_an_mcp_server_that_never_confirms_leaves_the_call_indeterminate() -> None:
    with anyio.fail_after(BOUND_S):
        async with (
            stdio_tools(sys.executable, [SERVER, "--silent"], confirm_timeout_s=0.5) as tools,
            op_rig({"M": [step(call("hang")), text()]}, extra_tools={"hang": tools["hang"]}) as r,
        ):
            request_id, stopped_at, receipts_at = await stop_once_started(r, tools)
            await r.engine.wait_idle()

            receipt = await r.receipt(OP)
            assert receipt.state is OpState.INDETERMINATE
            assert not receipt.termination_acknowledged
            assert receipt.explanation == UNCONFIRMED
            assert receipt.cancel_acknowledged_at is None
            [written] = receipts_at
            assert written - stopped_at >= 0.4  # the adapter waited for a confirmation
            # The server did get the cancel; it just never answered the request.
            cancels = (await helper(tools["cancels"]))["cancels"]
            assert [str(c["request_id"]) for c in cancels] == [str(request_id)]


@dataclass
class SleepProcess:
    """A tool that runs a child process; cancelled, it kills the child and waits for its exit."""

    name: str = "sleep"
    kind: ToolKind = ToolKind.CLIENT
    process: anyio.abc.Process | None = None
    started: anyio.Event = field(default_factory=anyio.Event)

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        process = await anyio.open_process(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.process = process
        self.started.set()
        try:
            code = await process.wait()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                process.kill()
                await process.wait()  # the acknowledgement: the child is gone
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await process.aclose()
        return ToolResultPart(call_id=call.call_id, name=call.name, output=code)


async def test_op3_a_stop_kills_a_tools_subprocess_and_is_cancelled_once_it_exited() -> None:
    with anyio.fail_after(BOUND_S):
        tool = SleepProcess()
        exit_codes: list[int | None] = []
        async with op_rig({"M": [step(call("sleep")), text()]}, extra_tools={"sleep": tool}) as r:

            def on_receipt(event: object) -> None:
                if isinstance(event, ReceiptWritten):
                    assert tool.process is not None
                    exit_codes.append(tool.process.returncode)

            r.on(on_receipt)
            r.session().send("go")
            await tool.started.wait()
            r.session().stop()
            await r.engine.wait_idle()

            receipt = await r.receipt(OP)
            assert receipt.state is OpState.CANCELLED
            assert receipt.termination_acknowledged
            assert receipt.cancel_reason == "user"
            [code] = exit_codes
            assert code is not None  # the child had exited when the receipt was written
