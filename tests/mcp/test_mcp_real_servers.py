"""The MCP adapter against a real third-party server, through a stdio proxy the tests own.

The server is ``mcp-server-time`` (PyPI, a dev dependency; no network), run by
``tests/mcp/proxy.py``, which relays its stdio and, on command over a Unix socket, holds an
answer, injects bytes or kills the server. ``TURNKEEPER_MCP_SERVER`` (a JSON list: the command)
and ``TURNKEEPER_MCP_TOOL`` / ``TURNKEEPER_MCP_ARGS`` run the same cases against another server
(``make test-mcp``: ``@modelcontextprotocol/server-everything``). Synchronisation is by the
proxy's answers and the supervisor's events, never by sleeping; every test is bounded.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from persistence import OpState
from stream_manager import (
    OpProgress,
    OutcomeCode,
    ScriptedModel,
    ToolCallPart,
    ToolResultPart,
)
from stream_manager.errors import TerminationUnconfirmed, ToolTransportLost, ToolUnavailable
from stream_manager.mcp import McpServer, McpTool, stdio_tools
from stream_manager.ports import ToolContext
from tests.operations.support import DEADLINE_S, call, op_id, op_rig, step, text

PROXY = str(Path(__file__).with_name("proxy.py"))
TEST_SERVER = str(Path(__file__).with_name("server.py"))
SERVER = json.loads(
    os.environ.get("TURNKEEPER_MCP_SERVER")
    or json.dumps([sys.executable, "-m", "mcp_server_time", "--local-timezone", "Asia/Tokyo"])
)
TOOL = os.environ.get("TURNKEEPER_MCP_TOOL", "get_current_time")
ARGS: dict[str, object] = json.loads(
    os.environ.get("TURNKEEPER_MCP_ARGS") or '{"timezone": "America/Lima"}'
)
#: Another tool the server lists (hidden from the list a restarted server offers).
OTHER = os.environ.get("TURNKEEPER_MCP_OTHER_TOOL", "convert_time")
#: The confirmation bound where nothing will confirm (the real server never answers a cancel).
CONFIRM_S = 0.3
BOUND_S = 15.0
CONTEXT = ToolContext(session="ws", stream="s1", op_id="s1/1/0", deadline_at=0.0)
OP = op_id(1, 1, 0)


@dataclass
class Proxied:
    """The tools of one proxied server, and the proxy's control socket."""

    tools: dict[str, McpTool]
    control: Path

    @property
    def tool(self) -> McpTool:
        return self.tools[TOOL]

    @property
    def server(self) -> McpServer:
        server = self.tool.server
        assert server is not None
        return server

    async def command(self, text: str) -> str:
        async with await anyio.connect_unix(str(self.control / "sock")) as sock:
            await sock.send(text.encode() + b"\n")
            answer = b""
            while not answer.endswith(b"\n"):
                answer += await sock.receive()
        return answer.decode().strip()


@asynccontextmanager
async def proxied(command: list[str] | None = None, **options: object) -> AsyncIterator[Proxied]:
    control = Path(tempfile.mkdtemp(prefix="tkmcp-"))  # short: a socket path has a length cap
    settings: dict[str, object] = {"confirm_timeout_s": CONFIRM_S, **options}
    try:
        async with stdio_tools(
            sys.executable,
            [PROXY, str(control), "--", *(command or SERVER)],
            **settings,  # type: ignore[arg-type]
        ) as tools:
            yield Proxied(tools, control)
    finally:
        shutil.rmtree(control, ignore_errors=True)


def tool_call(name: str, **args: object) -> ToolCallPart:
    return ToolCallPart(call_id=f"call-{name}", name=name, args=args)


async def run(tool: McpTool, args: Mapping[str, object] = ARGS) -> ToolResultPart:
    return await tool.execute(tool_call(tool.name, **args), CONTEXT)


def answered(result: ToolResultPart) -> None:
    assert not result.is_error, result.output
    assert "Lima" in json.dumps(result.output), result.output  # the arguments' echo


@dataclass
class Ended:
    """How one ``execute`` in a task ended."""

    result: ToolResultPart | None = None
    error: Exception | None = None
    acknowledged: bool = False
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    async def run(self, tool: McpTool) -> None:
        with self.scope:
            try:
                self.result = await run(tool)
            except (TerminationUnconfirmed, ToolTransportLost, ToolUnavailable) as error:
                self.error = error
        self.acknowledged = self.scope.cancelled_caught


# ---------------------------------------------------------------- listing and answers


async def test_mcp_real_server_answers_and_declares_its_hints() -> None:
    with anyio.fail_after(BOUND_S):
        async with proxied() as p:
            answered(await run(p.tool))
            definition = p.tool.definition
            assert definition is not None
            assert definition.name == TOOL
            assert "properties" in definition.parameters
            # Both servers annotate the tool read-only and idempotent (MCP annotations).
            assert (definition.read_only, definition.idempotent) == (True, True)


# ---------------------------------------------------------------- failure 3: killed mid-call


async def test_mcp_server_killed_mid_call_is_transport_lost_not_an_answer() -> None:
    with anyio.fail_after(BOUND_S):
        async with proxied(restart_backoff_s=BOUND_S) as p:
            ended = Ended()
            async with anyio.create_task_group() as tg:
                await p.command("hold")
                tg.start_soon(ended.run, p.tool)
                await p.command("held")  # the server answered; the client has not seen it
                await p.command("kill")
            assert isinstance(ended.error, ToolTransportLost), ended
            assert "whether the call ran is unknown" in str(ended.error)
            assert ended.result is None


async def test_op3_mcp_server_killed_mid_call_through_the_engine_is_indeterminate() -> None:
    """The server died holding the call: nobody knows whether it ran (``transport_lost``),
    never an answer it did not give (``capability_error``)."""
    with anyio.fail_after(BOUND_S):
        async with (
            proxied(restart_backoff_s=BOUND_S) as p,
            op_rig({"M": [step(call(TOOL, **ARGS)), text()]}, extra_tools={TOOL: p.tool}) as r,
        ):
            await p.command("hold")
            r.session().send("what time is it")
            await p.command("held")
            await p.command("kill")
            await r.engine.wait_idle()
            receipt = await r.receipt(OP)
            assert receipt.state is OpState.INDETERMINATE
            assert receipt.outcome_code == OutcomeCode.TRANSPORT_LOST
            assert receipt.termination_acknowledged is False


# ---------------------------------------------------------------- failure 4: restarts


async def test_mcp_dead_server_is_restarted_and_its_tools_listed_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="turnkeeper.mcp")
    with anyio.fail_after(BOUND_S):
        async with proxied(restart_backoff_s=0.05, max_restart_backoff_s=0.1) as p:
            assert p.server.starts == 1
            other = p.tools[OTHER]
            (p.control / "hidden").write_text(OTHER)  # the restarted server lists less
            first_pid = await p.command("pid")
            await p.command("kill")
            await p.server.wait_started(2)

            answered(await run(p.tool))
            assert await p.command("pid") != first_pid
            assert OTHER not in p.server.listing
            with pytest.raises(ToolUnavailable, match="no longer lists"):
                await run(other, {})
    changed = [r.getMessage() for r in caplog.records if "tool list changed" in r.getMessage()]
    assert len(changed) == 1, changed


async def test_mcp_a_restarted_servers_changed_list_is_offered_from_the_next_request_on() -> None:
    """The engine's offer follows the re-listing: a tool the restarted server no longer lists
    is not offered to the next model request (the engine was not rebuilt)."""
    with anyio.fail_after(BOUND_S):
        async with (
            proxied(restart_backoff_s=0.05, max_restart_backoff_s=0.1) as p,
            op_rig({"M": [text(), text()]}, extra_tools=dict(p.tools)) as r,
        ):
            r.session().send("first")
            await r.engine.wait_idle()
            (p.control / "hidden").write_text(OTHER)
            await p.command("kill")
            await p.server.wait_started(2)
            r.session().send("second")
            await r.engine.wait_idle()
            model = r.models["M"]
            assert isinstance(model, ScriptedModel)
            offered = [sorted(t.name for t in q.tools) for q in model.requests]
    assert offered[0] == sorted(p.tools)
    assert offered[1] == sorted(set(p.tools) - {OTHER})


async def test_mcp_calls_while_the_server_is_down_are_unavailable_never_sent() -> None:
    with anyio.fail_after(BOUND_S):
        async with proxied(restart_backoff_s=60.0, max_restart_backoff_s=60.0) as p:
            await p.command("kill")
            await p.server.wait_stopped(1)
            assert not p.server.up
            with pytest.raises(ToolUnavailable, match="is down"):
                await run(p.tool)
        # Leaving the tools ends the supervisor's 60 s backoff at once (inside the bound).


async def test_op12_a_call_while_the_server_is_down_is_failed_unavailable_through_the_engine() -> (
    None
):
    """Nothing was sent: ``failed`` with outcome ``unavailable`` (not ``capability_error``),
    acknowledged (nothing ran), and the turn goes on to answer."""
    with anyio.fail_after(BOUND_S):
        async with (
            proxied(restart_backoff_s=60.0, max_restart_backoff_s=60.0) as p,
            op_rig({"M": [step(call(TOOL, **ARGS)), text()]}, extra_tools={TOOL: p.tool}) as r,
        ):
            await p.command("kill")
            await p.server.wait_stopped(1)
            r.session().send("what time is it")
            await r.engine.wait_idle()
            receipt = await r.receipt(OP)
            assert (receipt.state, receipt.outcome_code) == (OpState.FAILED, "unavailable")
            assert receipt.termination_acknowledged is True


# ---------------------------------------------------------------- failure 5: undecodable bytes


async def test_mcp_undecodable_bytes_on_stdout_keep_the_connection_working(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    garbage = b"\xff\xfe token=FAKEmcp2222 \xc3(\n" + b"plain noise, no JSON\n"
    with anyio.fail_after(BOUND_S):
        async with proxied() as p:
            await p.command(f"inject {garbage.hex()}")
            with anyio.fail_after(5.0):  # the answer, not a deadline waited out
                answered(await run(p.tool))
            answered(await run(p.tool))
    # One record per garbage line, without a traceback, the undecodable bytes noted once.
    ours = [r for r in caplog.records if r.name == "turnkeeper.mcp"]
    lines = [r for r in ours if "not a JSON-RPC message" in r.getMessage()]
    assert len(lines) == 2, [r.getMessage() for r in ours]
    assert all(r.exc_info is None and r.exc_text is None for r in lines)
    assert sum("undecodable byte(s) replaced" in r.getMessage() for r in ours) == 1
    stdio = [r for r in caplog.records if r.name == "mcp.client.stdio"]
    assert not any(r.exc_info for r in stdio), [r.getMessage() for r in stdio]
    assert "FAKEmcp" not in caplog.text


# ---------------------------------------------------------------- Stop, deadline, a racing result


async def test_op3_mcp_result_racing_the_cancel_is_the_result() -> None:
    with anyio.fail_after(BOUND_S):
        async with proxied(confirm_timeout_s=BOUND_S) as p:
            ended = Ended()
            async with anyio.create_task_group() as tg:
                await p.command("hold")
                tg.start_soon(ended.run, p.tool)
                held = json.loads(await p.command("held"))
                ended.scope.cancel()
                # The cancel reached the server for that very request; then its answer arrives.
                assert json.loads(await p.command("cancelled")) == held
                await p.command("release")
            assert ended.error is None
            assert not ended.acknowledged  # not cancelled: the call completed
            assert ended.result is not None
            answered(ended.result)


async def test_op3_mcp_real_server_stop_is_unconfirmed_and_the_session_goes_on() -> None:
    with anyio.fail_after(BOUND_S):
        async with proxied() as p:
            async with op_rig(
                {"M": [step(call(TOOL, **ARGS)), text()]}, extra_tools={TOOL: p.tool}
            ) as r:
                await p.command("hold")
                r.session().send("what time is it")
                await p.command("held")
                r.session().stop()
                await r.engine.wait_idle()
                receipt = await r.receipt(OP)
                # A real server never confirms a cancel (it does not answer a cancelled call).
                assert receipt.state is OpState.INDETERMINATE
                assert not receipt.termination_acknowledged
                assert await p.command("cancelled") != "null"
            await p.command("release")  # the late answer is dropped; the connection goes on
            answered(await run(p.tool))


async def test_op3_mcp_real_server_deadline_is_unconfirmed() -> None:
    with anyio.fail_after(BOUND_S):
        async with (
            proxied() as p,
            op_rig({"M": [step(call(TOOL, **ARGS)), text()]}, extra_tools={TOOL: p.tool}) as r,
        ):
            await p.command("hold")
            r.session().send("what time is it")
            await p.command("held")
            await r.run_until(DEADLINE_S + 0.001)
            await r.engine.wait_idle()
            receipt = await r.receipt(OP)
            assert receipt.state is OpState.INDETERMINATE
            assert receipt.cancel_reason == "deadline"
            assert await p.command("cancelled") != "null"


# ---------------------------------------------------------------- progress


async def test_op2_mcp_progress_is_traced_and_never_extends_the_deadline() -> None:
    """Progress notifications are ``op-progress`` events; the deadline is end to end."""
    steps = 3
    with anyio.fail_after(BOUND_S):
        async with (
            stdio_tools(sys.executable, [TEST_SERVER], confirm_timeout_s=5.0) as tools,
            op_rig(
                {"M": [step(call("progress", steps=steps)), text()]},
                extra_tools={"progress": tools["progress"]},
            ) as r,
        ):
            reported = anyio.Event()
            r.on(lambda e: reported.set() if len(r.of(OpProgress)) >= steps else None)
            r.session().send("go")
            await reported.wait()  # all three, sent before the tool starts to hang
            await r.run_until(DEADLINE_S + 0.001)
            await r.engine.wait_idle()
            receipt = await r.receipt(OP)
            assert receipt.state is OpState.TIMED_OUT, receipt
            progress = r.of(OpProgress)
            assert [(e.op, e.progress, e.total) for e in progress] == [
                (OP, 1.0, 3.0),
                (OP, 2.0, 3.0),
                (OP, 3.0, 3.0),
            ]
            assert progress[0].message == "step 1 of 3"
