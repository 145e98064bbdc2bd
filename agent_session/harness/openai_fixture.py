"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for tests of real clients.

The official ``openai`` client and pydantic-ai's ``OpenAIChatModel`` talk to it over real HTTP,
so a test covers their parsing, streaming, error mapping and connection handling, with no
network beyond the loopback and no dependency beyond the standard library.

A test scripts the replies, in order, and points a client at ``server.base_url``::

    async with FixtureServer([TextReply(chunks=("Hel", "lo"))]) as server:
        client = AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        ...
    assert server.requests[0]["messages"] == [...]

Each ``POST /v1/chat/completions`` takes the next scripted reply; the ``respond`` callback, if
given, answers once the script is empty; with neither, the answer is a 500 that says the fixture
script is exhausted (counted in ``server.exhausted``). A request with ``"stream": true`` gets
``chat.completion.chunk`` events over server-sent events in a chunked HTTP body; any other gets
one ``chat.completion`` object built from the same reply. Ids, ``created`` stamps and request
ids are counters, so two runs of a test see the same bytes.

The reply kinds:

* ``TextReply``: text in chunks, optionally after reasoning chunks, then a finish reason and usage.
* ``ToolCallsReply``: optional text, then tool calls whose arguments arrive split across chunks.
* ``ErrorReply``: a JSON error with a status and headers; ``rate_limited()``,
  ``server_error()``, ``context_length_exceeded()``, ``unauthorized()``, ``bad_request()`` and
  ``request_timeout()`` build realistic OpenAI (or gateway) ones.
* ``DropReply``: a stream that starts (status 200, some text) and then loses its connection, with
  no final zero-length chunk and no ``data: [DONE]``.

Reasoning: pydantic-ai's ``OpenAIChatModel`` (2.68.0) reads a streamed delta's thinking from the
profile's ``openai_chat_thinking_field`` if set, else from ``reasoning``, else from
``reasoning_content`` (the first non-empty one wins), and a complete message's the same way. The
server sends ``reasoning_content`` (DeepSeek's and Moonshot's field), which pydantic-ai turns into
a ``ThinkingPart`` with ``id="reasoning_content"``.

HTTP is plain HTTP/1.1 on ``asyncio.start_server``: a connection serves requests until the
client closes it (keep-alive); a request has a ``Content-Length`` or chunked body; a stream is
sent with ``Transfer-Encoding: chunked``, anything else with ``Content-Length``. Leaving the
context manager closes the listening socket and every open connection and waits for their
tasks, so nothing is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import Any, Self, TypeAlias, assert_never

#: The one path the server answers; every other gets a 404.
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
#: The message of the 500 a request gets when nothing is left to answer it.
EXHAUSTED_MESSAGE = "fixture script exhausted"
#: ``created`` of the first response; each later response adds one (no clock is read).
_CREATED_BASE = 1_700_000_000
#: The errors that mean a client went away or sent something that is not HTTP.
_CONNECTION_ENDS = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError)


@dataclass(frozen=True, slots=True, kw_only=True)
class TextReply:
    """A text answer, streamed one delta per chunk.

    Attributes:
        chunks: The text, one ``delta.content`` chunk each, in order.
        finish: The ``finish_reason``, e.g. ``"stop"``, ``"length"`` or ``"content_filter"``.
        usage: ``(prompt_tokens, completion_tokens)``, sent as a final ``choices: []`` chunk
            (and in a complete response's ``usage``); ``None`` sends no usage.
        reasoning: Reasoning text, streamed as ``delta.reasoning_content`` chunks before the
            text (joined into ``message.reasoning_content`` in a complete response).
    """

    chunks: tuple[str, ...]
    finish: str = "stop"
    usage: tuple[int, int] | None = (11, 7)
    reasoning: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """One function call of a ``ToolCallsReply``.

    Attributes:
        id: The call id, e.g. ``"call_1"``.
        name: The function name.
        arguments: The arguments as the JSON text the model would send (not checked).
    """

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallsReply:
    """Tool calls, each streamed as tool-call deltas with its arguments split across chunks.

    The call at position ``i`` has ``index`` ``i``. Its arguments are cut into ``pieces`` parts
    as equal as can be: the first delta carries the index, id, ``type: "function"``, the name
    and the first part; each following non-empty part is a chunk of its own.

    Attributes:
        calls: The calls, in order.
        text: Text streamed as one ``delta.content`` chunk before the calls, if any.
        pieces: How many parts each call's arguments are cut into (at least 1).
        finish: The ``finish_reason``.
        usage: ``(prompt_tokens, completion_tokens)``, or ``None`` for no usage.
    """

    calls: tuple[ToolCall, ...]
    text: str | None = None
    pieces: int = 3
    finish: str = "tool_calls"
    usage: tuple[int, int] | None = (13, 5)

    def __post_init__(self) -> None:
        if self.pieces < 1:
            raise ValueError(f"pieces must be at least 1, not {self.pieces}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorReply:
    """A JSON error response, the same whether the request asked for a stream or not.

    Attributes:
        status: The HTTP status, e.g. 429.
        body: The JSON body, e.g. ``{"error": {"message": ..., "type": ..., "code": ...}}``.
        headers: Extra response headers, e.g. ``{"retry-after": "0"}``.
    """

    status: int
    body: Mapping[str, object]
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class DropReply:
    """A response that breaks off: status 200, these text chunks, then the connection closes.

    A stream gets no final zero-length HTTP chunk and no ``data: [DONE]``; a complete
    (non-stream) request gets half of the body its ``Content-Length`` announces.

    Attributes:
        chunks: The text streamed before the connection is lost.
    """

    chunks: tuple[str, ...]


Reply: TypeAlias = TextReply | ToolCallsReply | ErrorReply | DropReply


def _error_body(
    message: str, error_type: str, *, code: str | None = None, param: str | None = None
) -> dict[str, object]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def rate_limited(retry_after_ms: int | None = None) -> ErrorReply:
    """A 429 with ``code: rate_limit_exceeded`` and ``retry-after: 0``, as OpenAI sends it.

    Args:
        retry_after_ms: Also send ``retry-after-ms`` (what the ``openai`` client and
            pydantic-ai read first), asking the caller to wait that long.

    Returns:
        The error reply.
    """
    message = (
        "Rate limit reached for fixture-model in organization org-fixture on requests per min "
        "(RPM): Limit 3, Used 3, Requested 1. Please try again in 0s."
    )
    return ErrorReply(
        status=429,
        body=_error_body(message, "requests", code="rate_limit_exceeded"),
        headers={
            "retry-after": "0",
            "x-ratelimit-limit-requests": "3",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "0s",
            **({} if retry_after_ms is None else {"retry-after-ms": str(retry_after_ms)}),
        },
    )


def service_unavailable() -> ErrorReply:
    """A 503 "engine overloaded", as OpenAI sends it under load (a burst is several).

    Returns:
        The error reply.
    """
    message = "The engine is currently overloaded, please try again later."
    return ErrorReply(status=503, body=_error_body(message, "server_error"))


def server_error() -> ErrorReply:
    """A 500 with OpenAI's ``server_error`` body.

    Returns:
        The error reply.
    """
    message = (
        "The server had an error while processing your request. Sorry about that! You can retry "
        "your request, or contact us through our help center if the error persists."
    )
    return ErrorReply(status=500, body=_error_body(message, "server_error"))


def request_timeout() -> ErrorReply:
    """A 408 ``Request Timeout``, as a gateway in front of a model sends a request it gave up on.

    pydantic-ai (2.68.0) puts a 408 in no error category: it raises a plain ``ModelHTTPError``.

    Returns:
        The error reply.
    """
    message = "The server timed out waiting for the request to complete."
    return ErrorReply(status=408, body=_error_body(message, "timeout", code="request_timeout"))


def context_length_exceeded() -> ErrorReply:
    """A 400 with ``code: context_length_exceeded``, as OpenAI sends an overlong prompt.

    Returns:
        The error reply.
    """
    message = (
        "This model's maximum context length is 128000 tokens. However, your messages resulted "
        "in 130517 tokens. Please reduce the length of the messages."
    )
    return ErrorReply(
        status=400,
        body=_error_body(
            message, "invalid_request_error", code="context_length_exceeded", param="messages"
        ),
    )


def unauthorized(
    message: str = (
        "Incorrect API key provided: sk-test. You can find your API key at "
        "https://platform.openai.com/account/api-keys."
    ),
) -> ErrorReply:
    """A 401 with ``code: invalid_api_key``.

    Args:
        message: The error message.

    Returns:
        The error reply.
    """
    return ErrorReply(
        status=401, body=_error_body(message, "invalid_request_error", code="invalid_api_key")
    )


def bad_request(message: str) -> ErrorReply:
    """A 400 ``invalid_request_error`` with no code.

    Args:
        message: The error message.

    Returns:
        The error reply.
    """
    return ErrorReply(status=400, body=_error_body(message, "invalid_request_error"))


def history_refusal(messages: object) -> dict[str, object] | None:
    """The 400 the real chat-completions API answers a history with, or ``None`` if it is sound.

    The API refuses an assistant message with ``tool_calls`` that is not followed, at once, by
    a ``tool`` message answering each of its ``tool_call_id`` s, and a ``tool`` message that
    answers no call of the assistant message before it. (Anthropic's API refuses a ``tool_use``
    without its ``tool_result`` the same way.)
    """
    if not isinstance(messages, list):
        return _error_body("'messages' is a required property", "invalid_request_error")
    owed: list[str] = []  # the calls of the last assistant message not yet answered
    owed_at = 0
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "tool":
            call = message.get("tool_call_id")
            if call not in owed:
                return _error_body(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    "invalid_request_error",
                    param=f"messages.[{index}].role",
                )
            owed.remove(call)
            continue
        if owed:
            return _unanswered(owed, owed_at)
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls:
            owed = [str(c.get("id")) for c in calls if isinstance(c, dict)]
            owed_at = index
    return _unanswered(owed, owed_at) if owed else None


def _unanswered(calls: list[str], index: int) -> dict[str, object]:
    return _error_body(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to "
        "each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        + ", ".join(str(c) for c in calls),
        "invalid_request_error",
        param=f"messages.[{index}].role",
    )


def _split(text: str, pieces: int) -> list[str]:
    """``text`` cut into ``pieces`` consecutive parts whose lengths differ by at most one."""
    size, extra = divmod(len(text), pieces)
    bounds = list(itertools.accumulate((size + (i < extra) for i in range(pieces)), initial=0))
    return [text[start:end] for start, end in itertools.pairwise(bounds)]


def _usage(usage: tuple[int, int]) -> dict[str, int]:
    prompt, completion = usage
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _deltas(reply: TextReply | ToolCallsReply | DropReply) -> Iterator[dict[str, object]]:
    """The ``delta`` of each choice chunk of a stream, before the one with the finish reason."""
    yield {"role": "assistant", "content": "", "refusal": None}
    if isinstance(reply, ToolCallsReply):
        if reply.text:
            yield {"content": reply.text}
        for index, call in enumerate(reply.calls):
            first, *rest = _split(call.arguments, reply.pieces)
            function = {"name": call.name, "arguments": first}
            yield {
                "tool_calls": [
                    {"index": index, "id": call.id, "type": "function", "function": function}
                ]
            }
            for part in filter(None, rest):
                yield {"tool_calls": [{"index": index, "function": {"arguments": part}}]}
        return
    if isinstance(reply, TextReply):
        for piece in reply.reasoning:
            yield {"reasoning_content": piece}
    for piece in reply.chunks:
        yield {"content": piece}


def _message(reply: TextReply | ToolCallsReply | DropReply) -> dict[str, object]:
    """The ``message`` of a complete (non-stream) response."""
    if isinstance(reply, ToolCallsReply):
        calls = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in reply.calls
        ]
        return {"role": "assistant", "content": reply.text, "refusal": None, "tool_calls": calls}
    message: dict[str, object] = {
        "role": "assistant",
        "content": "".join(reply.chunks),
        "refusal": None,
    }
    if isinstance(reply, TextReply) and reply.reasoning:
        message["reasoning_content"] = "".join(reply.reasoning)
    return message


@dataclass(slots=True)
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class _MalformedRequestError(Exception):
    """What a client sent is not an HTTP/1.1 request this server understands."""


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    """The next request on a connection, or ``None`` once the client has closed it.

    Raises:
        _MalformedRequestError: If the request line, a length or a chunk size does not parse.
    """
    try:
        return await _parse_request(reader)
    except ValueError as error:  # a bad request line, Content-Length or chunk size
        raise _MalformedRequestError(str(error)) from error


async def _parse_request(reader: asyncio.StreamReader) -> _Request | None:
    line = await reader.readline()
    if not line.endswith(b"\n"):
        return None
    method, target, _version = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (raw := await reader.readline()) not in (b"\r\n", b"\n"):
        if not raw:
            raise asyncio.IncompleteReadError(raw, None)
        name, _, value = raw.decode("latin-1").partition(":")
        key, value = name.strip().lower(), value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return _Request(method, target.partition("?")[0], headers, body)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while size := int((await reader.readuntil(b"\n")).partition(b";")[0].strip(), 16):
        parts.append(await reader.readexactly(size))
        await reader.readuntil(b"\n")
    while (await reader.readuntil(b"\n")).strip():  # trailers, up to the blank line
        pass
    return b"".join(parts)


def _head(status: int, headers: Mapping[str, str]) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    lines = [f"HTTP/1.1 {status} {phrase}", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode("latin-1")


def _frame(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked HTTP body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(payload: object) -> bytes:
    """One server-sent event carrying ``payload`` (JSON, or the text itself for ``[DONE]``)."""
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


class FixtureServer:
    """A scripted OpenAI-compatible chat-completions server on 127.0.0.1 (an async context manager).

    Attributes:
        requests: The JSON body of each ``POST /v1/chat/completions``, in arrival order.
        headers: The headers of those requests, names lower-cased, in the same order.
        exhausted: How many requests found nothing to answer them (and got a 500).
        refused: How many requests the real API would refuse got its 400 (``history_refusal``).
        connections: How many connections clients opened (keep-alive reuses one).
        model: The model name the responses carry.
    """

    def __init__(
        self,
        replies: Iterable[Reply] = (),
        *,
        respond: Callable[[Mapping[str, Any]], Reply] | None = None,
        model: str = "fixture-model",
    ) -> None:
        """Script a server; it listens from ``__aenter__`` on.

        Args:
            replies: The replies, in the order the requests will get them.
            respond: Called with a request's body to answer it once the script is empty.
            model: The ``model`` of every response.
        """
        self.requests: list[Mapping[str, Any]] = []
        self.headers: list[Mapping[str, str]] = []
        self.exhausted = 0
        self.refused = 0
        self.connections = 0
        self.model = model
        self._script: deque[Reply] = deque(replies)
        self._respond = respond
        self._responses = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._closing = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def base_url(self) -> str:
        """The URL to give a client, ``http://127.0.0.1:PORT/v1``.

        Raises:
            RuntimeError: If the server is not listening yet.
        """
        if self._port is None:
            raise RuntimeError("the fixture server is not listening: use `async with`")
        return f"http://127.0.0.1:{self._port}/v1"

    @property
    def pending(self) -> int:
        """How many scripted replies are still unused."""
        return len(self._script)

    def add(self, *replies: Reply) -> None:
        """Append replies to the script.

        Args:
            replies: The replies, in order, after those already scripted.
        """
        self._script.extend(replies)

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._closing = True
        server.close()
        # Aborting a connection wakes its task (its read sees the end, its write the loss), which
        # then ends by itself: cancelling it instead would trip asyncio's own done-callback.
        for writer in self._writers:
            writer.transport.abort()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        try:
            while not self._closing and (request := await _read_request(reader)) is not None:
                keep_open = await self._answer(request, writer)
                if not keep_open or request.headers.get("connection", "").lower() == "close":
                    break
        except (*_CONNECTION_ENDS, _MalformedRequestError):
            pass  # the client went away, or sent something that is not HTTP: the connection ends
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _answer(self, request: _Request, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; whether the connection stays open for the next."""
        if request.method != "POST" or request.path != CHAT_COMPLETIONS_PATH:
            message = f"Unknown request URL: {request.method} {request.path}."
            body = _error_body(message, "invalid_request_error", code="unknown_url")
            await self._send_json(writer, 404, body)
            return True
        try:
            payload: object = json.loads(request.body)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            message = "We could not parse the JSON body of your request."
            await self._send_json(writer, 400, _error_body(message, "invalid_request_error"))
            return True
        self.requests.append(payload)
        self.headers.append(request.headers)
        refusal = history_refusal(payload.get("messages"))
        if refusal is not None:  # what the real API refuses takes no reply of the script
            self.refused += 1
            await self._send_json(writer, 400, refusal)
            return True
        reply = self._next_reply(payload)
        if reply is None:
            self.exhausted += 1
            body = _error_body(EXHAUSTED_MESSAGE, "fixture_error", code="fixture_script_exhausted")
            await self._send_json(writer, 500, body)
            return True
        return await self._send_reply(writer, reply, stream=payload.get("stream") is True)

    def _next_reply(self, payload: Mapping[str, Any]) -> Reply | None:
        if self._script:
            return self._script.popleft()
        if self._respond is not None:
            return self._respond(payload)
        return None

    async def _send_reply(
        self, writer: asyncio.StreamWriter, reply: Reply, *, stream: bool
    ) -> bool:
        if isinstance(reply, ErrorReply):
            await self._send_json(writer, reply.status, reply.body, reply.headers)
            return True
        number = next(self._responses)
        if isinstance(reply, DropReply):
            await self._drop(writer, number, reply, stream=stream)
            return False
        if isinstance(reply, TextReply | ToolCallsReply):
            if stream:
                await self._send_stream(writer, number, reply)
            else:
                await self._send_json(writer, 200, self._completion(number, reply))
            return True
        assert_never(reply)

    async def _send_json(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: Mapping[str, object],
        extra: Mapping[str, str] | None = None,
    ) -> None:
        data = json.dumps(body).encode()
        headers = {
            "content-type": "application/json",
            "content-length": str(len(data)),
            "connection": "keep-alive",
            **(extra or {}),
        }
        writer.write(_head(status, headers) + data)
        await writer.drain()

    async def _send_stream(
        self, writer: asyncio.StreamWriter, number: int, reply: TextReply | ToolCallsReply
    ) -> None:
        await self._start_stream(writer, number, reply)
        writer.write(_frame(_event(self._chunk(number, {}, finish=reply.finish))))
        if reply.usage is not None:
            writer.write(_frame(_event(self._chunk(number, None, usage=reply.usage))))
        writer.write(_frame(_event("[DONE]")) + b"0\r\n\r\n")
        await writer.drain()

    async def _start_stream(
        self,
        writer: asyncio.StreamWriter,
        number: int,
        reply: TextReply | ToolCallsReply | DropReply,
    ) -> None:
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "transfer-encoding": "chunked",
            "cache-control": "no-cache",
            "connection": "keep-alive",
            "x-request-id": f"req_fixture_{number}",
        }
        writer.write(_head(200, headers))
        for delta in _deltas(reply):
            writer.write(_frame(_event(self._chunk(number, delta))))
            await writer.drain()

    async def _drop(
        self, writer: asyncio.StreamWriter, number: int, reply: DropReply, *, stream: bool
    ) -> None:
        """Send the start of a response, then close the connection (flushing what was written)."""
        if stream:
            await self._start_stream(writer, number, reply)
        else:
            data = json.dumps(self._completion(number, reply)).encode()
            headers = {"content-type": "application/json", "content-length": str(len(data))}
            writer.write(_head(200, headers) + data[: len(data) // 2])
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    def _chunk(
        self,
        number: int,
        delta: dict[str, object] | None,
        *,
        finish: str | None = None,
        usage: tuple[int, int] | None = None,
    ) -> dict[str, object]:
        """A ``chat.completion.chunk``; ``delta=None`` makes the ``choices: []`` usage chunk."""
        choices = (
            []
            if delta is None
            else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        )
        return {
            "id": f"chatcmpl-fixture-{number}",
            "object": "chat.completion.chunk",
            "created": _CREATED_BASE + number,
            "model": self.model,
            "system_fingerprint": "fp_fixture",
            "choices": choices,
            "usage": None if usage is None else _usage(usage),
        }

    def _completion(
        self, number: int, reply: TextReply | ToolCallsReply | DropReply
    ) -> dict[str, object]:
        """A complete ``chat.completion`` object."""
        finish = "stop" if isinstance(reply, DropReply) else reply.finish
        usage = None if isinstance(reply, DropReply) else reply.usage
        completion: dict[str, object] = {
            "id": f"chatcmpl-fixture-{number}",
            "object": "chat.completion",
            "created": _CREATED_BASE + number,
            "model": self.model,
            "system_fingerprint": "fp_fixture",
            "choices": [
                {"index": 0, "message": _message(reply), "logprobs": None, "finish_reason": finish}
            ],
        }
        if usage is not None:
            completion["usage"] = _usage(usage)
        return completion
