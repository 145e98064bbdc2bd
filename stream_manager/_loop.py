"""The StreamManager: stream lifecycle and the model step loop (the anyio shell).

Theory of operation
-------------------
``start_stream`` launches one stream for a session and runs it to its end in the caller's
task; it returns the outcome as a value (``Ended``, ``Aborted``, ``Failed``, ``Refused``,
``Withdrawn``). Launch (SM-1 to SM-4): start calls of one session are serialized; an existing
stream is stopped first; the caller's abort signal and the launch probe are checked before
registration, and again once the host's ``Constructed`` milestone (the envelope write) was
awaited; only then does processing begin with ``stream-start``, and the host's ``Started``
milestone is awaited before the first step. The caller's side is the request's ``StreamHost``.

Processing a launched stream (the step loop, tool boundaries, fallback, endings) is the job
of a ``_processing.StreamProcessor`` the manager holds; tool calls are operations of an
``_operations.OperationRunner`` it holds (``manager.operations``); both report through the
manager's ``Emitter``.

Stops: ``request_stop_nowait`` marks a soft stop, or cancels processing for a hard one (which
then emits exactly one ``stream-abort``); a completed stream emits nothing; with nothing
registered a synthetic abort is emitted (SM-10 to SM-13). Decisions (budget, fallback, stop)
are the pure functions of ``_budget``, ``_fallback`` and ``_stop``; this module only awaits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from persistence import UsageError
from stream_manager._budget import StepBudget, initial_budget
from stream_manager._cleanup import CLEANUP_S, BoundedCleanup, CleanupBounds
from stream_manager._events import (
    AbortReason,
    Emitter,
    LaunchRefused,
    Observer,
    StreamAborted,
    StreamStarted,
)
from stream_manager._fallback import start_progress
from stream_manager._op_guard import OverlapPolicy
from stream_manager._operations import OperationRunner
from stream_manager._parts import ChatMessage, Finish, FinishReason, TextPart
from stream_manager._processing import StreamProcessor
from stream_manager._request import (
    Constructed,
    Refused,
    Started,
    StreamInfo,
    StreamOutcome,
    StreamRequest,
    Withdrawn,
    hears_milestones,
)
from stream_manager._stream import ActiveStream, StreamState
from stream_manager.errors import ErrorType, ModelError, UnknownModel, WriteFailed
from stream_manager.ports import Clock, Model, ModelRequest, Tool, ToolKind
from stream_manager.tools import ToolOffer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from persistence import Store
    from stream_manager._abort import AbortSignal


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
        store: Store | None = None,
        owner: Callable[[], str | None] | None = None,
        receipt_salt: str = "turnkeeper",
        overlap_policy: OverlapPolicy = OverlapPolicy.BLOCK,
        observers: Iterable[Observer] = (),
        cleanup_s: float = CLEANUP_S,
    ) -> None:
        initial_budget(None, max_stream_steps)  # validates it
        if not cleanup_s > 0:
            raise UsageError(f"cleanup_s must be a positive number of seconds, not {cleanup_s!r}")
        self._clock = clock
        self._models = models
        self._bounds = CleanupBounds(clock, cleanup_s)
        tools = dict(tools or {})
        offer = ToolOffer(tools)
        self._fallbacks = {k: tuple(v) for k, v in (fallbacks or {}).items()}
        self.max_stream_steps = max_stream_steps
        self._events = Emitter(observers)
        self._ops = OperationRunner(
            tools=tools,
            clock=clock,
            default_deadline_s=tool_deadline_s,
            grace_s=cancel_grace_s,
            store=store,
            owner=owner,
            salt=receipt_salt,
            policy=overlap_policy,
            emit=self._events.emit,
            arguments=offer,
            cleanup_s=cleanup_s,
        )
        self._processor = StreamProcessor(
            models=models,
            operations=self._ops,
            events=self._events,
            completion_tools=tuple(
                name for name, tool in tools.items() if tool.kind == ToolKind.COMPLETION
            ),
            offer=offer,
            clock=clock,
            cleanup_s=cleanup_s,
        )
        self._streams: dict[str, ActiveStream] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._counters: dict[str, int] = {}

    @property
    def clock(self) -> Clock:
        """The manager's clock (the engine's): deadlines, grace intervals, bounds."""
        return self._clock

    async def complete_text(
        self, model: str, messages: tuple[ChatMessage, ...], *, purpose: str
    ) -> str:
        """One model call outside any stream (a compaction request, AS-36): the text answered.

        No stream is registered, no budget charged and no event told; tool calls it makes are
        ignored. ``purpose`` names the call where its request names a stream.

        Raises:
            UnknownModel: no such model.
            ModelError: the call failed (a provider error, a refusal, no finish).
        """
        found = self._models.get(model)
        if found is None:
            raise UnknownModel(f"unknown model {model!r}")
        request = ModelRequest(
            model=model, stream=purpose, step=1, step_ceiling=1, messages=messages
        )
        text: list[str] = []
        finish: Finish | None = None
        try:
            async for part in found.stream_step(request):
                if isinstance(part, TextPart):
                    text.append(part.text)
                elif isinstance(part, Finish):
                    finish = part
        except ModelError:
            raise
        except Exception as error:  # a model that raises something else is still typed
            raise ModelError(
                ErrorType.UNKNOWN, f"model {model!r} ({purpose}) raised {error!r}"
            ) from error
        if finish is None or finish.reason is FinishReason.REFUSAL:
            raise ModelError(
                ErrorType.MALFORMED_OUTPUT, f"model {model!r} ({purpose}) gave no answer"
            )
        return "".join(text)

    def bounded_cleanup(self, what: str, *, beyond_s: float = 0.0) -> BoundedCleanup:
        """A shielded scope for the cleanup ``what``, cut short after the engine's bound.

        The bound is ``cleanup_s`` on the manager's clock, plus ``beyond_s`` for a cleanup
        that also waits out a bounded interval of its own (a cancelled call's grace).
        """
        return self._bounds.bound(what, beyond_s=beyond_s)

    # ------------------------------------------------------------ observers

    def add_observer(self, observer: Observer) -> None:
        """Report every event to ``observer`` (synchronously, in order)."""
        self._events.add(observer)

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
        if not self._processor.knows(request.model):
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
        """SM-1, SM-2, SM-4: serialize, stop what runs, check, then register.

        A session's lock lives while someone holds or waits for it (no lock per idle session).
        """
        session = request.session
        lock = self._locks.get(session)
        if lock is None:
            lock = self._locks[session] = anyio.Lock(fast_acquire=True)
        try:
            async with lock:
                return await self._register_locked(request, budget)
        finally:
            if not lock.locked() and self._locks.get(session) is lock:
                del self._locks[session]

    async def _register_locked(
        self, request: StreamRequest, budget: StepBudget
    ) -> ActiveStream | StreamOutcome:
        session = request.session
        fired = _fired(request.abort)
        if fired is not None:
            return Withdrawn(fired)
        existing = self._streams.get(session)
        if existing is not None:
            await self.stop_stream(session, reason=AbortReason.SYSTEM)
            fired = _fired(request.abort)
            if fired is not None:
                return Withdrawn(fired)
        refusal = request.host.refusal()  # SM-4's probe, before registration
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
        """SM-3: the envelope write (``Constructed``), the re-checks, then processing."""
        host = request.host
        info = StreamInfo(stream.session, stream.id, stream.model, stream.budget.ceiling)
        hears = hears_milestones(host)
        try:
            if hears:
                await host.reached(Constructed(info))
        except BaseException:
            stream.move(StreamState.ABORTED)
            raise
        withdrawn = self._withdrawal(stream, request.abort)
        if withdrawn is not None:
            stream.move(StreamState.ABORTED)
            return withdrawn
        refusal = host.refusal()  # SM-4's probe, again after the envelope write
        if refusal is not None:
            stream.move(StreamState.ABORTED)
            return self._refuse(request, refusal)
        stream.scope = anyio.CancelScope()
        stream.move(StreamState.STREAMING)
        if self._events.observers:
            self._events.emit(
                StreamStarted(
                    session=stream.session,
                    stream=stream.id,
                    model=stream.model,
                    budget=stream.budget.ceiling,
                    cause=request.cause,
                    handle=request.handle,
                )
            )
        if hears:
            try:
                with self.bounded_cleanup(f"the start of stream {stream.id}") as cleanup:
                    await host.reached(Started(info))
            except WriteFailed as error:  # its start is not durable: no step may run
                return self._processor.unstarted(stream, str(error))
            if cleanup.fired:  # cut short: not known durable, so no step may run either
                why = f"the start of the stream did not finish within {cleanup.seconds:g} s"
                return self._processor.unstarted(stream, why)
        return await self._processor.run(stream, request)

    def _withdrawal(self, stream: ActiveStream, abort: AbortSignal | None) -> Withdrawn | None:
        """SM-3's re-check after the envelope write: why the launch is taken back, if it is."""
        fired = _fired(abort)
        if fired is not None:
            return Withdrawn(fired)  # the caller's signal
        if stream.hard_reason is not None:
            return Withdrawn(stream.hard_reason)  # hard-stopped while it was starting
        if self._streams.get(stream.session) is not stream:
            # Replaced: the replacing launch hard-stopped it with ``system`` (SM-1).
            return Withdrawn(AbortReason.SYSTEM)
        return None

    def _refuse(self, request: StreamRequest, why: str) -> Refused:
        if self._events.observers:
            self._events.emit(LaunchRefused(session=request.session, why=why))
        return Refused(why)

    def _next_stream_id(self, session: str) -> str:
        number = self._counters.get(session, 0) + 1
        self._counters[session] = number
        return f"{session}/{number}"

    def _link_abort(
        self, stream: ActiveStream, abort: AbortSignal | None
    ) -> Callable[[AbortReason], None]:
        def on_abort(reason: AbortReason) -> None:
            if stream.state is StreamState.STREAMING:
                self._hard_stop(stream, reason)

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
        stream.scope.cancel(f"stream {stream.id}: hard stop ({reason})")

    def _synthetic_abort(self, session: str, reason: AbortReason) -> None:
        if self._events.observers:
            self._events.emit(StreamAborted(session=session, stream="", reason=reason, remaining=0))

    @property
    def operations(self) -> OperationRunner:
        """The operation runner (receipts, the overlap guard)."""
        return self._ops


def _fired(abort: AbortSignal | None) -> AbortReason | None:
    """The reason the caller's signal fired with; ``None``: no signal, or not fired."""
    return abort.reason if abort is not None else None


__all__ = ["StreamManager"]
