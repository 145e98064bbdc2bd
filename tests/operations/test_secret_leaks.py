"""Planted secrets never leave the engine as text (issue 12, ``docs/operations.md``, "Secrets").

Each credential shape of ``stream_manager.redaction.SHAPES`` is planted in a model's error, a
tool's error, a log line, an observer's failure and a receipt's explanation; the trace, a host
observer, the captured log, the stored receipt and ``turnkeeper inspect``/``receipts`` must
never show it. (The tool's error reaches the model as its call's result: history is the
conversation and keeps it.)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import msgspec
import pytest

from agent_session import Engine, EngineConfig, EngineEvent
from agent_session.harness.inspection import inspect_command, receipts_command
from agent_session.harness.trace import TraceRecorder
from persistence import MemoryStore, OperationRecord, OpState, SqliteStore
from stream_manager import (
    Capability,
    ErrorType,
    FunctionModel,
    ModelError,
    ModelRequest,
    ScriptStep,
    ScriptToolCall,
    StreamFailed,
    SystemClock,
    ToolCallPart,
    ToolContext,
    ToolKind,
    ToolResultPart,
)
from stream_manager._op_states import advance, requested
from stream_manager.redaction import SHAPES, Shape
from tests.store_kit import put_receipts
from tests.test_redaction import SECRETS

if TYPE_CHECKING:
    from pathlib import Path


class LeakyTool:
    """A client tool whose failure quotes a credential."""

    name, kind = "leaky", ToolKind.CLIENT

    def __init__(self, text: str) -> None:
        self.text = text

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        raise RuntimeError(f"upstream refused: {self.text}")


def leaky_model(text: str) -> FunctionModel:
    """Step 1 calls the leaky tool; step 2 fails with an error quoting the credential."""

    def step(request: ModelRequest) -> ScriptStep:
        if request.step == 1:
            return ScriptStep(tool_calls=(ScriptToolCall(tool="leaky"),))
        raise ModelError(ErrorType.PROVIDER_REJECTED, f"401 from provider: {text}")

    return FunctionModel("m", step)


def planted_receipt(text: str) -> OperationRecord:
    """A receipt whose explanation quotes the credential, moved through the lifecycle."""
    record = requested(
        op_id="s2/1/1/0",
        session="s2",
        stream="s2/1",
        call_id="c0",
        capability=Capability(ToolKind.CLIENT, "leaky"),
        target="client:leaky:0",
        now=1.0,
        deadline_at=None,
    )
    return advance(record, OpState.FAILED, now=2.0, explanation=f"tool said {text}")


def hand_edited_receipt(text: str) -> OperationRecord:
    """A stored receipt that never went through the engine (a hand edit, an older version)."""
    return OperationRecord(
        op_id="s3/1/1/0",
        session="s3",
        stream="s3/1",
        call_id="c0",
        capability=Capability(ToolKind.CLIENT, "leaky"),
        target="client:leaky:1",
        started_at=1.0,
        ended_at=2.0,
        state=OpState.FAILED,
        explanation=f"edited {text}",
    )


@pytest.mark.parametrize("shape", SHAPES, ids=[shape.name for shape in SHAPES])
async def test_a_planted_secret_reaches_no_trace_observer_log_receipt_or_printout(
    shape: Shape,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text, secret = shape.sample, SECRETS[shape.name]
    database = str(tmp_path / "agent.db")
    clock = SystemClock()
    trace = TraceRecorder(clock)
    seen: list[EngineEvent] = []

    def failing_observer(event: EngineEvent) -> None:
        if isinstance(event, StreamFailed):
            raise RuntimeError(f"observer choked on {text}")

    caplog.set_level(logging.DEBUG, logger="turnkeeper")
    async with Engine(
        store=SqliteStore(database),
        models={"m": leaky_model(text)},
        tools={"leaky": LeakyTool(text)},
        config=EngineConfig(max_stream_steps=4),
        clock=clock,
    ) as engine:
        engine.add_observer(trace)
        engine.add_observer(seen.append)
        engine.add_observer(failing_observer)
        session = await engine.open_session("s1", model="m")
        session.send("go")
        await session.wait_idle()
        logging.getLogger("turnkeeper.session").warning("planted %s", text)
        await put_receipts(engine.store, planted_receipt(text), hand_edited_receipt(text))
    failed = [event for event in seen if isinstance(event, StreamFailed)]
    assert failed, "the model's error must surface as a stream-error"
    assert "[redacted]" in failed[0].message

    stored = (await _receipts(database)).decode()
    capsys.readouterr()
    for as_json in (False, True):  # ``turnkeeper receipts`` and ``turnkeeper inspect``
        assert await receipts_command(database, None, as_json) == 0
        assert await inspect_command(database, None, as_json) == 0
    printed = capsys.readouterr()

    outputs = {
        "trace": trace.jsonl().decode(),
        "observer": msgspec.json.encode(seen).decode(),
        "log": caplog.text,
        "stored receipt": stored.split('"op_id":"s3/1/1/0"')[0],  # the engine-made one
        "printout": printed.out + printed.err,
    }
    leaked = [where for where, output in outputs.items() if secret in output]
    assert not leaked, f"{secret!r} leaked into {leaked}"
    assert "planted" in caplog.text  # the lines were logged, with the secret taken out
    assert "observer choked on" in caplog.text


async def _receipts(database: str) -> bytes:
    async with SqliteStore(database, readonly=True) as store:
        query = await store.receipts()
    return msgspec.json.encode(sorted(query.records, key=lambda r: r.op_id))


#: Plain words of a user's message: not credential-shaped, so only keeping row bodies out of
#: every log can hide them.
USER_TEXT = "my plain words quartz-harbour-7731"


def _logged(record: logging.LogRecord) -> str:
    """Everything a handler could write of ``record``."""
    return " ".join(
        (str(record.msg), repr(record.args), record.exc_text or "", record.stack_info or "")
    )


@pytest.mark.parametrize("aiosqlite_level", [None, logging.DEBUG], ids=["host-default", "opted-in"])
async def test_no_log_record_carries_a_row_body_or_the_owner_token(
    aiosqlite_level: int | None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A host's ``logging.basicConfig(level=DEBUG)``: aiosqlite's DEBUG log named every call
    with its arguments (the rows, the owner token); it stays quiet unless asked, and when asked
    it names the calls only."""
    secret = "token=FAKEleak0000"
    caplog.set_level(logging.DEBUG)  # the root logger, as basicConfig(level=DEBUG) sets it
    if aiosqlite_level is not None:
        caplog.set_level(aiosqlite_level, logger="aiosqlite")

    def step(request: ModelRequest) -> ScriptStep:
        return ScriptStep(text=f"echo {secret} {USER_TEXT}")

    store = SqliteStore(str(tmp_path / "agent.db"))
    async with Engine(
        store=store,
        models={"m": FunctionModel("m", step)},
        config=EngineConfig(max_stream_steps=2),
        clock=SystemClock(),
    ) as engine:
        owner = store.owner
        session = await engine.open_session("s1", model="m")
        session.send(f"{USER_TEXT} {secret}")
        await session.wait_idle()
    assert owner
    seen = {record.name for record in caplog.records}
    assert ("aiosqlite" in seen) == (aiosqlite_level is not None), seen
    for record in caplog.records:
        logged = _logged(record)
        for kept in (owner, "FAKEleak0000", USER_TEXT):
            assert kept not in logged, (record.name, logged[:300])


async def test_no_model_client_log_record_carries_the_prompt() -> None:
    """The openai client logs each request's options (the prompt) at DEBUG and its HTTP layer
    each request line at INFO: under a host's DEBUG root they stay quiet, and what they do log
    is redacted (``stream_manager.models.CLIENT_LOGGERS``)."""
    pytest.importorskip("pydantic_ai")
    from agent_session.harness.openai_fixture import FixtureServer, TextReply
    from stream_manager.models import CLIENT_LOGGERS, PydanticAIModel

    secret = "token=FAKEleak0001"
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    root, handler = logging.getLogger(), Keep(logging.DEBUG)
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)  # what logging.basicConfig(level=DEBUG) does
    try:
        async with FixtureServer([TextReply(chunks=("fine",))]) as server:
            model = PydanticAIModel("fixture-model", model_id="m", base_url=server.base_url)
            async with Engine(
                store=MemoryStore(),
                models={"m": model},
                config=EngineConfig(max_stream_steps=2),
                clock=SystemClock(),
            ) as engine:
                session = await engine.open_session("s1", model="m")
                session.send(f"{USER_TEXT} {secret}")
                await session.wait_idle()
            await model.aclose()
            assert len(server.requests) == 1
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    client_records = [r for r in records if r.name.split(".")[0] in CLIENT_LOGGERS]
    assert all(r.levelno >= logging.WARNING for r in client_records), client_records
    for record in records:
        logged = _logged(record)
        assert USER_TEXT not in logged, (record.name, logged[:300])
        assert "FAKEleak0001" not in logged, (record.name, logged[:300])
