"""Every tool call in history has a result before the next model request, over HTTP.

The fixture server refuses a history holding an assistant's tool call that no tool message
answers, with the real API's 400 (``history_refusal``): after a Stop during a tool call, a
deadline, or a crash and a restart, the next turn must still be accepted, and the model must
learn what happened to the call (its receipt, or the restart's note).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import openai
import pytest

from agent_session import Engine, EngineConfig, EngineEvent
from agent_session.harness.fakes import Faults, FaultyStore
from agent_session.harness.openai_fixture import (
    FixtureServer,
    TextReply,
    ToolCall,
    ToolCallsReply,
    history_refusal,
)
from persistence import MemoryStore, SqliteStore, Store
from stream_manager import FunctionTool, OperationStarted, SystemClock
from stream_manager.models import PydanticAIModel

if TYPE_CHECKING:
    from pathlib import Path


def _calls(*calls: tuple[str, str]) -> ToolCallsReply:
    return ToolCallsReply(calls=tuple(ToolCall(id=i, name=n, arguments="{}") for i, n in calls))


def _tool_messages(request: Any) -> dict[str, Any]:
    return {m["tool_call_id"]: m for m in request["messages"] if m["role"] == "tool"}


async def test_the_fixture_refuses_an_unanswered_tool_call_as_the_real_api_does() -> None:
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [{"id": "call_9", "type": "function"}]},
        {"role": "user", "content": "and then?"},
    ]
    refused = history_refusal(history)
    assert refused is not None
    error: Any = refused["error"]
    assert error["message"].startswith(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to "
        "each 'tool_call_id'. The following tool_call_ids did not have response messages: call_9"
    )
    assert error["param"] == "messages.[1].role"
    answered = [*history[:2], {"role": "tool", "tool_call_id": "call_9"}, history[2]]
    assert history_refusal(answered) is None
    stray = [history[0], {"role": "tool", "tool_call_id": "call_3"}]
    assert history_refusal(stray) is not None
    async with FixtureServer([TextReply(chunks=("unused",))]) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        async with client:
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="m", messages=history)  # type: ignore[arg-type]
        assert caught.value.status_code == 400
        assert (server.refused, server.pending) == (1, 1)  # the script's reply is still there


async def _run(
    server: FixtureServer,
    store: Store,
    tools: dict[str, FunctionTool],
    on_event: Any = None,
    *,
    deadline_s: float = 30.0,
) -> tuple[Engine, PydanticAIModel]:
    model = PydanticAIModel("gpt-fixture", model_id="agent", base_url=server.base_url)
    engine = Engine(
        store=store,
        models={"agent": model},
        tools=tools,
        config=EngineConfig(max_stream_steps=6, tool_deadline_s=deadline_s, cancel_grace_s=0.05),
        clock=SystemClock(),
        observers=[on_event] if on_event else (),
    )
    return engine, model


async def test_op3_after_a_stop_during_a_tool_call_the_next_turn_is_accepted_and_told() -> None:
    """A user Stop while ``deploy`` runs: the partial answers the call from its receipt."""
    release = anyio.Event()

    async def deploy() -> str:
        """Deploy the build."""
        await release.wait()
        return "deployed"

    replies = (_calls(("call_d", "deploy")), TextReply(chunks=("It was stopped; ", "not redone.")))
    async with FixtureServer(replies) as server:
        holder: list[Any] = []

        def stop_when_running(event: EngineEvent) -> None:
            if isinstance(event, OperationStarted) and event.tool == "deploy":
                holder[0].stop()

        engine, model = await _run(
            server, MemoryStore(), {"deploy": FunctionTool(deploy)}, stop_when_running
        )
        async with model, engine:
            session = await engine.open_session("dev", model="agent")
            holder.append(session)
            session.send("deploy it")
            with anyio.fail_after(20):
                await session.wait_idle()
            session.send("what happened to the deploy?")
            with anyio.fail_after(20):
                await session.wait_idle()
        assert server.refused == 0, server.requests[-1]["messages"]
        assert server.pending == 0
        told = json.loads(_tool_messages(server.requests[-1])["call_d"]["content"])
    assert told["error"] == "cancelled"
    assert told["op"] == "dev/1/1/0"
    assert told["receipt"] == "cancelled"  # a FunctionTool acknowledges its cancellation
    assert told["acknowledged"] is True
    assert "confirmed" in told["what_is_known"]


async def test_op2_after_a_deadline_the_next_request_is_accepted_and_states_the_receipt() -> None:
    async def migrate() -> str:
        """Migrate the database."""
        await anyio.sleep_forever()
        return "never"

    replies = (_calls(("call_m", "migrate")), TextReply(chunks=("It timed out.",)))
    async with FixtureServer(replies) as server:
        engine, model = await _run(
            server, MemoryStore(), {"migrate": FunctionTool(migrate)}, deadline_s=0.1
        )
        async with model, engine:
            session = await engine.open_session("dev", model="agent")
            session.send("migrate")
            with anyio.fail_after(20):
                await session.wait_idle()
        assert server.refused == 0
        assert server.pending == 0
        told = json.loads(_tool_messages(server.requests[-1])["call_m"]["content"])
    assert (told["error"], told["op"]) == ("timeout", "dev/1/1/0")
    assert (told["receipt"], told["acknowledged"]) == ("timed_out", True)
    assert "passed its deadline and that it stopped was confirmed" in told["what_is_known"]


async def test_op7_after_a_crash_during_a_tool_call_the_model_is_told_at_the_restart(
    tmp_path: Path,
) -> None:
    """The process dies while ``rotate_keys`` runs: nothing of that stream reached history; the
    restart closes its receipt indeterminate and, in the same write, tells the model."""
    db = tmp_path / "agent.db"

    async def rotate_keys() -> str:
        """Rotate the signing keys."""
        await anyio.sleep_forever()
        return "never"

    async with FixtureServer([_calls(("call_r", "rotate_keys"))]) as first_server:
        crashed = anyio.Event()
        dying = FaultyStore(SqliteStore(db), Faults())

        def crash_when_running(event: EngineEvent) -> None:
            if isinstance(event, OperationStarted):
                dying.crashed = True  # from here on nothing reaches the file, as in a kill -9
                crashed.set()

        engine, model = await _run(
            first_server, dying, {"rotate_keys": FunctionTool(rotate_keys)}, crash_when_running
        )
        async with model:
            with anyio.CancelScope() as scope:  # the process "dies": nothing more is written
                async with engine:
                    session = await engine.open_session("dev", model="agent")
                    session.send("rotate the keys")
                    await crashed.wait()
                    scope.cancel()
    async with FixtureServer([TextReply(chunks=("I will check first.",))]) as server:
        engine, model = await _run(
            server, SqliteStore(db), {"rotate_keys": FunctionTool(rotate_keys)}
        )
        async with model, engine:
            session = await engine.open_session("dev", model="agent")
            session.send("did the rotation happen?")
            with anyio.fail_after(20):
                await session.wait_idle()
        assert server.refused == 0
        messages = server.requests[-1]["messages"]
    notes = [m["content"] for m in messages if m["role"] == "system"]
    assert len(notes) == 1, messages
    assert "rotate_keys (operation dev/1/1/0)" in notes[0]
    assert "Do not assume" in notes[0]
    assert messages[-1] == {"role": "user", "content": "did the rotation happen?"}
