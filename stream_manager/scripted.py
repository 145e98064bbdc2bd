"""The ScriptedModel: the fake-model harness's model.

It plays a list of scripted steps (``[scripts.MODEL] steps`` in ``docs/scenarios.md``), consumed
in order across every stream that runs on that model, and records every request it receives so
tests assert on what the model was really asked (model, step ceiling, messages, correlation,
extra system context, thinking level). Delays run on the injected clock. Running out of steps
raises :class:`~stream_manager.errors.ScriptExhausted` naming the model and the step.

Parts of one step come in this order: reasoning, provider-executed calls each followed by its
result, text, client calls, then the finish (``refusal`` for ``refuse``, ``tool-calls`` when
there are client calls, else ``stop``, unless ``finish`` says otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

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
)
from stream_manager.errors import ErrorType, ModelError, ScriptExhausted

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

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
    #: Overrides of the tool's scripted behaviour for this call (harness only).
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


class ScriptedModel:
    """A model that plays its script, one step per call, and records every request.

    ``record=False`` keeps no requests (benchmarks: a real model client holds none either).
    """

    def __init__(
        self,
        model_id: str,
        steps: Sequence[ScriptStep],
        *,
        clock: Clock | None = None,
        record: bool = True,
    ) -> None:
        self._id = model_id
        self._steps = tuple(steps)
        self._clock = clock
        self._cursor = 0
        self._record = record
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
        return self._play(self._steps[index], request)

    async def _play(self, step: ScriptStep, request: ModelRequest) -> AsyncIterator[Part]:
        if step.delay_ms:
            if self._clock is None:
                raise ModelError(ErrorType.UNKNOWN, f"model {self._id!r} has delays but no clock")
            await self._clock.sleep_until(self._clock.now() + step.delay_ms / 1000)
        if step.error == "empty":
            return
        if step.error is not None:
            raise ModelError(
                _ERRORS[step.error], f"model {self._id!r} step {request.step}: {step.error}"
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
                behaviour=call.behaviour,
            )
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
        yield Finish(reason=self._finish(step, bool(client)))

    @staticmethod
    def _finish(step: ScriptStep, has_client_calls: bool) -> FinishReason:
        if step.refuse:
            return FinishReason.REFUSAL
        if step.finish is not None:
            return step.finish
        return FinishReason.TOOL_CALLS if has_client_calls else FinishReason.STOP
