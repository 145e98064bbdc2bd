"""The pydantic-ai adapter driven by pydantic-ai's own ``FunctionModel`` (no HTTP).

The same engine paths the fixture-server tests take over HTTP: the stranded-turn incident
(cut, withdrawal, resume under the remainder, answer), tools offered with their schemas,
history mapped both ways, thinking, provider-executed calls, bad output and bad names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai import messages as pm
from pydantic_ai.models.function import AgentInfo, DeltaThinkingPart, DeltaToolCall, FunctionModel

from agent_session import Engine, EngineConfig, EngineEvent
from message_queue import DispatchMode, EntryKind
from persistence import MemoryStore, ToolKind
from stream_manager import (
    FunctionTool,
    OperationStarted,
    ReceiptWritten,
    StepUsage,
    StreamEnded,
    StreamFailed,
    StreamStarted,
    ToolCallEnded,
    ToolCallPart,
    ToolContext,
    ToolResultPart,
)
from stream_manager.models import ModelUnavailable, PydanticAIModel

Delta = str | dict[int, DeltaToolCall] | dict[int, DeltaThinkingPart]


def last_request(messages: list[pm.ModelMessage]) -> pm.ModelRequest:
    last = messages[-1]
    assert isinstance(last, pm.ModelRequest)
    return last


def returns(messages: list[pm.ModelMessage]) -> list[pm.ToolReturnPart]:
    return [p for p in last_request(messages).parts if isinstance(p, pm.ToolReturnPart)]


def call(name: str, args: str, call_id: str) -> dict[int, DeltaToolCall]:
    return {0: DeltaToolCall(name=name, json_args=args, tool_call_id=call_id)}


class Recorder:
    def __init__(self) -> None:
        self.events: list[EngineEvent] = []

    def __call__(self, event: EngineEvent) -> None:
        self.events.append(event)

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


async def bash(cmd: str) -> str:
    """Run a shell command."""
    return "3 monitored tasks started"


async def task_await() -> str:
    """Wait for the monitored tasks."""
    return "all three tasks exited 0"


async def test_the_stranded_turn_incident_runs_through_a_pydantic_ai_model() -> None:
    """Cut at a tool boundary by a wake, the wake withdrawn, the turn resumed and answered."""
    seen: list[list[pm.ModelMessage]] = []

    async def stream(messages: list[pm.ModelMessage], info: AgentInfo) -> AsyncIterator[Delta]:
        seen.append(list(messages))
        done = {
            p.tool_name
            for m in messages
            if isinstance(m, pm.ModelRequest)
            for p in m.parts
            if isinstance(p, pm.ToolReturnPart)
        }
        if "bash" not in done:
            yield call("bash", '{"cmd": "start-', "c1")
            yield {0: DeltaToolCall(json_args='monitors"}')}
        elif "task_await" not in done:
            yield call("task_await", "{}", "c2")
        else:
            yield "All three tasks passed."

    model = PydanticAIModel(FunctionModel(stream_function=stream), model_id="agent-model")
    recorder = Recorder()
    async with Engine(
        store=MemoryStore(),
        models={"agent-model": model},
        tools={"bash": FunctionTool(bash), "task_await": FunctionTool(task_await)},
        config=EngineConfig(max_stream_steps=8),
    ) as engine:
        session = await engine.open_session("dev", model="agent-model")

        def act(event: EngineEvent) -> None:
            recorder(event)
            if isinstance(event, OperationStarted) and event.tool == "task_await":
                session.enqueue(
                    "tasks done", kind=EntryKind.WAKE, entry="wake", mode=DispatchMode.TOOL_END
                )
            elif isinstance(event, StreamEnded) and event.stream == "dev/1":
                session.withdraw("wake", "withdrawn")

        engine.add_observer(act)
        session.send("start three monitored tasks and wait for them")
        await session.wait_idle()
        assert not session.owes()
    starts = recorder.of(StreamStarted)
    assert [(s.stream, s.cause.value, s.budget) for s in starts] == [
        ("dev/1", "send", 8),
        ("dev/2", "resume", 6),
    ]
    ends = recorder.of(StreamEnded)
    assert [(e.finish.value, e.steps, e.remaining) for e in ends] == [
        ("tool-calls", 2, 6),
        ("stop", 1, 5),
    ]
    # The resumed request: the cut turn's calls, their results as tool returns, [CONTINUE].
    resumed = seen[-1]
    assert [r.tool_call_id for r in returns(resumed)] == ["c1", "c2"]
    assert [r.content for r in returns(resumed)] == [
        "3 monitored tasks started",
        "all three tasks exited 0",
    ]
    continue_part = last_request(resumed).parts[-1]
    assert isinstance(continue_part, pm.UserPromptPart)
    assert continue_part.content == "[CONTINUE]"
    assert len(recorder.of(StepUsage)) == 3


async def test_the_tools_reach_the_model_with_their_descriptions_and_schemas() -> None:
    offered: list[pm.ModelMessage] = []
    infos: list[AgentInfo] = []

    async def stream(messages: list[pm.ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        infos.append(info)
        offered.extend(messages)
        yield "ok"

    async def read_file(path: str, limit: int = 200) -> str:
        """Read a file of the workspace."""
        return ""

    model = PydanticAIModel(FunctionModel(stream_function=stream), model_id="m2")
    async with Engine(
        store=MemoryStore(), models={"m2": model}, tools={"read_file": FunctionTool(read_file)}
    ) as engine:
        session = await engine.open_session("s", model="m2")
        session.send("hi")
        await session.wait_idle()
    [tool] = infos[0].function_tools
    assert tool.name == "read_file"
    assert tool.description == "Read a file of the workspace."
    assert tool.parameters_json_schema["required"] == ["path"]


async def test_thinking_streams_as_reasoning_and_an_unknown_tool_is_an_error_the_model_sees() -> (
    None
):
    calls = 0

    async def stream(messages: list[pm.ModelMessage], info: AgentInfo) -> AsyncIterator[Delta]:
        nonlocal calls
        calls += 1
        if calls == 1:
            yield {0: DeltaThinkingPart(content="the user wants a file")}
            yield {1: DeltaToolCall(name="no_such_tool", json_args="{}", tool_call_id="c9")}
        else:
            [returned] = returns(messages)
            assert returned.content == {"error": "unknown tool 'no_such_tool'"}
            yield "sorry, that tool does not exist"

    recorder = Recorder()
    model = PydanticAIModel(FunctionModel(stream_function=stream), model_id="m3")
    async with Engine(store=MemoryStore(), models={"m3": model}) as engine:
        engine.add_observer(recorder)
        session = await engine.open_session("s", model="m3")
        session.send("read it")
        await session.wait_idle()
    [ended] = recorder.of(ToolCallEnded)
    assert ended.is_error
    assert [e.finish.value for e in recorder.of(StreamEnded)] == ["stop"]
    assert calls == 2


async def test_tool_arguments_that_are_no_json_object_are_a_malformed_output() -> None:
    async def stream(messages: list[pm.ModelMessage], info: AgentInfo) -> AsyncIterator[Delta]:
        yield call("bash", '{"cmd": ', "c1")

    recorder = Recorder()
    model = PydanticAIModel(FunctionModel(stream_function=stream), model_id="m4")
    async with Engine(
        store=MemoryStore(), models={"m4": model}, tools={"bash": FunctionTool(bash)}
    ) as engine:
        engine.add_observer(recorder)
        session = await engine.open_session("s", model="m4")
        session.send("go")
        await session.wait_idle()
    [failed] = recorder.of(StreamFailed)
    assert (failed.type, failed.kind.value) == ("malformed_output", "terminal")
    assert "no JSON object" in failed.message
    assert not recorder.of(ReceiptWritten)  # nothing ran


@pytest.mark.parametrize(
    ("name", "env", "message"),
    [
        ("nonsense:model-x", {}, "model 'nonsense:model-x': Unknown model: nonsense:model-x"),
        ("openai:gpt-4.1-mini", {}, "needs an API key: OPENAI_API_KEY is not set"),
        ("groq:llama-3.3-70b", {}, "needs a provider extra: Please install the `groq` package"),
    ],
)
def test_a_model_that_cannot_be_built_is_one_clear_line_before_the_engine_starts(
    name: str, env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelUnavailable) as raised:
        PydanticAIModel(name)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_base_url_needs_a_model_name() -> None:
    async def stream(messages: list[pm.ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        yield "x"

    with pytest.raises(ModelUnavailable, match="base_url goes with a model name"):
        PydanticAIModel(FunctionModel(stream_function=stream), base_url="http://127.0.0.1:9/v1")


class WebSearch:
    """A provider tool: the provider runs it; the engine only keeps its receipt (OP-7)."""

    name = "web_search"
    kind = ToolKind.PROVIDER

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        raise AssertionError("a provider-executed tool never runs here")


async def test_op7_a_provider_tool_is_a_native_tool_and_its_call_gets_a_receipt() -> None:
    requests: list[tuple[list[pm.ModelMessage], AgentInfo]] = []

    async def stream(messages: list[pm.ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        requests.append((list(messages), info))
        if len(requests) == 1:
            search = pm.NativeToolCallPart(
                tool_name="web_search", args={"query": "anyio"}, tool_call_id="ws1"
            )
            found = pm.NativeToolReturnPart(
                tool_name="web_search", content={"results": ["anyio docs"]}, tool_call_id="ws1"
            )
            yield {0: search}
            yield {1: found}
        yield "anyio is an async library."

    recorder = Recorder()
    model = PydanticAIModel(FunctionModel(stream_function=stream), model_id="m5")
    async with Engine(
        store=MemoryStore(), models={"m5": model}, tools={"web_search": WebSearch()}
    ) as engine:
        engine.add_observer(recorder)
        session = await engine.open_session("s", model="m5")
        session.send("what is anyio?")
        await session.wait_idle()
        session.send("thanks")
        await session.wait_idle()
    [native] = requests[0][1].model_request_parameters.native_tools
    assert native.kind == "web_search"
    assert requests[0][1].function_tools == []
    [receipt] = recorder.of(ReceiptWritten)
    assert (receipt.op, receipt.tool, receipt.state) == ("s/1/1/p0", "web_search", "completed")
    # The next turn's history carries the provider's call and result back as native parts.
    response = requests[1][0][1]
    assert isinstance(response, pm.ModelResponse)
    kinds = [type(p).__name__ for p in response.parts]
    assert kinds == ["TextPart", "NativeToolCallPart", "NativeToolReturnPart"]
