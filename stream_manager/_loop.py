"""The StreamManager: stream lifecycle and the model step loop (the anyio shell).

Theory of operation
-------------------
``start_stream`` launches one stream for a session and runs it to its end in the caller's
task; it returns the outcome as a value (``Ended``, ``Aborted``, ``Failed``, ``Refused``,
``Withdrawn``). Launch (SM-1 to SM-4): start calls of one session are serialized; an existing
stream is stopped first; the caller's abort signal and the launch probe are checked before
registration, and again after the awaited envelope write; only then does processing begin
with ``stream-start``.

The loop runs one model step at a time. A step's parts stream in; a soft stop lands at the
next text-end, reasoning-end or finish-step. At a finish the step is charged to the budget.
A refusal walks the fallback chain (SM-16); an empty step is retried once (SM-17); a
"previous response not found" error is retried once (SM-18); every restart runs under what is
left, never a fresh ceiling (R37). Client tool calls run one at a time (SM-6) as operations;
only when every result has settled are the stop conditions evaluated (SM-5, SM-7), and a pure
queued-message stop is reported synchronously before ``stream-end`` (SM-8).

Stops: ``request_stop_nowait`` marks a soft stop, or cancels processing for a hard one (which
then emits exactly one ``stream-abort``); a completed stream emits nothing; with nothing
registered a synthetic abort is emitted (SM-10 to SM-13). Decisions (budget, fallback, stop)
are the pure functions of ``_budget``, ``_fallback`` and ``_stop``; this module only awaits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from stream_manager._budget import StepBudget, initial_budget
from stream_manager._events import (
    AbortReason,
    ErrorKind,
    FellBack,
    LaunchRefused,
    LoopStopped,
    Observer,
    StepCompleted,
    StreamAborted,
    StreamEvent,
    StreamFailed,
    StreamStarted,
    ToolCallEnded,
    ToolCallStarted,
)
from stream_manager._events import StreamEnded as StreamEndedEvent
from stream_manager._fallback import NoHop, plan_hop, start_progress
from stream_manager._op_parts import Ledger, OverlapPolicy, Spawn
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
)
from stream_manager._request import (
    Aborted,
    AbortMetadata,
    Ended,
    Failed,
    QueuedStopReport,
    Refused,
    StreamInfo,
    StreamOutcome,
    StreamRequest,
    Withdrawn,
)
from stream_manager._stop import RequiredTools, StopWhy, decide_stop
from stream_manager._stream import ActiveStream, StreamState
from stream_manager._validate import malformed
from stream_manager.errors import ErrorType, ModelError, UnknownModel, is_retryable
from stream_manager.ports import Clock, Model, ModelRequest, Tool, ToolKind

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence

    from message_queue import CancelToken

#: SM-17: in-stream retries after an empty completion.
MAX_EMPTY_OUTPUT_RETRIES = 1
#: SM-18: in-stream retries after a "previous response not found" error.
MAX_PREVIOUS_RESPONSE_RETRIES = 1
#: Bound on awaiting a model iterator's cleanup (real seconds; a safety net, not a deadline).
_CLEANUP_S = 5.0


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


class StreamManager:
    """Runs the streams of every session of one engine; at most one stream per session."""

    def __init__(
        self,
        *,
        models: Mapping[str, Model],
        clock: Clock,
        tools: Mapping[str, Tool] | None = None,
        fallbacks: Mapping[str, Sequence[str]] | None = None,
        max_stream_steps: int = 100,
        tool_deadline_s: float = 60.0,
        cancel_grace_s: float = 5.0,
        ledger: Ledger | None = None,
        receipt_salt: str = "turnkeeper",
        overlap_policy: OverlapPolicy = OverlapPolicy.BLOCK,
        observers: Iterable[Observer] = (),
    ) -> None:
        initial_budget(None, max_stream_steps)  # validates it
        self._models = dict(models)
        self._tools = dict(tools or {})
        self._fallbacks = {k: tuple(v) for k, v in (fallbacks or {}).items()}
        self._clock = clock
        self.max_stream_steps = max_stream_steps
        self._observers: list[Observer] = list(observers)
        self._ops = OperationRunner(
            tools=self._tools,
            clock=clock,
            default_deadline_s=tool_deadline_s,
            grace_s=cancel_grace_s,
            ledger=ledger,
            salt=receipt_salt,
            policy=overlap_policy,
            emit=self._emit,
        )
        self._completion_tools = tuple(
            name for name, tool in self._tools.items() if tool.kind == ToolKind.COMPLETION
        )
        self._streams: dict[str, ActiveStream] = {}
        self._groups: dict[str, anyio.abc.TaskGroup] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._counters: dict[str, int] = {}

    # ------------------------------------------------------------ observers

    def add_observer(self, observer: Observer) -> None:
        """Report every event to ``observer`` (synchronously, in order)."""
        self._observers.append(observer)

    def remove_observer(self, observer: Observer) -> None:
        """Stop reporting to ``observer``."""
        self._observers.remove(observer)

    def _emit(self, event: StreamEvent) -> None:
        for observer in self._observers:
            observer(event)

    # ------------------------------------------------------------ queries

    def stream_state(self, session: str) -> StreamState | None:
        """The state of ``session``'s registered stream, or ``None``."""
        stream = self._streams.get(session)
        return stream.state if stream is not None else None

    def active_stream_id(self, session: str) -> str | None:
        """The id of ``session``'s registered stream, or ``None``."""
        stream = self._streams.get(session)
        return stream.id if stream is not None else None

    # ------------------------------------------------------------ launch

    async def start_stream(self, request: StreamRequest) -> StreamOutcome:
        """Launch a stream for ``request.session`` and run it to its end.

        Raises:
            UsageError: a malformed step budget.
            UnknownModel: the request names a model the manager does not have.
        """
        budget = initial_budget(request.step_budget, self.max_stream_steps)
        if request.model not in self._models:
            raise UnknownModel(f"unknown model {request.model!r}")
        if budget.exhausted:
            return self._refuse(request, "the turn has no steps left")
        stream = await self._register(request, budget)
        if not isinstance(stream, ActiveStream):
            return stream
        listener = self._link_abort(stream, request.abort)
        try:
            return await self._launch(stream, request)
        finally:
            if request.abort is not None:
                request.abort.remove_listener(listener)
            if self._streams.get(stream.session) is stream:
                del self._streams[stream.session]
            stream.done.set()

    async def _register(
        self, request: StreamRequest, budget: StepBudget
    ) -> ActiveStream | StreamOutcome:
        """SM-1, SM-2, SM-4: serialize, stop what runs, check, then register."""
        session = request.session
        lock = self._locks.setdefault(session, anyio.Lock())
        async with lock:
            if _fired(request.abort):
                return Withdrawn(_reason_of(request.abort))
            existing = self._streams.get(session)
            if existing is not None:
                await self.stop_stream(session, reason=AbortReason.SYSTEM)
                if _fired(request.abort):
                    return Withdrawn(_reason_of(request.abort))
            refusal = request.refuse_stream_start() if request.refuse_stream_start else None
            if refusal is not None:
                return self._refuse(request, refusal)
            stream = ActiveStream(
                session=session,
                stream_id=request.stream_id or self._next_stream_id(session),
                model=request.model,
                budget=budget,
                progress=start_progress(request.model, self._fallbacks, request.fallback_progress),
            )
            self._streams[session] = stream
            return stream

    async def _launch(self, stream: ActiveStream, request: StreamRequest) -> StreamOutcome:
        """SM-3: the envelope write, the re-checks, then processing."""
        if request.on_stream_constructed is not None:
            try:
                await request.on_stream_constructed(
                    StreamInfo(stream.session, stream.id, stream.model, stream.budget.ceiling)
                )
            except BaseException:
                stream.move(StreamState.ABORTED)
                raise
        if (
            _fired(request.abort)
            or stream.hard_reason is not None
            or self._streams.get(stream.session) is not stream
        ):
            stream.move(StreamState.ABORTED)
            reason = _reason_of(request.abort) if _fired(request.abort) else "stopped"
            return Withdrawn(reason)
        refusal = request.refuse_stream_start() if request.refuse_stream_start else None
        if refusal is not None:
            stream.move(StreamState.ABORTED)
            return self._refuse(request, refusal)
        stream.scope = anyio.CancelScope()
        stream.move(StreamState.STREAMING)
        if self._observers:
            self._emit(
                StreamStarted(
                    session=stream.session,
                    stream=stream.id,
                    model=stream.model,
                    budget=stream.budget.ceiling,
                    cause=request.cause,
                    handle=request.handle,
                )
            )
        if request.on_started is not None:
            with anyio.CancelScope(shield=True):
                await request.on_started()
        return await self._process(stream, request)

    def _refuse(self, request: StreamRequest, why: str) -> Refused:
        if self._observers:
            self._emit(LaunchRefused(session=request.session, why=why))
        return Refused(why)

    def _next_stream_id(self, session: str) -> str:
        number = self._counters.get(session, 0) + 1
        self._counters[session] = number
        return f"{session}/{number}"

    def _link_abort(self, stream: ActiveStream, abort: CancelToken | None) -> Callable[[str], None]:
        def on_abort(reason: str) -> None:
            if stream.state is StreamState.STREAMING:
                self._hard_stop(stream, _abort_reason(reason))

        if abort is not None:
            abort.add_listener(on_abort)
        return on_abort

    # ------------------------------------------------------------ stops

    def request_stop_nowait(
        self, session: str, *, soft: bool = False, reason: AbortReason | None = None
    ) -> None:
        """Ask ``session``'s stream to stop, without waiting (SM-10 to SM-13).

        A soft stop lands at the stream's next text-end, reasoning-end or finish-step. A hard
        stop cancels processing, which emits one ``stream-abort``; a hard stop while a soft one
        is pending wins, with its own reason. A completed stream emits nothing; with nothing
        registered (or a launch not yet processing) a synthetic abort is emitted with an empty
        stream id and ``reason`` (default ``startup``).
        """
        stream = self._streams.get(session)
        if stream is None or stream.state is StreamState.STARTING:
            if stream is not None and not soft:
                stream.hard_reason = reason or AbortReason.SYSTEM
            self._synthetic_abort(session, reason or AbortReason.STARTUP)
            return
        if stream.state is not StreamState.STREAMING:
            return  # completed, or already being torn down: nothing more to emit
        if soft:
            if stream.soft_reason is None:
                stream.soft_reason = reason or AbortReason.SYSTEM
            return
        self._hard_stop(stream, reason or AbortReason.SYSTEM)

    async def stop_stream(
        self, session: str, *, soft: bool = False, reason: AbortReason | None = None
    ) -> None:
        """Stop ``session``'s stream; a hard stop returns once its processing has finished."""
        stream = self._streams.get(session)
        self.request_stop_nowait(session, soft=soft, reason=reason)
        if stream is not None and not soft and stream.state is not StreamState.STARTING:
            await stream.done.wait()

    def _hard_stop(self, stream: ActiveStream, reason: AbortReason) -> None:
        stream.hard_reason = reason
        stream.move(StreamState.STOPPING)
        assert stream.scope is not None  # set before the stream reaches STREAMING
        stream.scope.cancel()

    def _synthetic_abort(self, session: str, reason: AbortReason) -> None:
        if self._observers:
            self._emit(StreamAborted(session=session, stream="", reason=reason, remaining=0))

    # ------------------------------------------------------------ processing

    async def _process(self, stream: ActiveStream, request: StreamRequest) -> StreamOutcome:
        required = RequiredTools((*self._completion_tools, *request.required_tools))
        outcome: StreamOutcome | _Stopped = _STOPPED
        assert stream.scope is not None
        async with anyio.create_task_group() as operations:
            # The stream's own group for tool tasks when no engine group is bound; a hard stop
            # cancels the loop (stream.scope), never these tasks: they acknowledge or time out.
            self._groups[stream.id] = operations
            try:
                with stream.scope:
                    outcome = await self._loop(stream, request, list(request.messages), required)
            finally:
                with anyio.CancelScope(shield=True):
                    await self._ops.provider_cut(stream.id)  # OP-7
                self._ops.stream_closed(stream.id)
                del self._groups[stream.id]
        if isinstance(outcome, _Stopped):
            return self._abort(stream)
        return outcome

    def _stream_spawn(self, stream: ActiveStream) -> Spawn:
        group = self._groups[stream.id]

        def spawn(work: Callable[[], Coroutine[Any, Any, None]]) -> None:
            group.start_soon(work)

        return spawn

    async def _loop(
        self,
        stream: ActiveStream,
        request: StreamRequest,
        messages: list[ChatMessage],
        required: RequiredTools,
    ) -> StreamOutcome | _Stopped:
        empty_retries = previous_response_retries = 0
        loop_ceiling = stream.budget.remaining
        while True:
            model_request = ModelRequest(
                model=stream.model,
                stream=stream.id,
                step=stream.budget.spent + 1,
                step_ceiling=loop_ceiling,
                messages=tuple(messages),
                correlation=request.correlation,
                extra_system_context=request.extra_system_context,
                thinking_level=(
                    request.thinking_for_step()
                    if request.thinking_for_step is not None
                    else request.thinking_level
                ),
            )
            step = await self._step(stream, self._models[stream.model], model_request, required)
            if step.soft_stopped:
                return _STOPPED
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
                return self._fail(stream, error.type, error.message)
            if step.finish is None:
                if step.parts:
                    return self._fail(
                        stream,
                        ErrorType.STREAM_TRUNCATED,
                        f"model {stream.model!r} step {model_request.step} ended without a finish",
                    )
                if empty_retries < MAX_EMPTY_OUTPUT_RETRIES and restartable:
                    empty_retries += 1
                    loop_ceiling = stream.budget.remaining  # SM-17 runs under the remainder
                    continue
                return self._fail(
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
                await _close(iterator)
        stream.step_open = False
        return step

    async def _provider_receipts(
        self, stream: ActiveStream, part: Part, step: int, index: int
    ) -> None:
        """Provider-executed calls are operations too (OP-7): their results end them."""
        if isinstance(part, ToolCallPart) and part.provider_executed:
            await self._ops.provider_started(
                session=stream.session, stream=stream.id, step=step, index=index, call=part
            )
        elif isinstance(part, ToolResultPart) and part.provider_executed:
            await self._ops.provider_ended(part)

    @property
    def operations(self) -> OperationRunner:
        """The operation runner (receipts, the overlap guard)."""
        return self._ops

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
            if self._observers:
                self._emit(
                    StepCompleted(
                        session=stream.session,
                        stream=stream.id,
                        n=stream.budget.spent,
                        model=stream.model,
                    )
                )
            return True
        if isinstance(part, ToolCallPart):
            calls[part.call_id] = part
            if self._observers:
                self._emit(
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
        if self._observers:
            self._emit(
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
            return self._fail(stream, ErrorType.MODEL_REFUSAL, decision.note)
        if decision.to not in self._models:
            note = f"fallback model {decision.to!r} could not be started"
            return self._fail(stream, ErrorType.MODEL_REFUSAL, note)
        if self._observers:
            self._emit(
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
        executed = await self._ops.run_calls(
            session=stream.session,
            stream=stream.id,
            step=stream.budget.spent,
            calls=client_calls,
            stop_why=lambda: _cancel_why(stream),
            spawn=self._stream_spawn(stream),
        )
        for result in executed:
            results.append(result)
            stream.parts.append(result)
            self._tool_ended(stream, result, provider=False)
        text = "".join(p.text for p in step.parts if isinstance(p, TextPart))
        messages.append(ChatMessage(role=Role.ASSISTANT, text=text, tool_calls=tuple(all_calls)))
        messages.append(ChatMessage(role=Role.TOOL, tool_results=tuple(results)))
        queued = request.has_queued_tool_end() if request.has_queued_tool_end else False
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
        if self._observers:
            self._emit(LoopStopped(session=stream.session, stream=stream.id, why=why))
        if report is not None and request.on_queued_message_stop is not None:
            request.on_queued_message_stop(report)  # synchronously, before stream-end (R1)
        stream.move(StreamState.COMPLETED)
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
        )
        if request.on_complete is not None:
            with anyio.CancelScope(shield=True):
                await request.on_complete(ended)
        if self._observers:
            self._emit(
                StreamEndedEvent(
                    session=stream.session,
                    stream=stream.id,
                    finish=finish,
                    steps=stream.budget.spent,
                    remaining=stream.budget.remaining,
                )
            )
        return ended

    def _fail(self, stream: ActiveStream, error_type: ErrorType, message: str) -> Failed:
        """SM-19, SM-20: a stream error that reports what the attempt left."""
        stream.step_open = False
        if error_type is ErrorType.CONTEXT_EXCEEDED:
            kind = ErrorKind.CONTEXT_EXCEEDED
        elif is_retryable(error_type):
            kind = ErrorKind.RETRYABLE
        else:
            kind = ErrorKind.TERMINAL
        stream.move(StreamState.ERROR)
        if self._observers:
            self._emit(
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
        )

    def _abort(self, stream: ActiveStream) -> Aborted:
        """SM-14: abort cleanup; a step cut mid-flight counts as spent (SM-9)."""
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
        )
        if self._observers:
            self._emit(
                StreamAborted(
                    session=stream.session,
                    stream=stream.id,
                    reason=reason,
                    remaining=stream.budget.remaining,
                )
            )
        return Aborted(
            stream=stream.id, reason=reason, metadata=metadata, parts=tuple(stream.parts)
        )


def _cancel_why(stream: ActiveStream) -> CancelWhy:
    """Why a running operation is cancelled when its stream stops (OP-3)."""
    reason = stream.hard_reason or stream.soft_reason
    if reason is AbortReason.USER:
        return CancelWhy.USER
    if reason is None:
        return CancelWhy.SHUTDOWN  # cancelled from outside: the engine is going away
    return CancelWhy.STREAM_STOPPED


def _fired(token: CancelToken | None) -> bool:
    return token is not None and token.cancelled


def _reason_of(token: CancelToken | None) -> str:
    return (token.reason if token is not None else None) or "aborted"


def _abort_reason(reason: str) -> AbortReason:
    try:
        return AbortReason(reason)
    except ValueError:
        return AbortReason.SYSTEM


async def _close(iterator: object) -> None:
    """Close a model's step iterator that did not run to its end (bounded, shielded)."""
    if getattr(iterator, "ag_frame", True) is None:
        return  # an async generator that already finished has nothing to clean up
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        with anyio.move_on_after(_CLEANUP_S, shield=True):
            await aclose()


__all__ = ["StreamManager"]
