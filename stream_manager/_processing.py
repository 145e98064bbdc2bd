"""The model step loop of one stream, and how a stream ends (the anyio shell).

The loop runs one model step at a time. A step's parts stream in; a soft stop lands at the
next text-end, reasoning-end or finish-step. At a finish the step is charged to the budget.
A refusal walks the fallback chain (SM-16); an empty step is retried once (SM-17); a
"previous response not found" error is retried once (SM-18); every restart runs under what is
left, never a fresh ceiling (R37). Client tool calls run one at a time (SM-6) as operations;
only when every result has settled are the stop conditions evaluated (SM-5, SM-7), and a pure
queued-message stop is reported synchronously to the request's host before ``stream-end``
(SM-8); the host's ``Completed`` milestone (the final write) is awaited before ``stream-end``
too (SM-15).

:class:`StreamProcessor` runs a launched stream; the
:class:`~stream_manager._loop.StreamManager` (launch, stops, queries) holds one and hands it
each stream once it is processing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from stream_manager._cleanup import CLEANUP_S, BoundedCleanup, CleanupBounds
from stream_manager._events import (
    AbortReason,
    Emitter,
    ErrorKind,
    FellBack,
    LoopStopped,
    StepCompleted,
    StepUsage,
    StreamAborted,
    StreamFailed,
    ToolCallEnded,
    ToolCallStarted,
)
from stream_manager._events import StreamEnded as StreamEndedEvent
from stream_manager._fallback import NoHop, plan_hop
from stream_manager._op_answers import answer_open_calls
from stream_manager._op_parts import Spawn
from stream_manager._op_states import CancelWhy
from stream_manager._operations import OperationRunner
from stream_manager._parts import (
    ChatMessage,
    Finish,
    FinishReason,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    add_usage,
)
from stream_manager._request import (
    Aborted,
    AbortMetadata,
    Completed,
    Ended,
    Failed,
    QueuedStopReport,
    StreamOutcome,
    StreamRequest,
    hears_milestones,
)
from stream_manager._stop import RequiredTools, StopWhy, decide_stop
from stream_manager._stream import ActiveStream, StreamState
from stream_manager._validate import malformed
from stream_manager.errors import ErrorType, ModelError, WriteFailed, is_retryable
from stream_manager.ports import Clock, Model, ModelRequest
from stream_manager.redaction import redact
from stream_manager.tools import ToolOffer

log = logging.getLogger("turnkeeper.stream")

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping


#: SM-17: in-stream retries after an empty completion.
MAX_EMPTY_OUTPUT_RETRIES = 1
#: SM-18: in-stream retries after a "previous response not found" error.
MAX_PREVIOUS_RESPONSE_RETRIES = 1


@dataclass(slots=True)
class _Step:
    """What one model step produced."""

    parts: list[Part]
    finish: Finish | None = None
    soft_stopped: bool = False
    error: ModelError | None = None


class _Stopped:
    """The loop ended because a stop landed (soft at a boundary, or a pending hard stop)."""


_STOPPED = _Stopped()


class StreamProcessor:
    """Runs a launched stream to its end: the step loop, tool boundaries, fallback, endings.

    The :class:`~stream_manager._loop.StreamManager` launches a stream, then hands it to
    :meth:`run`. The processor owns the models and, while a stream runs without an engine
    group, that stream's task group for its tool tasks; tool calls go to the operation runner.
    """

    def __init__(
        self,
        *,
        models: Mapping[str, Model],
        operations: OperationRunner,
        events: Emitter,
        completion_tools: tuple[str, ...],
        offer: ToolOffer | None = None,
        clock: Clock,
        cleanup_s: float = CLEANUP_S,
    ) -> None:
        self._models = dict(models)
        self._clock = clock
        self._bounds = CleanupBounds(clock, cleanup_s)
        self._ops = operations
        self._events = events
        self._completion_tools = completion_tools
        #: What every model request offers (``ModelRequest.tools``).
        self._offer = offer if offer is not None else ToolOffer({})
        #: Stream id -> the stream's own group for tool tasks (when no engine group is bound).
        self._groups: dict[str, anyio.abc.TaskGroup] = {}

    def _cleanup(self, what: str) -> BoundedCleanup:
        return self._bounds.bound(what)

    def knows(self, model: str) -> bool:
        """Whether ``model`` is one of the processor's models."""
        return model in self._models

    async def run(self, stream: ActiveStream, request: StreamRequest) -> StreamOutcome:
        """Process ``stream`` (launched: ``STREAMING``, its scope set) to its outcome.

        A hard stop that landed before processing began (inside ``stream-start``, or while
        its start was written) aborts it here: no step runs (SM-11).
        """
        if stream.hard_reason is not None:
            return self._abort(stream)
        if self._ops.bound:  # tool tasks run in the engine's group: no group of our own
            outcome = await self._process_in(stream, request)
        else:
            async with anyio.create_task_group() as operations:
                # The stream's own group for tool tasks when no engine group is bound; a hard
                # stop cancels the loop (stream.scope), never these tasks: they acknowledge or
                # time out, and the stream ends once they did.
                self._groups[stream.id] = operations
                try:
                    outcome = await self._process_in(stream, request)
                finally:
                    del self._groups[stream.id]
        if isinstance(outcome, _Stopped):
            return self._abort(stream)
        return outcome

    async def _process_in(
        self, stream: ActiveStream, request: StreamRequest
    ) -> StreamOutcome | _Stopped:
        required = RequiredTools((*self._completion_tools, *request.required_tools))
        outcome: StreamOutcome | _Stopped = _STOPPED
        assert stream.scope is not None
        if hears_milestones(request.host):  # its host writes the row that takes the partial
            stream.partial = self._ops.open_partial(stream.id, stream.parts)
        try:
            with stream.scope:
                outcome = await self._loop(stream, request, list(request.messages), required)
        except WriteFailed as error:
            outcome = self._write_failed(stream, error)
        finally:
            # Cut short, they stay open too (held by the guard; nothing of them told).
            with self._cleanup(f"cutting the provider calls of stream {stream.id}"):
                try:
                    await self._ops.provider_calls.cut(stream.id)  # OP-7
                except WriteFailed as error:  # they stay open: indeterminate at next startup
                    log.warning("stream %s: %s", stream.id, error)
            self._ops.stream_closed(stream.id)
        return outcome

    def _write_failed(self, stream: ActiveStream, error: WriteFailed) -> Failed | _Stopped:
        """A durable write the stream needed failed: a ``store_write`` stream error.

        A stop that was already landing wins: its abort path reports the stream's end, then
        the failed write (a ``store_write`` stream error after the ``stream-abort``).
        """
        if stream.hard_reason is not None or stream.state is StreamState.STOPPING:
            log.warning("stream %s: stopped while a write failed: %s", stream.id, error)
            stream.unwritten = str(error)
            return _STOPPED
        return self.fail(stream, ErrorType.STORE_WRITE, str(error))

    def unstarted(self, stream: ActiveStream, why: str) -> Failed | Aborted:
        """The stream's start is not durable (its write failed or was cut short): no step runs.

        A hard stop that landed meanwhile wins: the stream aborts instead.
        """
        outcome = self._write_failed(stream, WriteFailed(why))
        return self._abort(stream) if isinstance(outcome, _Stopped) else outcome

    def _stream_spawn(self, stream: ActiveStream) -> Spawn | None:
        """The stream's group's spawn; ``None`` when the engine's group is bound instead."""
        group = self._groups.get(stream.id)
        return None if group is None else group.start_soon

    async def _loop(
        self,
        stream: ActiveStream,
        request: StreamRequest,
        messages: list[ChatMessage],
        required: RequiredTools,
    ) -> StreamOutcome | _Stopped:
        empty_retries = previous_response_retries = 0
        loop_ceiling = stream.budget.remaining
        host = request.host
        while True:
            model_request = ModelRequest(
                model=stream.model,
                stream=stream.id,
                step=stream.budget.spent + 1,
                step_ceiling=loop_ceiling,
                messages=tuple(messages),
                correlation=request.correlation,
                extra_system_context=request.extra_system_context,
                thinking_level=host.thinking_for_step(),  # a mid-turn change applies here
                tools=self._offer.current(),  # a re-listed server's tools from now on
            )
            step = await self._step(stream, self._models[stream.model], model_request, required)
            if step.soft_stopped or (stream.hard_reason is not None and _fails(step)):
                return _STOPPED  # a hard stop landed during a failing step: its abort wins
            restartable = stream.budget.remaining > 0 and not stream.stopping
            error = step.error
            if error is not None:
                if (
                    error.type is ErrorType.PREVIOUS_RESPONSE_NOT_FOUND
                    and previous_response_retries < MAX_PREVIOUS_RESPONSE_RETRIES
                    and not step.parts
                    and restartable
                ):
                    previous_response_retries += 1
                    loop_ceiling = stream.budget.remaining  # SM-18: never a fresh ceiling
                    continue
                return self.fail(stream, error.type, error.message, retry_after=error.retry_after)
            if step.finish is None:
                if step.parts:
                    return self.fail(
                        stream,
                        ErrorType.STREAM_TRUNCATED,
                        f"model {stream.model!r} step {model_request.step} ended without a finish",
                    )
                if empty_retries < MAX_EMPTY_OUTPUT_RETRIES and restartable:
                    empty_retries += 1
                    loop_ceiling = stream.budget.remaining  # SM-17 runs under the remainder
                    continue
                return self.fail(
                    stream,
                    ErrorType.EMPTY_OUTPUT,
                    f"model {stream.model!r} returned no output at step {model_request.step}",
                )
            if step.finish.reason is FinishReason.REFUSAL:
                failure = self._fall_back(stream, step)
                if failure is not None:
                    return failure
                loop_ceiling = stream.budget.remaining  # R37: the hop runs under the remainder
                continue
            outcome = await self._tool_boundary(stream, request, messages, step, required)
            if outcome is not None:
                return outcome

    async def _step(
        self,
        stream: ActiveStream,
        model: Model,
        model_request: ModelRequest,
        required: RequiredTools,
    ) -> _Step:
        """Stream one model step, landing a pending soft stop at the first boundary."""
        step = _Step(parts=[])
        stream.step_open = True
        stream.required_in_step = False
        calls: dict[str, ToolCallPart] = {}
        iterator: AsyncIterator[Part] | None = None
        try:
            iterator = model.stream_step(model_request)  # a model may refuse to even start
            async for part in iterator:
                problem = malformed(part, step.parts, calls)
                if problem is not None:
                    where = f"model {stream.model!r} step {model_request.step}"
                    step.error = ModelError(ErrorType.MALFORMED_OUTPUT, f"{where}: {problem}")
                    stream.step_open = False
                    return step
                step.parts.append(part)
                stream.parts.append(part)
                if getattr(part, "provider_executed", False):  # the hot path awaits nothing
                    await self._provider_receipts(stream, part, model_request.step, len(calls))
                if self._on_part(stream, part, calls, required):
                    step.finish = part if isinstance(part, Finish) else None
                    if stream.soft_reason is not None:
                        step.soft_stopped = True
                        return step
        except WriteFailed:
            raise  # a provider call's receipt: the stream cannot go on (``_process_in``)
        except ModelError as error:
            step.error = error
        except Exception as error:  # a model that raises something else is still a typed error
            step.error = ModelError(
                ErrorType.UNKNOWN,
                f"model {stream.model!r} step {model_request.step} raised "
                f"{type(error).__name__}: {error}",
            )
        finally:
            if iterator is not None:
                await self._close(stream, iterator)
        stream.step_open = False
        return step

    async def _close(self, stream: ActiveStream, iterator: object) -> None:
        """Close a model's step iterator that did not run to its end (bounded, shielded)."""
        if getattr(iterator, "ag_frame", True) is None:
            return  # an async generator that already finished has nothing to clean up
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            with self._cleanup(f"closing the step of model {stream.model!r} in {stream.id}"):
                await aclose()

    async def _provider_receipts(
        self, stream: ActiveStream, part: Part, step: int, index: int
    ) -> None:
        """Provider-executed calls are operations too (OP-7): their results end them."""
        if isinstance(part, ToolCallPart) and part.provider_executed:
            await self._ops.provider_calls.started(
                session=stream.session, stream=stream.id, step=step, index=index, call=part
            )
        elif isinstance(part, ToolResultPart) and part.provider_executed:
            await self._ops.provider_calls.ended(part)

    def _on_part(
        self,
        stream: ActiveStream,
        part: Part,
        calls: dict[str, ToolCallPart],
        required: RequiredTools,
    ) -> bool:
        """Book one part; return whether it is a soft-stop boundary."""
        if isinstance(part, TextPart | ReasoningPart):
            return True
        if isinstance(part, Finish):
            stream.step_open = False
            stream.budget = stream.budget.charge()
            if part.usage is not None:  # counted under the model that ran it (R59)
                stream.usage = add_usage(stream.usage, stream.model, part.usage)
            if self._events.observers:
                self._events.emit(
                    StepCompleted(
                        session=stream.session,
                        stream=stream.id,
                        n=stream.budget.spent,
                        model=stream.model,
                    )
                )
                if part.usage is not None:
                    self._events.emit(
                        StepUsage(
                            session=stream.session,
                            stream=stream.id,
                            n=stream.budget.spent,
                            model=stream.model,
                            input_tokens=part.usage.input_tokens,
                            output_tokens=part.usage.output_tokens,
                        )
                    )
            return True
        if isinstance(part, ToolCallPart):
            calls[part.call_id] = part
            if self._events.observers:
                self._events.emit(
                    ToolCallStarted(
                        session=stream.session,
                        stream=stream.id,
                        call=part.call_id,
                        tool=part.name,
                        provider=part.provider_executed,
                    )
                )
            return False
        if required and required.satisfied_by((part,)):
            stream.required_in_step = True
        self._tool_ended(stream, part, provider=True)
        return False

    def _tool_ended(self, stream: ActiveStream, result: ToolResultPart, *, provider: bool) -> None:
        """``tool-call-end``: a provider's result arrived, or a client call was executed."""
        if self._events.observers:
            self._events.emit(
                ToolCallEnded(
                    session=stream.session,
                    stream=stream.id,
                    call=result.call_id,
                    tool=result.name,
                    provider=provider,
                    is_error=result.is_error,
                )
            )

    def _fall_back(self, stream: ActiveStream, step: _Step) -> Failed | None:
        """SM-16: hop to the next model of the chain, or fail with a terminal refusal."""
        incomplete = any(
            isinstance(p, ToolCallPart) and not p.provider_executed for p in step.parts
        )
        decision = plan_hop(
            stream.progress,
            stream.model,
            remaining=stream.budget.remaining,
            stopping=stream.stopping,
            incomplete_tool_call=incomplete,
        )
        stream.progress = decision.progress
        if isinstance(decision, NoHop):
            return self.fail(stream, ErrorType.MODEL_REFUSAL, decision.note)
        if decision.to not in self._models:
            note = f"fallback model {decision.to!r} could not be started"
            return self.fail(stream, ErrorType.MODEL_REFUSAL, note)
        if self._events.observers:
            self._events.emit(
                FellBack(
                    session=stream.session,
                    stream=stream.id,
                    from_=stream.model,
                    to=decision.to,
                    refused=decision.progress.refused_models,
                )
            )
        stream.model = decision.to
        return None

    async def _tool_boundary(
        self,
        stream: ActiveStream,
        request: StreamRequest,
        messages: list[ChatMessage],
        step: _Step,
        required: RequiredTools,
    ) -> StreamOutcome | _Stopped | None:
        """Run the step's client calls one at a time (SM-6), then decide (SM-5, SM-7)."""
        assert step.finish is not None
        all_calls = [p for p in step.parts if isinstance(p, ToolCallPart)]
        client_calls = [c for c in all_calls if not c.provider_executed]
        if not client_calls:
            return await self._complete(stream, request, step.finish.reason, StopWhy.FINISHED)
        results = [p for p in step.parts if isinstance(p, ToolResultPart)]
        try:
            executed = await self._ops.run_calls(
                session=stream.session,
                stream=stream.id,
                step=stream.budget.spent,
                calls=client_calls,
                stop_why=lambda: _cancel_why(stream),
                spawn=self._stream_spawn(stream),
                parts=stream.parts,  # each result appended as it is given (B4)
            )
        except BaseException:
            # Stopped mid-step: the partial keeps every call answered (docs/operations.md).
            stream.parts.extend(self._ops.take_answers(stream.id))
            raise
        for result in executed:
            results.append(result)
            self._tool_ended(stream, result, provider=False)
        text = "".join(p.text for p in step.parts if isinstance(p, TextPart))
        messages.append(ChatMessage(role=Role.ASSISTANT, text=text, tool_calls=tuple(all_calls)))
        messages.append(ChatMessage(role=Role.TOOL, tool_results=tuple(results)))
        queued = request.host.tool_end_queued()
        decision = decide_stop(
            budget_exhausted=stream.budget.exhausted,
            queued_tool_end=queued,
            required_tool_satisfied=stream.required_in_step or required.satisfied_by(results),
        )
        if decision is None:
            return None
        return await self._complete(stream, request, FinishReason.TOOL_CALLS, decision.why)

    # ------------------------------------------------------------ endings

    async def _complete(
        self, stream: ActiveStream, request: StreamRequest, finish: FinishReason, why: StopWhy
    ) -> Ended | _Stopped:
        """SM-15: report the stop (and a cut, SM-8), complete, persist, emit ``stream-end``.

        The stream is COMPLETED before the final write is awaited, so a hard stop arriving
        during that write emits nothing (SM-11) instead of aborting a stream whose final
        message is being committed.
        """
        if stream.hard_reason is not None:
            return _STOPPED  # a hard stop landed first: the abort path emits its one event
        report = None
        if why is StopWhy.QUEUED_MESSAGE:
            report = QueuedStopReport(
                stream=stream.id,
                model=stream.model,
                steps_remaining=stream.budget.remaining,
                fallback_progress=stream.progress,
            )
        if self._events.observers:
            self._events.emit(LoopStopped(session=stream.session, stream=stream.id, why=why))
            if stream.state is StreamState.STOPPING:
                return _STOPPED  # a hard stop told inside that emission lands first
        host = request.host
        if report is not None:
            host.queued_stop(report)  # synchronously, before stream-end (SM-8, R1)
        stream.move(StreamState.COMPLETED)
        stream.close_partial()  # the final row takes the parts (B5)
        ended = Ended(
            stream=stream.id,
            model=stream.model,
            finish=finish,
            why=why,
            steps=stream.budget.spent,
            remaining=stream.budget.remaining,
            progress=stream.progress,
            queued_stop=report,
            parts=tuple(stream.parts),
            usage=stream.usage,
        )
        if hears_milestones(host):
            with self._cleanup(f"the final write of stream {stream.id}") as cleanup:
                await host.reached(Completed(ended))  # the final write (SM-15, R60)
            if cleanup.fired:  # not known durable: a failed write, never ``stream-end``
                raise WriteFailed(f"the final write did not finish within {cleanup.seconds:g} s")
        if self._events.observers:
            self._events.emit(
                StreamEndedEvent(
                    session=stream.session,
                    stream=stream.id,
                    finish=finish,
                    steps=stream.budget.spent,
                    remaining=stream.budget.remaining,
                )
            )
        return ended

    def fail(
        self,
        stream: ActiveStream,
        error_type: ErrorType,
        message: str,
        *,
        retry_after: float | None = None,
    ) -> Failed:
        """SM-19, SM-20: a stream error that reports what the attempt left.

        ``retry_after``: the provider's requested wait (the auto-retry honours it, AS-32).
        """
        message = redact(message)  # a provider's text may quote a credential
        stream.step_open = False
        if error_type is ErrorType.CONTEXT_EXCEEDED:
            kind = ErrorKind.CONTEXT_EXCEEDED
        elif is_retryable(error_type):
            kind = ErrorKind.RETRYABLE
        else:
            kind = ErrorKind.TERMINAL
        stream.move(StreamState.ERROR)
        stream.close_partial()  # left for the next stream start to commit (PS-2)
        if self._events.observers:
            self._events.emit(
                StreamFailed(
                    session=stream.session,
                    stream=stream.id,
                    kind=kind,
                    remaining=stream.budget.remaining,
                    type=error_type.value,
                    message=message,
                )
            )
        return Failed(
            stream=stream.id,
            type=error_type,
            kind=kind,
            message=message,
            remaining=stream.budget.remaining,
            model=stream.model,
            progress=stream.progress,
            parts=tuple(stream.parts),
            retry_after=retry_after,
            usage=stream.usage,
        )

    def _abort(self, stream: ActiveStream) -> Aborted:
        """SM-14: abort cleanup; a step cut mid-flight counts as spent (SM-9)."""
        answer_open_calls(stream.parts, mid_step=stream.step_open)
        if stream.step_open:
            stream.step_open = False
            stream.budget = stream.budget.charge()
        reason = stream.hard_reason or stream.soft_reason or AbortReason.SYSTEM
        if stream.state is StreamState.STREAMING:
            stream.move(StreamState.STOPPING)
        stream.move(StreamState.ABORTED)
        metadata = AbortMetadata(
            model=stream.model,
            steps_remaining=stream.budget.remaining,
            fallback_progress=stream.progress,
            required_tool_satisfied=stream.required_in_step,
            usage=stream.usage,
        )
        if self._events.observers:
            self._events.emit(
                StreamAborted(
                    session=stream.session,
                    stream=stream.id,
                    reason=reason,
                    remaining=stream.budget.remaining,
                )
            )
            if stream.unwritten is not None:  # the host hears the write that failed
                self._events.emit(
                    StreamFailed(
                        session=stream.session,
                        stream=stream.id,
                        kind=ErrorKind.RETRYABLE,
                        remaining=stream.budget.remaining,
                        type=ErrorType.STORE_WRITE.value,
                        message=stream.unwritten,
                    )
                )
        return Aborted(
            stream=stream.id, reason=reason, metadata=metadata, parts=tuple(stream.parts)
        )


def _fails(step: _Step) -> bool:
    """Whether the step ends the stream in an error (raised, unfinished, or refused)."""
    finish = step.finish
    return step.error is not None or finish is None or finish.reason is FinishReason.REFUSAL


def _cancel_why(stream: ActiveStream) -> CancelWhy:
    """Why a running operation is cancelled when its stream stops (OP-3)."""
    reason = stream.hard_reason or stream.soft_reason
    if reason is AbortReason.USER:
        return CancelWhy.USER
    if reason is None:
        return CancelWhy.SHUTDOWN  # cancelled from outside: the engine is going away
    return CancelWhy.STREAM_STOPPED
