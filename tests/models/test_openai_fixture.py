"""The OpenAI-compatible fixture server, driven through the real ``openai`` client and pydantic-ai.

What these tests pin down about the clients (openai 3.57.0, pydantic-ai-slim 2.68.0):

* pydantic-ai maps 429 -> ``ModelRateLimitError``, 500 -> ``ModelServerError``, 400 with
  ``context_length_exceeded`` -> ``ModelContextWindowExceededError``, 401 ``invalid_api_key`` ->
  ``ModelAuthenticationError``, any other 400 -> ``ModelRequestRejectedError``; each is also a
  ``ModelHTTPError`` with the status.
* A stream cut off mid-response: the ``openai`` client raises ``APIConnectionError`` from
  ``httpx2.RemoteProtocolError``; pydantic-ai raises ``ModelConnectionError`` (phase ``"read"``,
  not a ``ModelHTTPError``) after the events already streamed.
* ``finish_reason="content_filter"`` is only a finish reason on a direct request; an ``Agent``
  raises ``ContentFilterError`` when nothing else came back, or always with the
  ``RaiseContentFilterError`` capability.
* ``retry-after: 0`` is not "retry now" to the ``openai`` client (it only honours a delay above
  zero, else backs off from 0.5 s), so tests that let it retry send ``retry-after-ms``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx2
import openai
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionChunk
from pydantic_ai import Agent
from pydantic_ai.capabilities import RaiseContentFilterError
from pydantic_ai.direct import model_request, model_request_stream
from pydantic_ai.exceptions import (
    ContentFilterError,
    ModelAPIError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelContextWindowExceededError,
    ModelHTTPError,
    ModelRateLimitError,
    ModelRequestRejectedError,
    ModelServerError,
)
from pydantic_ai.messages import (
    FinalResultEvent,
    ModelMessage,
    ModelRequest,
    ModelResponseStreamEvent,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ThinkingPart,
    ThinkingPartDelta,
    ToolCallPart,
    ToolCallPartDelta,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.tools import ToolDefinition

from agent_session.harness.openai_fixture import (
    EXHAUSTED_MESSAGE,
    DropReply,
    ErrorReply,
    FixtureServer,
    Reply,
    TextReply,
    ToolCall,
    ToolCallsReply,
    bad_request,
    context_length_exceeded,
    rate_limited,
    server_error,
    unauthorized,
)

T = TypeVar("T")
HI: list[Any] = [{"role": "user", "content": "hi"}]
READ_FILE = ToolDefinition(
    name="read_file",
    description="Read a file of the workspace.",
    parameters_json_schema={
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
)
README_CALL = ToolCall(id="call_1", name="read_file", arguments='{"path": "README.md"}')


async def collect(stream: AsyncIterable[T], into: list[T]) -> None:
    """Append each item of ``stream`` to ``into`` as it arrives (kept when the stream breaks)."""
    async for item in stream:
        into.append(item)  # noqa: PERF401  (a comprehension would lose the items on a break)


@asynccontextmanager
async def openai_client(
    server: FixtureServer, *, max_retries: int = 0
) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(
        base_url=server.base_url, api_key="sk-test", max_retries=max_retries
    ) as client:
        yield client


@asynccontextmanager
async def chat_model(
    server: FixtureServer, *, max_retries: int = 0
) -> AsyncIterator[OpenAIChatModel]:
    async with openai_client(server, max_retries=max_retries) as client:
        yield OpenAIChatModel("fixture-model", provider=OpenAIProvider(openai_client=client))


def port_of(server: FixtureServer) -> int:
    port = urlsplit(server.base_url).port
    assert port is not None
    return port


def prompt() -> list[ModelMessage]:
    return [ModelRequest.user_text_prompt("hi")]


def with_tools() -> ModelRequestParameters:
    return ModelRequestParameters(function_tools=[READ_FILE])


# --- the official openai client -------------------------------------------------------------


async def test_a_streamed_text_reply_arrives_chunk_by_chunk_with_finish_reason_and_usage() -> None:
    async with (
        FixtureServer([TextReply(chunks=("Hel", "lo", " there"))]) as server,
        openai_client(server) as client,
    ):
        stream = await client.chat.completions.create(
            model="gpt-test", messages=HI, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]

    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert texts == ["Hel", "lo", " there"]
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes == [None, None, None, None, "stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (11, 7)
    assert chunks[-1].usage.total_tokens == 18
    assert {(c.id, c.created, c.model, c.object) for c in chunks} == {
        ("chatcmpl-fixture-1", 1_700_000_001, "fixture-model", "chat.completion.chunk")
    }


async def test_a_tool_calls_reply_reassembles_from_split_deltas() -> None:
    listing = ToolCall(id="call_2", name="list_dir", arguments='{"path": "src", "depth": 2}')
    reply = ToolCallsReply(calls=(README_CALL, listing), text="Looking.", pieces=3)
    async with FixtureServer([reply]) as server, openai_client(server) as client:
        stream = await client.chat.completions.create(model="gpt-test", messages=HI, stream=True)
        chunks = [chunk async for chunk in stream]

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Looking."
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [d.index for d in deltas] == [0, 0, 0, 1, 1, 1]
    calls: dict[int, dict[str, str]] = {}
    for delta in deltas:
        call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
        call["id"] += delta.id or ""
        if delta.function is not None:
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
    assert calls == {
        0: {"id": "call_1", "name": "read_file", "arguments": '{"path": "README.md"}'},
        1: {"id": "call_2", "name": "list_dir", "arguments": '{"path": "src", "depth": 2}'},
    }
    first = deltas[0]
    assert (first.id, first.type) == ("call_1", "function")
    assert first.function is not None
    assert first.function.arguments == '{"path"'
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


@pytest.mark.parametrize(
    ("arguments", "pieces", "parts"),
    [
        ('{"path": "a"}', 1, ['{"path": "a"}']),
        ('{"path": "a"}', 2, ['{"path"', ': "a"}']),
        ("{}", 5, ["{", "}"]),  # the empty parts are not sent
    ],
)
async def test_tool_call_arguments_are_cut_into_pieces(
    arguments: str, pieces: int, parts: list[str]
) -> None:
    call = ToolCall(id="call_9", name="read_file", arguments=arguments)
    async with (
        FixtureServer([ToolCallsReply(calls=(call,), pieces=pieces)]) as server,
        openai_client(server) as client,
    ):
        stream = await client.chat.completions.create(model="gpt-test", messages=HI, stream=True)
        chunks = [chunk async for chunk in stream]
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [d.function.arguments if d.function else None for d in deltas] == parts
    assert [d.id for d in deltas] == ["call_9"] + [None] * (len(parts) - 1)


async def test_a_429_raises_rate_limit_error_with_its_headers() -> None:
    async with FixtureServer([rate_limited()]) as server, openai_client(server) as client:
        with pytest.raises(openai.RateLimitError) as raised:
            await client.chat.completions.create(model="gpt-test", messages=HI, stream=True)
    assert raised.value.status_code == 429
    assert raised.value.code == "rate_limit_exceeded"
    assert raised.value.response.headers["retry-after"] == "0"
    assert len(server.requests) == 1  # max_retries=0: no second attempt


async def test_a_context_length_400_raises_bad_request_with_its_code() -> None:
    async with (
        FixtureServer([context_length_exceeded()]) as server,
        openai_client(server) as client,
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            await client.chat.completions.create(model="gpt-test", messages=HI)
    assert raised.value.code == "context_length_exceeded"
    assert raised.value.param == "messages"


async def test_a_dropped_stream_raises_api_connection_error_from_remote_protocol_error() -> None:
    script: list[Reply] = [DropReply(chunks=("par", "tial")), TextReply(chunks=("again",))]
    async with FixtureServer(script) as server, openai_client(server) as client:
        stream = await client.chat.completions.create(model="gpt-test", messages=HI, stream=True)
        seen: list[ChatCompletionChunk] = []
        with pytest.raises(openai.APIConnectionError) as raised:
            await collect(stream, seen)
        assert isinstance(raised.value.__cause__, httpx2.RemoteProtocolError)
        assert "incomplete chunked read" in str(raised.value.__cause__)
        assert "".join(c.choices[0].delta.content or "" for c in seen) == "partial"

        # The next request gets a fresh connection and its own reply.
        answer = await client.chat.completions.create(model="gpt-test", messages=HI)
    assert answer.choices[0].message.content == "again"
    assert server.connections == 2


async def test_a_dropped_complete_response_raises_api_connection_error() -> None:
    async with (
        FixtureServer([DropReply(chunks=("lost",))]) as server,
        openai_client(server) as client,
    ):
        with pytest.raises(openai.APIConnectionError) as raised:
            await client.chat.completions.create(model="gpt-test", messages=HI)
    assert isinstance(raised.value.__cause__, httpx2.RemoteProtocolError)


async def test_a_non_stream_request_gets_a_complete_completion() -> None:
    script: list[Reply] = [
        TextReply(chunks=("Hel", "lo"), finish="length", reasoning=("hm", "m")),
        ToolCallsReply(calls=(README_CALL,), usage=None),
    ]
    async with FixtureServer(script) as server, openai_client(server) as client:
        text = await client.chat.completions.create(model="gpt-test", messages=HI)
        tools = await client.chat.completions.create(model="gpt-test", messages=HI)

    assert text.object == "chat.completion"
    assert text.id == "chatcmpl-fixture-1"
    choice = text.choices[0]
    assert (choice.message.content, choice.finish_reason) == ("Hello", "length")
    assert choice.message.model_extra == {"reasoning_content": "hmm"}
    assert text.usage is not None
    assert text.usage.total_tokens == 18

    call_choice = tools.choices[0]
    assert call_choice.finish_reason == "tool_calls"
    assert call_choice.message.content is None
    assert call_choice.message.tool_calls is not None
    [call] = call_choice.message.tool_calls
    assert isinstance(call, openai.types.chat.ChatCompletionMessageFunctionToolCall)
    assert (call.id, call.function.name, call.function.arguments) == (
        "call_1",
        "read_file",
        '{"path": "README.md"}',
    )
    assert tools.usage is None


async def test_requests_and_headers_are_recorded_over_one_kept_alive_connection() -> None:
    script: list[Reply] = [TextReply(chunks=("a",)), TextReply(chunks=("b",))]
    async with FixtureServer(script) as server, openai_client(server) as client:
        first = await client.chat.completions.create(model="gpt-test", messages=HI, stream=True)
        _ = [chunk async for chunk in first]
        await client.chat.completions.create(
            model="gpt-test", messages=[*HI, {"role": "assistant", "content": "a"}]
        )

    assert [r.get("stream") for r in server.requests] == [True, None]
    assert server.requests[0]["messages"] == HI
    assert server.requests[1]["messages"][-1] == {"role": "assistant", "content": "a"}
    assert all(h["authorization"] == "Bearer sk-test" for h in server.headers)
    assert server.headers[0]["content-type"] == "application/json"
    assert server.connections == 1
    assert (server.pending, server.exhausted) == (0, 0)


async def test_respond_answers_once_the_script_is_empty_and_then_it_is_exhausted() -> None:
    def echo(body: Mapping[str, Any]) -> Reply:
        return TextReply(chunks=(f"echo {body['messages'][-1]['content']}",))

    async with (
        FixtureServer([TextReply(chunks=("scripted",))], respond=echo) as server,
        openai_client(server) as client,
    ):
        server.add(TextReply(chunks=("added",)))
        answers = [
            (await client.chat.completions.create(model="m", messages=HI))
            .choices[0]
            .message.content
            for _ in range(3)
        ]
    assert answers == ["scripted", "added", "echo hi"]
    assert server.exhausted == 0

    async with FixtureServer() as server, openai_client(server) as client:
        with pytest.raises(openai.InternalServerError) as raised:
            await client.chat.completions.create(model="m", messages=HI)
    assert raised.value.message == f"Error code: 500 - {EXHAUSTED_MESSAGE}"
    assert raised.value.code == "fixture_script_exhausted"
    assert server.exhausted == 1
    assert len(server.requests) == 1


async def test_any_other_path_is_a_404_and_is_not_recorded() -> None:
    async with (
        FixtureServer([TextReply(chunks=("unused",))]) as server,
        openai_client(server) as client,
    ):
        with pytest.raises(openai.NotFoundError) as raised:
            await client.models.list()
    assert raised.value.code == "unknown_url"
    assert (server.requests, server.pending) == ([], 1)


async def test_a_chunked_request_body_is_read_and_the_response_is_plain_http() -> None:
    body = json.dumps({"model": "m", "messages": HI}).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: fixture\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        + b"%x\r\n%s\r\n" % (10, body[:10])
        + b"%x;ext=1\r\n%s\r\n0\r\n\r\n" % (len(body) - 10, body[10:])
    )
    async with FixtureServer([TextReply(chunks=("ok",))]) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        writer.write(request)
        response = await reader.read()  # the server closes: the client asked for it
        writer.close()
        await writer.wait_closed()

    head, _, payload = response.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK"
    assert f"content-length: {len(payload)}" in lines
    assert json.loads(payload)["choices"][0]["message"]["content"] == "ok"
    assert server.requests == [{"model": "m", "messages": HI}]


async def test_closing_the_server_closes_a_kept_alive_connection() -> None:
    async with FixtureServer() as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: fixture\r\n\r\n")
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        assert head.startswith("HTTP/1.1 404 Not Found\r\n")
        length = next(
            int(line.partition(":")[2]) for line in head.split("\r\n") if "content-length" in line
        )
        await reader.readexactly(length)
        # The connection is open and idle, waiting for the next request, when the server closes.
    assert await reader.read() == b""
    writer.close()
    await writer.wait_closed()
    assert (server.connections, server.requests) == (1, [])


def test_the_base_url_needs_the_server_to_be_listening() -> None:
    with pytest.raises(RuntimeError, match="not listening"):
        _ = FixtureServer().base_url
    with pytest.raises(ValueError, match="pieces"):
        ToolCallsReply(calls=(README_CALL,), pieces=0)


# --- pydantic-ai's OpenAIChatModel ----------------------------------------------------------


async def stream_events(
    model: OpenAIChatModel, events: list[ModelResponseStreamEvent]
) -> tuple[Any, Any, Any]:
    """Stream one request, collecting its events; return (response, finish_reason, usage)."""
    async with model_request_stream(
        model, prompt(), model_request_parameters=with_tools()
    ) as stream:
        await collect(stream, events)
        return stream.get(), stream.finish_reason, stream.usage


async def test_pydantic_ai_streams_reasoning_then_text() -> None:
    reply = TextReply(chunks=("Hel", "lo"), reasoning=("think", "ing"))
    events: list[ModelResponseStreamEvent] = []
    async with FixtureServer([reply]) as server, chat_model(server) as model:
        response, finish, usage = await stream_events(model, events)

    assert events == [
        PartStartEvent(
            index=0,
            part=ThinkingPart(content="think", id="reasoning_content", provider_name="openai"),
            canonical_system="openai",
        ),
        PartDeltaEvent(index=0, delta=ThinkingPartDelta(content_delta="ing")),
        PartEndEvent(
            index=0,
            part=ThinkingPart(content="thinking", id="reasoning_content", provider_name="openai"),
            next_part_kind="text",
            canonical_system="openai",
        ),
        PartStartEvent(index=1, part=TextPart(content="Hel"), previous_part_kind="thinking"),
        FinalResultEvent(tool_name=None, tool_call_id=None),
        PartDeltaEvent(index=1, delta=TextPartDelta(content_delta="lo")),
        PartEndEvent(index=1, part=TextPart(content="Hello")),
    ]
    assert response.parts == [
        ThinkingPart(content="thinking", id="reasoning_content", provider_name="openai"),
        TextPart(content="Hello"),
    ]
    assert (finish, response.finish_reason) == ("stop", "stop")
    assert (usage.input_tokens, usage.output_tokens) == (11, 7)
    assert (response.model_name, response.provider_response_id) == (
        "fixture-model",
        "chatcmpl-fixture-1",
    )
    [sent] = server.requests
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert [tool["function"]["name"] for tool in sent["tools"]] == ["read_file"]


async def test_pydantic_ai_streams_a_tool_call_whose_arguments_arrive_split() -> None:
    reply = ToolCallsReply(calls=(README_CALL,), text="Let me look.")
    events: list[ModelResponseStreamEvent] = []
    async with FixtureServer([reply]) as server, chat_model(server) as model:
        response, finish, usage = await stream_events(model, events)

    call = ToolCallPart(tool_name="read_file", args='{"path": "README.md"}', tool_call_id="call_1")
    assert events == [
        PartStartEvent(index=0, part=TextPart(content="Let me look.")),
        FinalResultEvent(tool_name=None, tool_call_id=None),
        PartEndEvent(index=0, part=TextPart(content="Let me look."), next_part_kind="tool-call"),
        PartStartEvent(
            index=1,
            part=ToolCallPart(tool_name="read_file", args='{"path"', tool_call_id="call_1"),
            previous_part_kind="text",
        ),
        PartDeltaEvent(
            index=1, delta=ToolCallPartDelta(args_delta=': "READ', tool_call_id="call_1")
        ),
        PartDeltaEvent(
            index=1, delta=ToolCallPartDelta(args_delta='ME.md"}', tool_call_id="call_1")
        ),
        PartEndEvent(index=1, part=call),
    ]
    assert response.parts == [TextPart(content="Let me look."), call]
    assert call.args_as_dict() == {"path": "README.md"}
    assert (finish, response.provider_details["finish_reason"]) == ("tool_call", "tool_calls")
    assert (usage.input_tokens, usage.output_tokens) == (13, 5)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("raw", "mapped"),
    [("stop", "stop"), ("length", "length"), ("content_filter", "content_filter")],
)
async def test_pydantic_ai_maps_finish_reasons_and_a_direct_request_never_raises(
    raw: str, mapped: str
) -> None:
    events: list[ModelResponseStreamEvent] = []
    async with (
        FixtureServer([TextReply(chunks=("cut",), finish=raw, usage=None)]) as server,
        chat_model(server) as model,
    ):
        response, finish, usage = await stream_events(model, events)
    assert finish == mapped
    assert response.parts == [TextPart(content="cut")]
    assert response.provider_details["finish_reason"] == raw
    assert (usage.input_tokens, usage.output_tokens) == (0, 0)  # no usage chunk was sent


async def test_an_agent_raises_content_filter_error_only_when_nothing_else_came_back() -> None:
    script: list[Reply] = [
        TextReply(chunks=(), finish="content_filter"),
        TextReply(chunks=("partial",), finish="content_filter"),
        TextReply(chunks=("partial",), finish="content_filter"),
    ]
    async with FixtureServer(script) as server, chat_model(server) as model:
        with pytest.raises(ContentFilterError, match="Finish reason: 'content_filter'"):
            await Agent(model).run("hi")
        result = await Agent(model).run("hi")
        assert (result.output, result.response.finish_reason) == ("partial", "content_filter")
        with pytest.raises(ContentFilterError):
            await Agent(model, capabilities=[RaiseContentFilterError()]).run("hi")
    # Agent.run asks without streaming, and retries none of them.
    assert [request["stream"] for request in server.requests] == [False, False, False]


@pytest.mark.parametrize(
    ("reply", "category", "status", "code"),
    [
        (rate_limited(), ModelRateLimitError, 429, "rate_limit_exceeded"),
        (server_error(), ModelServerError, 500, None),
        (
            context_length_exceeded(),
            ModelContextWindowExceededError,
            400,
            "context_length_exceeded",
        ),
        (unauthorized(), ModelAuthenticationError, 401, "invalid_api_key"),
        (bad_request("Invalid value for 'temperature'."), ModelRequestRejectedError, 400, None),
    ],
    ids=["429", "500", "400-context", "401", "400"],
)
async def test_pydantic_ai_raises_the_error_category_of_each_status(
    reply: ErrorReply, category: type[ModelAPIError], status: int, code: str | None
) -> None:
    async with FixtureServer([reply]) as server, chat_model(server) as model:
        with pytest.raises(category) as raised:
            await stream_events(model, [])
    error = raised.value
    assert type(error).__name__ == category.__name__
    assert isinstance(error, ModelHTTPError)
    assert (error.status_code, error.provider_error_code, error.in_stream) == (status, code, False)
    assert isinstance(error.__cause__, openai.APIStatusError)
    assert len(server.requests) == 1


async def test_pydantic_ai_reads_retry_after_and_a_plain_400_is_no_narrower_category() -> None:
    async with (
        FixtureServer([rate_limited(), bad_request("Invalid 'temperature'.")]) as server,
        chat_model(server) as model,
    ):
        with pytest.raises(ModelRateLimitError) as limited:
            await stream_events(model, [])
        with pytest.raises(ModelRequestRejectedError) as rejected:
            await stream_events(model, [])
    assert limited.value.retry_after == 0.0
    assert not isinstance(
        rejected.value, ModelContextWindowExceededError | ModelAuthenticationError
    )


async def test_pydantic_ai_raises_model_connection_error_for_a_dropped_stream() -> None:
    events: list[ModelResponseStreamEvent] = []
    async with (
        FixtureServer([DropReply(chunks=("par", "tial"))]) as server,
        chat_model(server) as model,
    ):
        with pytest.raises(ModelConnectionError) as raised:
            await stream_events(model, events)
    error = raised.value
    assert not isinstance(error, ModelHTTPError)
    assert error.phase == "read"
    assert isinstance(error.__cause__, openai.APIConnectionError)
    assert isinstance(error.__cause__.__cause__, httpx2.RemoteProtocolError)
    assert events == [
        PartStartEvent(index=0, part=TextPart(content="par")),
        FinalResultEvent(tool_name=None, tool_call_id=None),
        PartDeltaEvent(index=0, delta=TextPartDelta(content_delta="tial")),
    ]


async def test_pydantic_ai_sees_an_exhausted_script_as_a_server_error() -> None:
    async with FixtureServer() as server, chat_model(server) as model:
        with pytest.raises(ModelServerError) as raised:
            await stream_events(model, [])
    assert raised.value.provider_error_code == "fixture_script_exhausted"
    assert server.exhausted == 1


async def test_the_openai_client_retries_under_pydantic_ai_when_allowed() -> None:
    # retry-after 0 would make the client back off 0.375-0.5 s; a 1 ms retry-after-ms is honoured.
    soon = rate_limited()
    soon = dataclasses.replace(soon, headers={**soon.headers, "retry-after-ms": "1"})
    async with (
        FixtureServer([soon, TextReply(chunks=("after",))]) as server,
        chat_model(server, max_retries=1) as model,
    ):
        response, finish, _ = await stream_events(model, [])
    assert (response.parts, finish) == ([TextPart(content="after")], "stop")
    assert [h["x-stainless-retry-count"] for h in server.headers] == ["0", "1"]


async def test_pydantic_ai_non_stream_request_maps_the_same_reply() -> None:
    script: list[Reply] = [
        ToolCallsReply(calls=(README_CALL,), text="Looking."),
        TextReply(chunks=("Hel", "lo"), reasoning=("hmm",)),
    ]
    async with FixtureServer(script) as server, chat_model(server) as model:
        calls = await model_request(model, prompt(), model_request_parameters=with_tools())
        text = await model_request(model, prompt())

    assert calls.parts == [
        TextPart(content="Looking."),
        ToolCallPart(tool_name="read_file", args='{"path": "README.md"}', tool_call_id="call_1"),
    ]
    assert (calls.finish_reason, calls.usage.input_tokens, calls.usage.output_tokens) == (
        "tool_call",
        13,
        5,
    )
    assert text.parts == [
        ThinkingPart(content="hmm", id="reasoning_content", provider_name="openai"),
        TextPart(content="Hello"),
    ]
    assert text.finish_reason == "stop"
    assert [request["stream"] for request in server.requests] == [False, False]
