"""Auto-retry against a real client over HTTP (AS-32): a 429 with Retry-After, a 503 burst.

The pydantic-ai adapter talks to the scripted OpenAI-compatible server through the real
``openai`` client (its own retries off): every failed request reaches the engine as a stream
error, and the engine's retry is what asks again. The clock is the system's, recording how
long each wait was asked for (the waits themselves are a few milliseconds).
"""

from __future__ import annotations

import math

from agent_session import Engine, EngineConfig, EngineEvent, RetryScheduled
from agent_session.harness.openai_fixture import (
    FixtureServer,
    TextReply,
    ToolCall,
    ToolCallsReply,
    context_length_exceeded,
    rate_limited,
    service_unavailable,
)
from persistence import MemoryStore, RowKind
from stream_manager import FunctionTool, StreamEnded, StreamFailed, StreamStarted, SystemClock
from stream_manager.models import PydanticAIModel
from tests import store_kit


class WaitLog(SystemClock):
    """The system clock, recording each sleep's requested length in seconds."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def sleep_until(self, deadline_at: float) -> None:
        self.waits.append(deadline_at - self.now())
        await super().sleep_until(deadline_at)


async def shell(command: str) -> str:
    return f"ran {command}"


async def run(
    replies: list[object], config: EngineConfig, *, rows: tuple[RowKind, ...] = ()
) -> tuple[list[EngineEvent], WaitLog, FixtureServer]:
    """One turn against ``replies``; its events, the clock's waits and the server."""
    events: list[EngineEvent] = []
    clock = WaitLog()
    store = MemoryStore()
    async with FixtureServer(replies) as server:  # type: ignore[arg-type]
        model = PydanticAIModel("gpt-main", model_id="main", base_url=server.base_url, api_key="k")
        tools = {"shell": FunctionTool(shell)}
        engine = Engine(
            store=store, models={"main": model}, tools=tools, clock=clock, config=config
        )
        async with model, engine:
            engine.add_observer(events.append)
            session = await engine.open_session("s", model="main")
            session.send("build it")
            await session.wait_idle()
            history = await store_kit.history(store, "s")
        assert server.pending == 0
    assert tuple(row.kind for row in history) == (rows or (RowKind.USER, RowKind.ASSISTANT))
    return events, clock, server


async def test_as32_a_429_with_retry_after_is_retried_after_the_providers_wait() -> None:
    limited = rate_limited(retry_after_ms=40)
    config = EngineConfig(retry_backoff_s=0.002, retry_backoff_cap_s=0.002)
    events, clock, _ = await run([limited, TextReply(chunks=("Built.",))], config)
    (failed,) = [e for e in events if isinstance(e, StreamFailed)]
    assert failed.type == "rate_limited"
    assert [e.cause for e in events if isinstance(e, StreamStarted)] == ["send", "retry"]
    assert [e.finish.value for e in events if isinstance(e, StreamEnded)] == ["stop"]
    (wait,) = [w for w in clock.waits if w > 0.01]  # the provider's 40 ms, not our 2 ms
    assert math.isclose(wait, 0.04, abs_tol=0.01)


async def test_as32_a_503_burst_ends_in_one_answer_with_the_backoff_doubling() -> None:
    config = EngineConfig(retry_backoff_s=0.001, retry_max_attempts=4)
    replies: list[object] = [
        service_unavailable(),
        service_unavailable(),
        service_unavailable(),
        TextReply(chunks=("Built.",)),
    ]
    events, clock, _ = await run(replies, config)
    assert [e.attempt for e in events if isinstance(e, RetryScheduled)] == [1, 2, 3]
    assert [e.type for e in events if isinstance(e, StreamFailed)] == ["provider_error"] * 3
    ended = [e for e in events if isinstance(e, StreamEnded)]
    assert len(ended) == 1
    backoffs = [w for w in clock.waits if 0 < w < 0.01]
    assert [round(w * 1000) for w in backoffs[:3]] == [1, 2, 4]


async def test_as33_ps2_a_retry_after_a_tool_step_sends_a_request_the_api_accepts() -> None:
    # the failed attempt ran a tool: its call and result go into history as the partial row
    # the retry streams from; the real API refuses a call without its result (a 400 here)
    soon = rate_limited(retry_after_ms=1)
    call = ToolCallsReply(
        calls=(ToolCall(id="call_7", name="shell", arguments='{"command": "make"}'),)
    )
    config = EngineConfig(retry_backoff_s=0.001)
    kinds = (RowKind.USER, RowKind.PARTIAL, RowKind.ASSISTANT)
    events, _, server = await run([call, soon, TextReply(chunks=("Built.",))], config, rows=kinds)
    assert [e.cause for e in events if isinstance(e, StreamStarted)] == ["send", "retry"]
    (retry_started,) = [e for e in events if isinstance(e, StreamStarted) and e.cause == "retry"]
    assert retry_started.budget == 99  # one step spent of 100
    last = server.requests[-1]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "tool"]
    assert last[-1]["tool_call_id"] == "call_7"


async def test_as34_a_context_length_400_is_compacted_and_continued_over_http() -> None:
    # the provider's 400 context_length_exceeded: the compaction request (a plain completion
    # over the history) and the follow-up (the summary as a system message, then Continue)
    # are requests the API accepts
    summary = TextReply(chunks=("The user asked for a build; nothing has run yet.",))
    replies: list[object] = [context_length_exceeded(), summary, TextReply(chunks=("Built.",))]
    kinds = (RowKind.USER, RowKind.SUMMARY, RowKind.USER, RowKind.ASSISTANT)
    events, _, server = await run(replies, EngineConfig(), rows=kinds)
    assert [e.cause for e in events if isinstance(e, StreamStarted)] == ["send", "follow-up"]
    follow_up = server.requests[-1]["messages"]
    assert [m["role"] for m in follow_up] == ["system", "user"]
    assert follow_up[-1]["content"] == "Continue"
