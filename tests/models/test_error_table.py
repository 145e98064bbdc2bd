"""``docs/models.md``'s failure table, one case per row, over HTTP through the real clients.

Each row's reply is served by the scripted OpenAI-compatible server; the adapter talks to it
through pydantic-ai's OpenAI chat model and the ``openai`` client, inside a real engine. The
table is read from the document, so a row without a case (or a case without a row) fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent_session import Engine, EngineEvent
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


@pytest.mark.parametrize(("case", "documented_type", "documented_kind"), table_rows())
async def test_failure_table_row(case: str, documented_type: str, documented_kind: str) -> None:
    spec = CASES[case]
    events: list[EngineEvent] = []
    async with FixtureServer(spec.replies) as server:
        main = PydanticAIModel(
            "gpt-main", model_id="main", base_url=server.base_url, api_key=SECRET
        )
        backup = PydanticAIModel("gpt-backup", model_id="backup", base_url=server.base_url)
        async with (
            main,
            backup,
            Engine(
                store=MemoryStore(),
                models={"main": main, "backup": backup},
                fallbacks={"main": ["backup"]},
                tools={"shell": FunctionTool(shell)},
            ) as engine,
        ):
            engine.add_observer(events.append)
            session = await engine.open_session("s", model="main")
            session.send("build it")
            await session.wait_idle()
        assert server.pending == 0
        assert server.exhausted == 0
    failures = [e for e in events if isinstance(e, StreamFailed)]
    if spec.error is not None:
        [failed] = failures
        assert (failed.type, failed.kind.value) == spec.error
        assert (documented_type, documented_kind) == spec.error
        assert SECRET not in failed.message  # the key never reaches an event
        return
    assert not failures
    if case == "content-filter":
        [hop] = [e for e in events if isinstance(e, FellBack)]
        assert (hop.from_, hop.to) == ("main", "backup")
        assert documented_type == "refusal finish"
    else:
        [ended] = [e for e in events if isinstance(e, ToolCallEnded)]
        assert (ended.tool, ended.is_error) == ("deploy", True)
        assert documented_type == "tool error result"
    assert [e.finish.value for e in events if isinstance(e, StreamEnded)] == ["stop"]
