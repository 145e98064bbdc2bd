"""Bad input to the step loop: misbehaving models and tools.

A model that streams malformed parts ends its stream with a typed terminal error naming the
model and the step, never a hang or a bare exception; a model that raises is a typed error too.
A tool that raises, returns garbage or does not exist is a failed tool result the model sees,
and the loop goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn, TypeVar, cast

import anyio
import pytest

from agent_session.harness.virtual_time import VirtualTime
from stream_manager import (
    ChatMessage,
    ErrorKind,
    ErrorType,
    Failed,
    Finish,
    FinishReason,
    FunctionModel,
    ModelRequest,
    OperationStarted,
    Part,
    Role,
    StepCompleted,
    StreamEnded,
    StreamFailed,
    TextPart,
    ToolCallEnded,
    ToolCallPart,
    ToolContext,
    ToolResultPart,
    VirtualClock,
)
from stream_manager import Ended as EndedOutcome
from tests.stream_manager.support import T_, FakeTool, Rig, X, rig

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

    from stream_manager import StreamOutcome

T = TypeVar("T")


class Telemetry:
    """Something a provider adapter might leak into the part stream."""


class PartsModel:
    """A model whose n-th call yields the n-th list of ``steps`` exactly as given.

    ``raises`` is raised once a step's parts are out; ``hang`` makes a step wait forever
    after its parts instead (a model that never ends on its own).
    """

    def __init__(
        self,
        steps: Sequence[Sequence[object]],
        *,
        model_id: str = "bad",
        raises: Exception | None = None,
        hang: bool = False,
    ) -> None:
        self._id = model_id
        self._steps = list(steps)
        self._raises = raises
        self._hang = hang
        self.requests: list[ModelRequest] = []
        self.closed = 0

    @property
    def id(self) -> str:
        return self._id

    def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        self.requests.append(request)
        return self._play(self._steps[len(self.requests) - 1])

    async def _play(self, parts: Sequence[object]) -> AsyncIterator[Part]:
        try:
            for part in parts:
                yield cast("Part", part)
            if self._raises is not None:
                raise self._raises
            if self._hang:
                await anyio.sleep_forever()
        finally:
            self.closed += 1


def bad_rig(model: object, tools: Sequence[FakeTool] = ()) -> Rig:
    return rig({}, tools=tools, extra_models={"bad": model})


async def without_hang(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main``; fail instead of hanging when every task blocks with nothing to wake it.

    The driver's clock is one nobody sleeps on, so the first time every task blocks is a hang.
    """
    return await VirtualTime(VirtualClock()).drive(main)


def assert_stream_error(r: Rig, outcome: StreamOutcome, error_type: ErrorType) -> Failed:
    """A typed stream error: the value, its one ``stream-error`` event, nothing registered."""
    assert isinstance(outcome, Failed), outcome
    assert outcome.type is error_type
    failed = r.recorder.of(StreamFailed)
    assert len(failed) == 1
    assert (failed[0].stream, failed[0].type, failed[0].kind) == (
        outcome.stream,
        error_type.value,
        outcome.kind,
    )
    assert failed[0].message == outcome.message
    assert failed[0].remaining == outcome.remaining
    assert r.recorder.names()[-1] == "stream-error"
    assert r.recorder.of(StreamEnded) == []
    assert r.manager.active_stream_id("s1") is None
    assert r.manager.stream_state("s1") is None
    return outcome


def call(call_id: str = "c1", name: str = "bash") -> ToolCallPart:
    return ToolCallPart(call_id=call_id, name=name)


MALFORMED: list[tuple[str, list[object], str]] = [
    (
        "tool call with no name",
        [call(name=""), Finish(reason=FinishReason.TOOL_CALLS)],
        "a tool call with no name",
    ),
    (
        "tool call whose name is not a string",
        [call(name=cast("str", None)), Finish(reason=FinishReason.TOOL_CALLS)],
        "a tool call with no name",
    ),
    (
        "tool call with no id",
        [call(call_id=""), Finish(reason=FinishReason.TOOL_CALLS)],
        "a call to 'bash' with no call id",
    ),
    (
        "two calls with one id",
        [call(), call(), Finish(reason=FinishReason.TOOL_CALLS)],
        "a second tool call with id 'c1'",
    ),
    (
        "finish before any part",
        [Finish(reason=FinishReason.STOP)],
        "a finish (stop) before any part",
    ),
    ("unknown part type (a dict)", [{"type": "image", "data": "..."}], "unknown part type dict"),
    (
        "unknown part type (an object)",
        [TextPart(text="hi"), Telemetry()],
        "unknown part type Telemetry",
    ),
    (
        "part after the finish",
        [TextPart(text="hi"), Finish(reason=FinishReason.STOP), TextPart(text="more")],
        "a TextPart after the step's finish",
    ),
    (
        "tool result for an unknown call",
        [ToolResultPart(call_id="ghost", name="bash", output={"ok": True})],
        "a tool result for 'ghost', which is no provider-executed call",
    ),
    (
        "tool result for a client call",
        [call(), ToolResultPart(call_id="c1", name="bash", output={"ok": True})],
        "a tool result for 'c1', which is no provider-executed call",
    ),
    (
        "tool-calls finish without a tool call",
        [TextPart(text="let me run that"), Finish(reason=FinishReason.TOOL_CALLS)],
        "a tool-calls finish without any tool call",
    ),
    (
        "unknown finish reason",
        [TextPart(text="hi"), Finish(reason=cast("FinishReason", "eof"))],
        "unknown finish reason 'eof'",
    ),
    (
        "text that is not a string",
        [TextPart(text=cast("str", 42))],
        "a text part whose text is not a string",
    ),
]


@pytest.mark.parametrize("hang", [False, True], ids=["then-ends", "then-hangs"])
@pytest.mark.parametrize(
    ("parts", "needle"), [(p, n) for _, p, n in MALFORMED], ids=[i for i, _, _ in MALFORMED]
)
async def test_malformed_part_is_a_typed_terminal_error_naming_model_and_step(
    parts: list[object], needle: str, hang: bool
) -> None:
    model = PartsModel([parts], hang=hang)
    r = bad_rig(model)
    outcome = await without_hang(lambda: r.manager.start_stream(r.request(model="bad")))
    failed = assert_stream_error(r, outcome, ErrorType.MALFORMED_OUTPUT)
    assert failed.kind is ErrorKind.TERMINAL
    assert not failed.retryable
    assert failed.message.startswith("model 'bad' step 1: ")
    assert needle in failed.message
    assert failed.model == "bad"
    assert model.closed == 1  # the model's iterator was closed, not left suspended
    assert len(model.requests) == 1  # a malformed step is never retried


async def test_malformed_part_at_a_later_step_names_that_step() -> None:
    model = PartsModel(
        [
            [call(), Finish(reason=FinishReason.TOOL_CALLS)],
            [
                TextPart(text="ok"),
                Finish(reason=FinishReason.STOP),
                Finish(reason=FinishReason.STOP),
            ],
        ]
    )
    r = bad_rig(model)
    outcome = await without_hang(lambda: r.manager.start_stream(r.request(model="bad")))
    failed = assert_stream_error(r, outcome, ErrorType.MALFORMED_OUTPUT)
    assert failed.message == "model 'bad' step 2: a Finish after the step's finish"
    # Both finishes before the stray one completed their steps; the remainder says so.
    assert [e.n for e in r.recorder.of(StepCompleted)] == [1, 2]
    assert failed.remaining == r.manager.max_stream_steps - 2
    assert len(r.tools["bash"].calls) == 1


async def test_sm15_a_step_without_a_finish_is_a_retryable_truncation_not_a_hang() -> None:
    model = PartsModel([[TextPart(text="half a thou")]])
    r = bad_rig(model)
    outcome = await without_hang(lambda: r.manager.start_stream(r.request(model="bad")))
    failed = assert_stream_error(r, outcome, ErrorType.STREAM_TRUNCATED)
    assert failed.kind is ErrorKind.RETRYABLE
    assert failed.message == "model 'bad' step 1 ended without a finish"
    assert failed.remaining == r.manager.max_stream_steps  # no step completed


async def test_sm17_a_model_that_stays_empty_is_a_retryable_error_after_one_retry() -> None:
    model = PartsModel([[], [], []])
    r = bad_rig(model)
    outcome = await without_hang(lambda: r.manager.start_stream(r.request(model="bad")))
    failed = assert_stream_error(r, outcome, ErrorType.EMPTY_OUTPUT)
    assert failed.kind is ErrorKind.RETRYABLE
    assert failed.message == "model 'bad' returned no output at step 1"
    assert len(model.requests) == 2


@pytest.mark.parametrize(
    "parts", [[], [TextPart(text="thinking out loud")]], ids=["at-once", "after-a-part"]
)
async def test_model_raising_a_plain_exception_is_a_typed_retryable_error(
    parts: list[object],
) -> None:
    model = PartsModel([parts], raises=RuntimeError("socket closed"))
    r = bad_rig(model)
    outcome = await without_hang(lambda: r.manager.start_stream(r.request(model="bad")))
    failed = assert_stream_error(r, outcome, ErrorType.UNKNOWN)
    assert failed.kind is ErrorKind.RETRYABLE
    assert failed.message == "model 'bad' step 1 raised RuntimeError: socket closed"
    assert failed.parts == tuple(parts)
    assert model.closed == 1


async def test_model_whose_call_raises_before_streaming_is_a_typed_retryable_error() -> None:
    """A model may fail in ``stream_step`` itself, before it hands back an iterator."""

    def unreachable(request: ModelRequest) -> NoReturn:
        raise RuntimeError("no route to host")

    r = bad_rig(FunctionModel("bad", unreachable))  # its function runs inside ``stream_step``
    outcome = await without_hang(lambda: r.manager.start_stream(r.request(model="bad")))
    failed = assert_stream_error(r, outcome, ErrorType.UNKNOWN)
    assert failed.kind is ErrorKind.RETRYABLE
    assert "'bad'" in failed.message
    assert "step 1" in failed.message
    assert "RuntimeError: no route to host" in failed.message


@pytest.mark.parametrize(("played", "asked"), [(0, 1), (2, 3)])
async def test_scripted_model_out_of_steps_is_a_typed_terminal_error(
    played: int, asked: int
) -> None:
    r = rig({"M": [T_("bash")] * played})
    outcome = await without_hang(lambda: r.manager.start_stream(r.request()))
    failed = assert_stream_error(r, outcome, ErrorType.SCRIPT_EXHAUSTED)
    assert failed.kind is ErrorKind.TERMINAL
    assert "'M'" in failed.message
    assert f"step {asked}" in failed.message
    assert failed.remaining == r.manager.max_stream_steps - played
    assert len(r.models["M"].requests) == asked


# ---------------------------------------------------------------------------------------------
# tools


@dataclass
class ReturnsTool(FakeTool):
    """A tool that returns ``value`` as it is, whatever it is."""

    value: object = None

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        self.calls.append(call)
        return cast("ToolResultPart", self.value)


def failed_results(outcome: EndedOutcome) -> list[ToolResultPart]:
    return [p for p in outcome.parts if isinstance(p, ToolResultPart) and p.is_error]


async def run_tool_turn(r: Rig) -> tuple[EndedOutcome, ToolResultPart]:
    """Run T(tool) then X: the loop must survive the tool and hand its failure to the model."""
    outcome = await without_hang(lambda: r.manager.start_stream(r.request()))
    assert isinstance(outcome, EndedOutcome), outcome
    assert (outcome.finish, outcome.steps) == (FinishReason.STOP, 2)
    assert r.recorder.of(StreamFailed) == []
    assert r.manager.active_stream_id("s1") is None
    [result] = failed_results(outcome)
    [ended] = [e for e in r.recorder.of(ToolCallEnded) if not e.provider]
    assert (ended.call, ended.is_error) == (result.call_id, True)
    assert len(r.recorder.of(OperationStarted)) == 1
    # The model's next step is asked with the failed result in its messages.
    second = r.models["M"].requests[1]
    assert second.messages[-1] == ChatMessage(role=Role.TOOL, tool_results=(result,))
    return outcome, result


async def test_tool_that_raises_is_a_failed_result_not_a_crashed_loop() -> None:
    tool = FakeTool("boom", raises=RuntimeError("disk on fire"))
    r = rig({"M": [T_("boom"), X("sorry")]}, tools=[tool])
    _, result = await run_tool_turn(r)
    assert result.name == "boom"
    assert result.output == {"error": "RuntimeError: disk on fire"}
    assert len(tool.calls) == 1


async def test_tool_with_a_non_serialisable_output_is_a_failed_result() -> None:
    tool = FakeTool("weird", output={"handle": Telemetry()})
    r = rig({"M": [T_("weird"), X("sorry")]}, tools=[tool])
    _, result = await run_tool_turn(r)
    assert isinstance(result.output, dict)
    assert str(result.output["error"]).startswith("tool result is not serialisable: ")


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ({"success": True}, "tool returned dict, not a tool result"),
        (None, "tool returned NoneType, not a tool result"),
        (TextPart(text="ok"), "tool returned TextPart, not a tool result"),
    ],
)
async def test_tool_returning_something_else_than_a_result_is_a_failed_result(
    value: object, needle: str
) -> None:
    tool = ReturnsTool("odd", value=value)
    r = rig({"M": [T_("odd"), X("sorry")]}, tools=[tool])
    _, result = await run_tool_turn(r)
    assert result.output == {"error": needle}


async def test_unknown_tool_is_a_failed_result() -> None:
    r = rig({"M": [T_("nosuch"), X("sorry")]})
    _, result = await run_tool_turn(r)
    assert (result.name, result.output) == ("nosuch", {"error": "unknown tool 'nosuch'"})


async def test_tool_result_for_another_call_is_pinned_to_the_call_it_answers() -> None:
    tool = ReturnsTool("odd", value=ToolResultPart(call_id="elsewhere", name="x", output=1))
    r = rig({"M": [T_("odd"), X("done")]}, tools=[tool])
    outcome = await without_hang(lambda: r.manager.start_stream(r.request()))
    assert isinstance(outcome, EndedOutcome)
    [result] = [p for p in outcome.parts if isinstance(p, ToolResultPart)]
    [asked] = [p for p in outcome.parts if isinstance(p, ToolCallPart)]
    assert (result.call_id, result.name, result.output) == (asked.call_id, "odd", 1)
