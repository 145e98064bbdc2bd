"""What the adapter sends and gets over HTTP, where a mutant of ``stream_manager.models`` hid.

Each test runs the real pydantic-ai ``OpenAIChatModel`` and the ``openai`` client against the
scripted OpenAI-compatible server, and reads what reached the server (the request JSON) or
what the adapter yielded to the engine:

* the scratchpad (R26) is a system message of every request, a resume's the cut's snapshot;
* a 408, which pydantic-ai leaves in no category, is a retryable provider error;
* a provider-executed call's result goes back once, in the response that made the call, never
  a second time as a ``tool`` message;
* streamed reasoning arrives as a ``ReasoningPart``; history keeps the text alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai import exceptions as x
from pydantic_ai import messages as pm
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent_session import Engine, EngineEvent
from agent_session.harness.openai_fixture import (
    FixtureServer,
    TextReply,
    ToolCall,
    ToolCallsReply,
    request_timeout,
)
from message_queue import DispatchMode, EntryKind, SendOptions
from persistence import MemoryStore
from stream_manager import (
    ChatMessage,
    Finish,
    FinishReason,
    FunctionTool,
    OperationStarted,
    Part,
    ReasoningPart,
    Role,
    StreamEnded,
    TextPart,
    Usage,
)
from stream_manager.errors import ErrorType, ModelError, is_retryable
from stream_manager.models import PydanticAIModel, to_pydantic_messages
from stream_manager.ports import ModelRequest
from tests.models.test_adapter_function_model import WebSearch
from tests.models.test_incident_over_http import task_await


class Tap:
    """A model port around the adapter that keeps each request and each part it yielded."""

    def __init__(self, inner: PydanticAIModel) -> None:
        self.inner = inner
        self.requests: list[ModelRequest] = []
        self.parts: list[Part] = []

    @property
    def id(self) -> str:
        return self.inner.id

    async def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        self.requests.append(request)
        async for part in self.inner.stream_step(request):
            self.parts.append(part)
            yield part


def systems(request: Any) -> list[str]:
    """The contents of a request JSON's system messages."""
    return [m["content"] for m in request["messages"] if m["role"] == "system"]


async def test_r26_the_scratchpad_reaches_the_server_and_a_resume_sends_the_cut_snapshot() -> None:
    """Set before the turn, edited during the tool the turn is cut at, and again after the cut."""
    replies = (
        ToolCallsReply(calls=(ToolCall(id="call_t", name="task_await", arguments="{}"),)),
        TextReply(chunks=("All three passed.",)),
    )
    async with FixtureServer(replies) as server:
        model = PydanticAIModel("gpt-fixture", model_id="planner", base_url=server.base_url)
        tools = {"task_await": FunctionTool(task_await)}
        async with model, Engine(store=MemoryStore(), models={"planner": model}, tools=tools) as e:
            session = await e.open_session("pad", model="planner")

            def act(event: EngineEvent) -> None:
                if isinstance(event, OperationStarted):
                    session.set_scratchpad("plan: await the monitors (v2)")
                    session.enqueue(
                        "done", kind=EntryKind.WAKE, entry="w", mode=DispatchMode.TOOL_END
                    )
                elif isinstance(event, StreamEnded) and event.stream == "pad/1":
                    assert session.withdraw("w", "withdrawn")
                    session.set_scratchpad("plan: edited after the cut (v3)")

            e.add_observer(act)
            session.set_scratchpad("plan: start the monitors (v1)")
            session.send("wait for the monitored tasks")
            await session.wait_idle()
            assert not session.owes()
        assert server.pending == 0
    first, resumed = server.requests
    assert first["messages"][0] == {"role": "system", "content": "plan: start the monitors (v1)"}
    assert systems(first) == ["plan: start the monitors (v1)"]
    assert systems(resumed) == ["plan: await the monitors (v2)"]
    assert resumed["messages"][-1] == {"role": "user", "content": "[CONTINUE]"}


def ask(text: str) -> ModelRequest:
    return ModelRequest(
        model="gateway",
        stream="s/1",
        step=1,
        step_ceiling=5,
        messages=(ChatMessage(role=Role.USER, text=text),),
    )


async def test_a_408_pydantic_ai_leaves_uncategorized_is_a_retryable_provider_error() -> None:
    async with FixtureServer([request_timeout()]) as server:
        model = PydanticAIModel("gpt-gateway", model_id="gateway", base_url=server.base_url)
        async with model:
            with pytest.raises(ModelError) as raised:
                async for _ in model.stream_step(ask("build it")):
                    pass
    assert type(raised.value.__cause__) is x.ModelHTTPError  # no category: the status decides
    assert raised.value.type is ErrorType.PROVIDER_ERROR
    assert is_retryable(raised.value.type)
    assert "HTTP 408" in raised.value.message
    assert len(server.requests) == 1  # the client retried nothing


async def search_then_answer(
    messages: list[pm.ModelMessage], info: AgentInfo
) -> AsyncIterator[Any]:
    """A provider that runs web_search itself, then answers."""
    search = pm.NativeToolCallPart(tool_name="web_search", args={"q": "anyio"}, tool_call_id="ws1")
    yield {0: search}
    found = pm.NativeToolReturnPart(
        tool_name="web_search", content={"results": ["anyio docs"]}, tool_call_id="ws1"
    )
    yield {1: found}
    yield "anyio is an async library."


async def test_a_provider_executed_result_goes_back_once_and_never_as_a_tool_message() -> None:
    async with FixtureServer([TextReply(chunks=("You are welcome.",))]) as server:
        searcher = PydanticAIModel(FunctionModel(stream_function=search_then_answer), model_id="s")
        # A search-preview model takes web_search as a native tool over chat completions.
        http = Tap(PydanticAIModel("gpt-4o-search-preview", model_id="h", base_url=server.base_url))
        async with (
            http.inner,
            Engine(
                store=MemoryStore(),
                models={"s": searcher, "h": http},
                tools={"web_search": WebSearch()},
            ) as engine,
        ):
            session = await engine.open_session("u", model="s")
            session.send("what is anyio?")
            await session.wait_idle()
            session.send("thanks", options=SendOptions(model="h"))
            await session.wait_idle()
    [sent] = server.requests
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["messages"][1] == {"role": "assistant", "content": "anyio is an async library."}
    assert sent["web_search_options"] == {"search_context_size": "medium"}
    # What the adapter handed pydantic-ai: the call and its result once, in the response.
    [request] = http.requests
    about_ws1 = [
        type(part).__name__
        for message in to_pydantic_messages(request)
        for part in message.parts
        if getattr(part, "tool_call_id", None) == "ws1"
    ]
    assert about_ws1 == ["NativeToolCallPart", "NativeToolReturnPart"]


async def test_streamed_reasoning_arrives_as_a_reasoning_part_and_history_keeps_the_text() -> None:
    replies = (
        TextReply(chunks=("Hel", "lo"), reasoning=("the user ", "greets me"), usage=(21, 9)),
        TextReply(chunks=("Bye.",)),
    )
    async with FixtureServer(replies) as server:
        tap = Tap(PydanticAIModel("deepseek-fixture", model_id="r", base_url=server.base_url))
        async with (
            tap.inner,
            Engine(store=MemoryStore(), models={"r": tap}) as engine,
        ):
            session = await engine.open_session("t", model="r")
            session.send("hi")
            await session.wait_idle()
            session.send("again")
            await session.wait_idle()
    assert tap.parts[:3] == [
        ReasoningPart(text="the user greets me"),
        TextPart(text="Hello"),
        Finish(reason=FinishReason.STOP, usage=Usage(input_tokens=21, output_tokens=9)),
    ]
    # The history sends the answer back as the assistant's text; the reasoning stays out.
    assert server.requests[1]["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "again"},
    ]
