"""The stranded-turn incident over HTTP: the adapter, the openai client, a scripted server.

The first stream calls ``bash`` then ``task_await``; a wake queued while ``task_await`` runs
cuts the loop at that tool boundary (2 of 8 steps spent); the wake is withdrawn at the
stream's end; the idle sweep resumes the cut turn under its 6 remaining steps, and the model
answers. The server sees every request: the resumed one carries the cut turn's calls, their
results (by call id) and the ``[CONTINUE]`` prompt.
"""

from __future__ import annotations

from typing import Any

from agent_session import ContinuationEnded, Engine, EngineConfig, EngineEvent
from agent_session.harness.openai_fixture import (
    FixtureServer,
    TextReply,
    ToolCall,
    ToolCallsReply,
)
from message_queue import DispatchMode, EntryKind
from persistence import MemoryStore
from stream_manager import (
    FunctionTool,
    OperationStarted,
    StepUsage,
    StreamEnded,
    StreamStarted,
)
from stream_manager.models import PydanticAIModel


async def bash(cmd: str) -> str:
    """Run a shell command."""
    return "3 monitored tasks started"


async def task_await() -> str:
    """Wait for the monitored tasks."""
    return "all three tasks exited 0"


async def test_the_incident_over_http_cut_withdrawal_resume_under_the_remainder_answer() -> None:
    replies = (
        ToolCallsReply(calls=(ToolCall(id="call_b", name="bash", arguments='{"cmd": "start"}'),)),
        ToolCallsReply(calls=(ToolCall(id="call_t", name="task_await", arguments="{}"),)),
        TextReply(chunks=("All three ", "tasks passed."), usage=(40, 6)),
    )
    events: list[EngineEvent] = []
    async with FixtureServer(replies) as server:
        model = PydanticAIModel("gpt-fixture", model_id="agent", base_url=server.base_url)
        async with (
            model,
            Engine(
                store=MemoryStore(),
                models={"agent": model},
                tools={"bash": FunctionTool(bash), "task_await": FunctionTool(task_await)},
                config=EngineConfig(max_stream_steps=8),
            ) as engine,
        ):
            session = await engine.open_session("dev", model="agent")

            def act(event: EngineEvent) -> None:
                events.append(event)
                if isinstance(event, OperationStarted) and event.tool == "task_await":
                    session.enqueue(
                        "tasks done", kind=EntryKind.WAKE, entry="wake", mode=DispatchMode.TOOL_END
                    )
                elif isinstance(event, StreamEnded) and event.stream == "dev/1":
                    assert session.withdraw("wake", "withdrawn")

            engine.add_observer(act)
            session.send("start three monitored tasks and wait for them")
            await session.wait_idle()
            assert not session.owes()
        assert server.pending == 0
        requests: list[Any] = server.requests
    starts = [(e.stream, e.cause.value, e.budget) for e in events if isinstance(e, StreamStarted)]
    assert starts == [("dev/1", "send", 8), ("dev/2", "resume", 6)]
    ends = [(e.finish.value, e.steps, e.remaining) for e in events if isinstance(e, StreamEnded)]
    assert ends == [("tool-calls", 2, 6), ("stop", 1, 5)]
    [consumed] = [e for e in events if isinstance(e, ContinuationEnded)]
    assert (consumed.cut, consumed.how) == ("dev/1", "consumed")
    usage = [
        (e.stream, e.n, e.input_tokens, e.output_tokens) for e in events if isinstance(e, StepUsage)
    ]
    assert usage == [("dev/1", 1, 13, 5), ("dev/1", 2, 13, 5), ("dev/2", 1, 40, 6)]
    # Every request offered both tools with their schemas.
    assert all(
        [t["function"]["name"] for t in r["tools"]] == ["bash", "task_await"] for r in requests
    )
    resumed = requests[-1]["messages"]
    assert [m["role"] for m in resumed] == ["user", "assistant", "tool", "tool", "user"]
    assert [m["tool_call_id"] for m in resumed if m["role"] == "tool"] == ["call_b", "call_t"]
    assert resumed[-1]["content"] == "[CONTINUE]"
