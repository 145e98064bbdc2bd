"""The ScriptedModel and the FunctionModel: the fake-model harness's models.

``ScriptedModel`` plays a list of scripted steps (``[scripts.MODEL] steps`` in
``docs/scenarios.md``), consumed in order across every stream that runs on that model;
``FunctionModel`` asks a function of the request for each step. Both record every request they
receive so tests assert on what the model was really asked (model, step ceiling, messages,
correlation, extra system context, thinking level). Delays run on the injected clock. Running
out of steps raises :class:`~stream_manager.errors.ScriptExhausted` naming the model and the step.

Parts of one step come in this order: reasoning, provider-executed calls each followed by its
result, text, client calls, then the finish (``refusal`` for ``refuse``, ``tool-calls`` when
there are client calls, else ``stop``, unless ``finish`` says otherwise).

A scripted call's ``behaviour`` (overrides for the scripted tool that runs it) never reaches the
call part a model sees or a history row stores: the model records it in a
:class:`CallBehaviours` registry under the call's id, where the scripted tools look it up.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, TypeAlias

import anyio
import msgspec

from stream_manager._parts import (
    Finish,
    FinishReason,
    Part,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
)
from stream_manager.errors import ErrorType, ModelError, ScriptExhausted

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from stream_manager.ports import Clock, ModelRequest

ScriptedError = Literal["retryable", "terminal", "context_exceeded", "empty"]

_ERRORS: dict[str, ErrorType] = {
    "retryable": ErrorType.PROVIDER_ERROR,
    "terminal": ErrorType.PROVIDER_REJECTED,
    "context_exceeded": ErrorType.CONTEXT_EXCEEDED,
}


class ScriptToolCall(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One tool call a scripted step makes."""

    tool: str
    args: Mapping[str, object] = msgspec.field(default_factory=dict)
    #: The provider runs it inside the step; ``result`` is what it returns.
    provider_executed: bool = False
    result: object = None
    #: Overrides of the tool's scripted behaviour for this call (harness only): recorded in
    #: the model's :class:`CallBehaviours`, never part of the call the model emits.
    behaviour: Mapping[str, object] = msgspec.field(default_factory=dict)


class ScriptStep(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One scripted model step."""

    text: str | None = None
    reasoning: str | None = None
    tool_calls: tuple[ScriptToolCall, ...] = ()
    refuse: bool = False
    error: ScriptedError | None = None
    #: Virtual milliseconds before the step's first part.
    delay_ms: int = 0
    #: Override the finish reason (e.g. ``length``).
    finish: FinishReason | None = None
    #: After its text the step never finishes on its own (it waits to be stopped).
    hang: bool = False
    #: The tokens the step reports it used (its ``Finish`` carries them; AS-36 reads input).
    usage: Usage | None = None


#: What a :class:`FunctionModel`'s function answers for one step: a scripted step, or the exact
#: parts to stream (nothing is added: no finish unless the parts end with one).
StepFunction: TypeAlias = "Callable[[ModelRequest], ScriptStep | Sequence[Part]]"

_NO_BEHAVIOUR: Mapping[str, object] = MappingProxyType({})


class CallBehaviours:
    """Per-call overrides of scripted tools' behaviour, by call id (the harness's side channel).

    A scripted model records the ``behaviour`` of every call it emits; a scripted tool reads
    the overrides of the call it runs with :meth:`of`. One registry serves one run: its models
    and its tools share it.
    """

    __slots__ = ("_by_call",)

    def __init__(self) -> None:
        self._by_call: dict[str, Mapping[str, object]] = {}

    def record(self, call_id: str, behaviour: Mapping[str, object]) -> None:
        """``call_id`` was emitted with ``behaviour`` (an empty one forgets any earlier entry)."""
        if behaviour:
            self._by_call[call_id] = behaviour
        else:
            self._by_call.pop(call_id, None)

    def of(self, call_id: str) -> Mapping[str, object]:
        """The overrides the call ``call_id`` was emitted with (empty when it had none)."""
        return self._by_call.get(call_id, _NO_BEHAVIOUR)


class ScriptedModel:
    """A model that plays its script, one step per call, and records every request.

    ``record=False`` keeps no requests (benchmarks: a real model client holds none either).
    ``behaviours`` receives the calls' behaviour overrides (a registry of its own by default).
    """

    def __init__(
        self,
        model_id: str,
        steps: Sequence[ScriptStep],
        *,
        clock: Clock | None = None,
        record: bool = True,
        behaviours: CallBehaviours | None = None,
    ) -> None:
        self._id = model_id
        self._steps = tuple(steps)
        self._clock = clock
        self._cursor = 0
        self._record = record
        self.behaviours = behaviours if behaviours is not None else CallBehaviours()
        #: Every request received, in order (a request that found the script exhausted too).
        self.requests: list[ModelRequest] = []

    @property
    def id(self) -> str:
        """The model's id."""
        return self._id

    @property
    def steps_played(self) -> int:
        """How many scripted steps have been consumed."""
        return self._cursor

    @property
    def steps_left(self) -> int:
        """How many scripted steps remain."""
        return len(self._steps) - self._cursor

    def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        """Play the next scripted step."""
        if self._record:
            self.requests.append(request)
        index = self._cursor
        if index >= len(self._steps):
            raise ScriptExhausted(self._id, index)
        self._cursor += 1
        return _play_step(self._id, self._steps[index], request, self._clock, self.behaviours)


class FunctionModel:
    """A model whose every step is what ``fn`` answers for the request, and records requests.

    ``fn`` runs inside ``stream_step`` and returns a :class:`ScriptStep` (played exactly as a
    ``ScriptedModel`` plays it) or the parts to stream as given; what it raises is the step's
    error (a :class:`~stream_manager.errors.ModelError`, or anything else: ``unknown``).
    """

    def __init__(
        self,
        model_id: str,
        fn: StepFunction,
        *,
        clock: Clock | None = None,
        behaviours: CallBehaviours | None = None,
    ) -> None:
        self._id = model_id
        self._fn = fn
        self._clock = clock
        self.behaviours = behaviours if behaviours is not None else CallBehaviours()
        #: Every request received, in order.
        self.requests: list[ModelRequest] = []

    @property
    def id(self) -> str:
        """The model's id."""
        return self._id

    def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        """Stream the step ``fn`` decides for ``request``."""
        self.requests.append(request)
        decided = self._fn(request)
        if isinstance(decided, ScriptStep):
            return _play_step(self._id, decided, request, self._clock, self.behaviours)
        return _given(decided)


async def _given(parts: Sequence[Part]) -> AsyncIterator[Part]:
    for part in parts:
        yield part


async def _play_step(
    model_id: str,
    step: ScriptStep,
    request: ModelRequest,
    clock: Clock | None,
    behaviours: CallBehaviours,
) -> AsyncIterator[Part]:
    """One scripted step's parts, in order; its calls' overrides go to ``behaviours``."""
    if step.delay_ms:
        if clock is None:
            raise ModelError(ErrorType.UNKNOWN, f"model {model_id!r} has delays but no clock")
        await clock.sleep_until(clock.now() + step.delay_ms / 1000)
    if step.error == "empty":
        return
    if step.error is not None:
        raise ModelError(
            _ERRORS[step.error], f"model {model_id!r} step {request.step}: {step.error}"
        )
    if step.reasoning is not None:
        yield ReasoningPart(text=step.reasoning)
    client: list[ToolCallPart] = []
    for index, call in enumerate(step.tool_calls):
        part = ToolCallPart(
            call_id=f"{request.stream}/{request.step}/c{index}",
            name=call.tool,
            args=call.args,
            provider_executed=call.provider_executed,
        )
        behaviours.record(part.call_id, call.behaviour)
        if not call.provider_executed:
            client.append(part)
            continue
        yield part
        yield ToolResultPart(
            call_id=part.call_id, name=call.tool, output=call.result, provider_executed=True
        )
    if step.text is not None:
        yield TextPart(text=step.text)
    if step.hang:
        await anyio.sleep_forever()
    for part in client:
        yield part
    yield Finish(reason=_finish(step, bool(client)), usage=step.usage)


def _finish(step: ScriptStep, has_client_calls: bool) -> FinishReason:
    if step.refuse:
        return FinishReason.REFUSAL
    if step.finish is not None:
        return step.finish
    return FinishReason.TOOL_CALLS if has_client_calls else FinishReason.STOP
