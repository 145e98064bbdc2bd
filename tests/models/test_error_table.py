"""``docs/models.md``'s failure table, one case per row, over HTTP and through FunctionModel.

Over HTTP, each row's reply is served by the scripted OpenAI-compatible server; the adapter
talks to it through pydantic-ai's OpenAI chat model and the ``openai`` client, inside a real
engine with a fallback chain. The same rows then run through pydantic-ai's ``FunctionModel``,
raising what pydantic-ai raises for that failure. The table is read from the document, so a
row without a case (or a case without a row) fails. A planted key must reach no event and no
log line.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import exceptions as x
from pydantic_ai import messages as pm
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from agent_session import Engine, EngineConfig, EngineEvent
from agent_session.harness.openai_fixture import (
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
    request_timeout,
    server_error,
    unauthorized,
)
from persistence import MemoryStore
from stream_manager import (
    FellBack,
    FunctionTool,
    StreamEnded,
    StreamFailed,
    ToolCallEnded,
)
from stream_manager.models import PydanticAIModel

StreamFunction = Callable[[list[pm.ModelMessage], AgentInfo], AsyncIterator[Any]]

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"
SECRET = "sk-proj-Zq8vLmN4tR7wX2yB5cD9eF3gH6jK1pQs"


def _error(status: int, code: str, message: str) -> ErrorReply:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return ErrorReply(status=status, body=body, headers={"retry-after": "0"})


@dataclass(frozen=True)
class Case:
    replies: tuple[Reply, ...]
    #: The stream-error's (type, kind), or None when the stream ends without one.
    error: tuple[str, str] | None = None


CASES: dict[str, Case] = {
    "rate-limit": Case((rate_limited(),), ("rate_limited", "retryable")),
    "quota": Case(
        (_error(429, "insufficient_quota", "You exceeded your current quota."),),
        ("quota", "terminal"),
    ),
    "server-error": Case((server_error(),), ("provider_error", "retryable")),
    "overloaded": Case(
        (_error(503, "overloaded", "The engine is currently overloaded."),),
        ("provider_error", "retryable"),
    ),
    "request-timeout": Case((request_timeout(),), ("provider_error", "retryable")),
    "context-length": Case((context_length_exceeded(),), ("context_exceeded", "context_exceeded")),
    "auth": Case(
        (unauthorized(f"Incorrect API key provided: {SECRET}."),), ("authentication", "terminal")
    ),
    "model-not-found": Case(
        (_error(404, "model_not_found", "The model `gpt-x` does not exist."),),
        ("model_not_found", "terminal"),
    ),
    "bad-request": Case(
        (bad_request("Invalid 'messages[0].role'."),), ("provider_rejected", "terminal")
    ),
    "dropped": Case((DropReply(chunks=("The build ", "is")),), ("stream_truncated", "retryable")),
    "content-filter": Case(
        (TextReply(chunks=("I can't",), finish="content_filter"), TextReply(chunks=("Done.",))),
    ),
    "bad-arguments": Case(
        (ToolCallsReply(calls=(ToolCall(id="c1", name="shell", arguments='{"command": '),)),),
        ("malformed_output", "terminal"),
    ),
    "unknown-tool": Case(
        (
            ToolCallsReply(calls=(ToolCall(id="c1", name="deploy", arguments="{}"),)),
            TextReply(chunks=("There is no deploy tool.",)),
        ),
    ),
}


def table_rows() -> list[tuple[str, str, str]]:
    """(case, type, kind) of each row of the failure table in docs/models.md."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Failures", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        match = re.match(r"\| `([a-z-]+)` \|[^|]*\| ([^|]+) \| ([^|]+) \|", line)
        if match:
            rows.append((match[1], match[2].strip().strip("`"), match[3].strip()))
    return rows


def test_every_row_of_the_table_has_a_case_and_every_case_a_row() -> None:
    assert [row[0] for row in table_rows()] == list(CASES)


async def shell(command: str) -> str:
    """Run a shell command."""
    return "ran"


async def run_case(main: PydanticAIModel, backup: PydanticAIModel) -> list[EngineEvent]:
    """One turn on ``main`` (falling back to ``backup``); every event the engine told."""
    events: list[EngineEvent] = []
    async with (
        main,
        backup,
        Engine(
            store=MemoryStore(),
            models={"main": main, "backup": backup},
            fallbacks={"main": ["backup"]},
            tools={"shell": FunctionTool(shell)},
            # one attempt: the row's own outcome (no retry, no compaction of a context error)
            config=EngineConfig(auto_retry=False, compact_at=0.0),
        ) as engine,
    ):
        engine.add_observer(events.append)
        session = await engine.open_session("s", model="main")
        session.send("build it")
        await session.wait_idle()
    return events


def check_row(
    case: str,
    events: list[EngineEvent],
    documented: tuple[str, str],
    logs: pytest.LogCaptureFixture,
) -> None:
    """The row's outcome, as the table says it; the key in no event and no log line."""
    expected = CASES[case].error
    failures = [e for e in events if isinstance(e, StreamFailed)]
    assert all(SECRET not in repr(e) for e in events)
    assert SECRET not in logs.text
    if expected is not None:
        [failed] = failures
        assert (failed.type, failed.kind.value) == expected
        assert documented == expected
        return
    assert not failures
    if case == "content-filter":
        [hop] = [e for e in events if isinstance(e, FellBack)]
        assert (hop.from_, hop.to) == ("main", "backup")
        assert documented[0] == "refusal finish"
    else:
        [ended] = [e for e in events if isinstance(e, ToolCallEnded)]
        assert (ended.tool, ended.is_error) == ("deploy", True)
        assert documented[0] == "tool error result"
    assert [e.finish.value for e in events if isinstance(e, StreamEnded)] == ["stop"]


@pytest.mark.parametrize(("case", "documented_type", "documented_kind"), table_rows())
async def test_failure_table_row_over_http(
    case: str, documented_type: str, documented_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with FixtureServer(CASES[case].replies) as server:
        main = PydanticAIModel(
            "gpt-main", model_id="main", base_url=server.base_url, api_key=SECRET
        )
        backup = PydanticAIModel("gpt-backup", model_id="backup", base_url=server.base_url)
        events = await run_case(main, backup)
        assert server.pending == 0
        assert server.exhausted == 0
    assert all(h["authorization"] == f"Bearer {SECRET}" for h in server.headers[:1])
    check_row(case, events, (documented_type, documented_kind), caplog)


def _raises(error: Exception) -> StreamFunction:
    async def stream(messages: list[pm.ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        nothing: tuple[str, ...] = ()
        for part in nothing:  # an async generator that fails before its first part
            yield part
        raise error

    return stream


def _drops(messages: list[pm.ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
    async def stream() -> AsyncIterator[Any]:
        yield "The build "
        raise x.ModelConnectionError("gpt-main", "connection lost", phase="read")

    return stream()


def _calls(name: str, arguments: str) -> StreamFunction:
    async def stream(messages: list[pm.ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        if isinstance(messages[-1], pm.ModelRequest) and any(
            isinstance(p, pm.ToolReturnPart) for p in messages[-1].parts
        ):
            yield "There is no deploy tool."
            return
        yield {0: DeltaToolCall(name=name, json_args=arguments, tool_call_id="c1")}

    return stream


def _answers(text: str) -> StreamFunction:
    async def stream(messages: list[pm.ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        yield text

    return stream


#: The same rows through pydantic-ai's ``FunctionModel``: what the provider's failure becomes
#: inside pydantic-ai (its categorized exceptions), no HTTP.
FUNCTION_CASES: dict[str, StreamFunction] = {
    "rate-limit": _raises(x.ModelRateLimitError("gpt-main", "Rate limit reached")),
    "quota": _raises(x.ModelQuotaExceededError("gpt-main", "You exceeded your current quota.")),
    "server-error": _raises(x.ModelServerError("gpt-main", "Internal server error")),
    "overloaded": _raises(x.ModelOverloadedError("gpt-main", "The engine is overloaded.")),
    "request-timeout": _raises(x.ModelHTTPError(408, "gpt-main", {"message": "timed out"})),
    "context-length": _raises(
        x.ModelContextWindowExceededError("gpt-main", "maximum context length exceeded")
    ),
    "auth": _raises(x.ModelAuthenticationError("gpt-main", f"Incorrect API key: {SECRET}")),
    "model-not-found": _raises(x.ModelNotFoundError("gpt-main", "no model gpt-main")),
    "bad-request": _raises(x.ModelRequestRejectedError("gpt-main", "Invalid role.")),
    "dropped": _drops,
    "content-filter": _raises(x.ContentFilterError("content filter triggered")),
    "bad-arguments": _calls("shell", '{"command": '),
    "unknown-tool": _calls("deploy", "{}"),
}


def test_every_row_runs_through_the_function_model_too() -> None:
    assert list(FUNCTION_CASES) == list(CASES)


@pytest.mark.parametrize(("case", "documented_type", "documented_kind"), table_rows())
async def test_failure_table_row_through_function_model(
    case: str, documented_type: str, documented_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    main = PydanticAIModel(FunctionModel(stream_function=FUNCTION_CASES[case]), model_id="main")
    backup = PydanticAIModel(FunctionModel(stream_function=_answers("Done.")), model_id="backup")
    events = await run_case(main, backup)
    check_row(case, events, (documented_type, documented_kind), caplog)
