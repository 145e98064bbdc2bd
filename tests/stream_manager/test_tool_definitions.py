"""Tool definitions in the ports: what a model is told, the arguments check, usage per step.

A tool declares a description and a JSON schema (``definition``), or gets an open one; every
model request carries the definitions of the tools the engine offers; arguments a schema
refuses never reach ``execute`` and become a structured error the model sees, with a failed
receipt; a model's reported usage is a ``usage`` event after its ``step``.
"""

from __future__ import annotations

from typing import Literal

import pydantic
import pytest

from persistence import MemoryStore, UsageError
from stream_manager import (
    Ended,
    Finish,
    FinishReason,
    FunctionModel,
    FunctionTool,
    OperationStarted,
    ReceiptWritten,
    ScriptStep,
    ScriptToolCall,
    StepCompleted,
    StepUsage,
    StreamManager,
    StreamRequest,
    TextPart,
    Tool,
    ToolCallPart,
    ToolContext,
    ToolDefinition,
    ToolKind,
    ToolResultPart,
    Usage,
    VirtualClock,
)
from tests.stream_manager.support import FakeTool, Recorder, user_messages

READ_FILE = ToolDefinition(
    name="read_file",
    description="Read a file of the workspace.",
    parameters={
        "type": "object",
        "properties": {"path": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
        "required": ["path"],
        "additionalProperties": False,
    },
)


class DeclaredTool(FakeTool):
    """A fake tool that declares ``READ_FILE``."""

    @property
    def definition(self) -> ToolDefinition:
        return READ_FILE


def _steps(*steps: ScriptStep) -> FunctionModel:
    """A model that plays ``steps`` in order and records every request."""
    queue = list(steps)
    return FunctionModel("claude-fixture", lambda request: queue.pop(0))


def _manager(model: FunctionModel, *tools: Tool) -> tuple[StreamManager, Recorder]:
    recorder = Recorder()
    manager = StreamManager(
        models={model.id: model},
        tools={t.name: t for t in tools},
        clock=VirtualClock(),
        observers=[recorder],
    )
    return manager, recorder


async def _run(manager: StreamManager, model: str) -> Ended:
    outcome = await manager.start_stream(
        StreamRequest(session="s9", model=model, messages=user_messages("look"))
    )
    assert isinstance(outcome, Ended), outcome
    return outcome


async def test_every_request_carries_the_offered_tools_definitions_in_order() -> None:
    async def grep(pattern: str, max_hits: int = 20) -> list[str]:
        """Search the workspace for a pattern."""
        return [pattern] * min(max_hits, 1)

    model = _steps(ScriptStep(text="nothing to do"))
    shell = FakeTool("shell")
    manager, _ = _manager(model, DeclaredTool("read_file"), FunctionTool(grep), shell)
    await _run(manager, model.id)
    [request] = model.requests
    names = [d.name for d in request.tools]
    assert names == ["read_file", "grep", "shell"]
    read, found, open_ = request.tools
    assert read == READ_FILE
    assert found.description == "Search the workspace for a pattern."
    assert found.parameters["required"] == ["pattern"]
    properties = found.parameters["properties"]
    assert isinstance(properties, dict)
    assert properties["max_hits"]["default"] == 20
    assert open_ == ToolDefinition(name="shell")  # declares nothing: any object, no description
    assert open_.parameters == {"type": "object"}


async def test_a_provider_tool_is_offered_with_its_kind() -> None:
    model = _steps(ScriptStep(text="ok"))
    manager, _ = _manager(model, FakeTool("web_search", kind=ToolKind.PROVIDER))
    await _run(manager, model.id)
    assert model.requests[0].tools[0].kind is ToolKind.PROVIDER


async def test_arguments_the_schema_refuses_never_run_and_the_model_sees_why() -> None:
    tool = DeclaredTool("read_file")
    model = _steps(
        ScriptStep(tool_calls=(ScriptToolCall(tool="read_file", args={"path": 7, "limit": 0}),)),
        ScriptStep(text="I will fix the arguments."),
    )
    manager, recorder = _manager(model, tool)
    outcome = await _run(manager, model.id)
    assert tool.calls == []  # execute never ran
    [result] = [p for p in outcome.parts if isinstance(p, ToolResultPart)]
    assert result.is_error
    assert result.output == {
        "error": "invalid_arguments",
        "problems": [
            "$.limit: 0 is less than the minimum of 1",
            "$.path: 7 is not of type 'string'",
        ],
    }
    [failed] = [e for e in recorder.of(ReceiptWritten) if e.state == "failed"]
    assert failed.tool == "read_file"
    # The loop went on: the model's next request carries the error as the tool's result.
    assert len(model.requests) == 2
    tool_message = model.requests[1].messages[-1]
    assert tool_message.tool_results[0].output == result.output


async def test_valid_arguments_run_the_declared_tool() -> None:
    tool = DeclaredTool("read_file", output="contents")
    model = _steps(
        ScriptStep(tool_calls=(ScriptToolCall(tool="read_file", args={"path": "a.py"}),)),
        ScriptStep(text="read it"),
    )
    manager, _ = _manager(model, tool)
    await _run(manager, model.id)
    assert [c.args for c in tool.calls] == [{"path": "a.py"}]


async def test_an_invalid_arguments_receipt_names_its_outcome() -> None:
    store = MemoryStore.opened()
    model = _steps(
        ScriptStep(tool_calls=(ScriptToolCall(tool="read_file", args={}),)),
        ScriptStep(text="ok"),
    )
    manager = StreamManager(
        models={model.id: model},
        tools={"read_file": DeclaredTool("read_file")},
        clock=VirtualClock(),
        store=store,
    )
    await _run(manager, model.id)
    [receipt] = (await store.receipts()).records
    assert (receipt.state, receipt.outcome_code) == ("failed", "invalid_arguments")
    assert receipt.explanation == "not run: its arguments failed the tool's schema"


async def test_a_function_tool_validates_into_its_types_and_returns_its_output() -> None:
    async def shell(command: str, timeout_s: float = 30.0, mode: Literal["ro", "rw"] = "ro") -> str:
        """Run a shell command."""
        return f"{command} in {timeout_s:g}s ({mode})"

    tool = FunctionTool(shell, name="sh")
    assert tool.definition.name == "sh"
    assert tool.definition.parameters["required"] == ["command"]
    context = ToolContext(session="s", stream="s/1", op_id="s/1/1/0", deadline_at=60.0)
    ok = await tool.execute(ToolCallPart(call_id="c", name="sh", args={"command": "ls"}), context)
    assert ok.output == "ls in 30s (ro)"
    bad = await tool.execute(
        ToolCallPart(call_id="c", name="sh", args={"command": "ls", "mode": "x"}), context
    )
    assert bad.is_error
    assert isinstance(bad.output, dict)
    assert bad.output["error"] == "invalid_arguments"


def test_a_definition_from_a_pydantic_model() -> None:
    class Edit(pydantic.BaseModel):
        """Replace text in a file."""

        path: str
        old: str
        new: str

    definition = ToolDefinition.from_model("edit", Edit)
    assert definition.description == "Replace text in a file."
    assert definition.parameters["required"] == ["path", "old", "new"]


@pytest.mark.parametrize(
    ("definition", "message"),
    [
        ("not a definition", "definition must be a ToolDefinition, not str"),
        (ToolDefinition(name="other"), "its definition is named 'other'"),
        (
            ToolDefinition(name="read_file", parameters={"type": "strng"}),
            "its parameters are not a JSON schema",
        ),
    ],
)
def test_a_bad_declared_definition_is_refused_when_the_engine_is_built(
    definition: object, message: str
) -> None:
    class Bad(FakeTool):
        @property
        def definition(self) -> object:
            return definition

    with pytest.raises(UsageError, match=message):
        StreamManager(models={}, tools={"read_file": Bad("read_file")}, clock=VirtualClock())


def test_a_function_tool_needs_an_async_typed_function() -> None:
    def sync() -> None: ...

    async def untyped(x) -> None: ...  # type: ignore[no-untyped-def]

    with pytest.raises(UsageError, match="needs an async function"):
        FunctionTool(sync)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="parameter 'x' has no type"):
        FunctionTool(untyped)


async def test_usage_a_model_reports_follows_its_step_under_the_model_that_ran_it() -> None:
    model = FunctionModel(
        "gpt-fixture",
        lambda request: [
            TextPart(text="hi"),
            Finish(reason=FinishReason.STOP, usage=Usage(input_tokens=321, output_tokens=45)),
        ],
    )
    manager, recorder = _manager(model)
    await _run(manager, model.id)
    names = recorder.names()
    assert names[names.index("step") + 1] == "usage"
    [usage] = recorder.of(StepUsage)
    [step] = recorder.of(StepCompleted)
    assert (usage.stream, usage.n, usage.model) == (step.stream, step.n, "gpt-fixture")
    assert (usage.input_tokens, usage.output_tokens) == (321, 45)


async def test_a_model_that_reports_no_usage_gets_no_usage_event() -> None:
    model = _steps(ScriptStep(text="quiet"))
    manager, recorder = _manager(model)
    await _run(manager, model.id)
    assert "usage" not in recorder.names()


async def test_a_function_tools_deadline_is_its_calls_deadline() -> None:
    async def slow(seconds: float) -> str:
        """Wait."""
        return "done"

    model = _steps(
        ScriptStep(tool_calls=(ScriptToolCall(tool="slow", args={"seconds": 1}),)),
        ScriptStep(text="ok"),
    )
    manager, recorder = _manager(model, FunctionTool(slow, deadline_s=2.5))
    await _run(manager, model.id)
    [started] = recorder.of(OperationStarted)
    assert started.deadline == 2500  # the virtual clock starts at 0; the default is 60 s
