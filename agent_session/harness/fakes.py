"""The harness's scripted tools and fault injection.

``ScenarioTool`` plays a scenario tool's behaviour on the virtual clock: it takes
``duration_ms``, then returns ``result`` or fails with ``fail``; ``hang`` never returns on its
own; cancelled, it acknowledges after ``ack_delay_ms`` or (``on_cancel = "ignore"``) never;
``lose_completion`` records its result with the tool layer but never returns it. A script's
tool call may override any of these for that call (read from the run's ``CallBehaviours``).

``Faults`` counts ``fail_next`` requests: it is the engine's ``PreStreamGate``, and
``FaultyStore`` wraps the store port so that the next N commits fail (and, after a ``crash``,
every commit is refused).
"""

from __future__ import annotations

from collections.abc import Awaitable
from types import TracebackType
from typing import Self, TypeVar

import anyio

from agent_session.harness.scenario import ToolSpec
from agent_session.ports import PreStreamFailure
from persistence import (
    AbandonQuery,
    Boundary,
    Committed,
    HandleQuery,
    OpenReceipts,
    OpState,
    QueueQuery,
    ReceiptQuery,
    RecoveryScan,
    SessionLoad,
    SessionRecord,
    Store,
    TurnkeeperError,
)
from stream_manager import (
    CallBehaviours,
    Clock,
    TerminationUnconfirmed,
    ToolCallPart,
    ToolContext,
    ToolKind,
    ToolResultPart,
)

T = TypeVar("T")


class ScenarioTool:
    r"""A client tool whose behaviour the scenario scripts (see ``docs/scenarios.md``).

    It takes ``duration_ms`` on the virtual clock, then answers ``result`` or fails with
    ``fail``; ``hang`` never returns on its own. Cancelled, it acknowledges after
    ``ack_delay_ms`` (``on_cancel = "ack"``) or never stops nor acknowledges (``"ignore"``).
    ``lose_completion`` finishes and records its result, but its completion never reaches the
    engine. A script's call may override any of these for that call: the scripted model records
    the overrides in ``behaviours`` under the call's id.

    When its engine goes away (the run's end, a ``restart``, a ``crash``), the harness
    :meth:`abandon`\ s what still runs here: like a process exiting under it, the call ends
    without acknowledging (:class:`~stream_manager.TerminationUnconfirmed`), so its receipt
    stays ``indeterminate``.
    """

    def __init__(
        self, spec: ToolSpec, clock: Clock, behaviours: CallBehaviours | None = None
    ) -> None:
        self._spec = spec
        self._clock = clock
        self._behaviours = behaviours if behaviours is not None else CallBehaviours()
        self._abandoned = anyio.Event()
        #: Cancelled calls still waiting to acknowledge; abandoning wakes them.
        self._acknowledging: list[anyio.Event] = []
        self.calls = 0

    @property
    def name(self) -> str:
        """The tool's name."""
        return self._spec.name

    @property
    def kind(self) -> ToolKind:
        """How it runs."""
        return ToolKind(self._spec.kind)

    def deadline_for(self, call: ToolCallPart) -> float | None:
        """This call's own deadline in seconds (``deadline_ms``), else the engine's."""
        value = self._behaviours.of(call.call_id).get("deadline_ms", self._spec.deadline_ms)
        return value / 1000 if isinstance(value, int) and value > 0 else None

    def abandon(self) -> None:
        """The engine is gone: calls still running here end now, unacknowledged.

        Only the calls of that engine: the next engine's calls of this tool start afresh.
        """
        self._abandoned.set()
        self._abandoned = anyio.Event()
        for waiting in self._acknowledging:
            waiting.set()

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        """Take the scripted time, then answer, fail or hang; react to a cancel as scripted."""
        self.calls += 1
        behaviour = {**self._defaults(), **self._behaviours.of(call.call_id)}
        abandoned = self._abandoned  # this engine's: set when it goes away
        try:
            return await self._work(call, context, behaviour)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                if behaviour.get("on_cancel") == "ignore":
                    await abandoned.wait()  # never stops, never acknowledges
                else:
                    await self._acknowledge_after(behaviour.get("ack_delay_ms"), abandoned)
            if abandoned.is_set():
                raise TerminationUnconfirmed(
                    f"{self.name}: abandoned when its engine went away; it never acknowledged"
                ) from None
            raise

    async def _acknowledge_after(self, delay: object, abandoned: anyio.Event) -> None:
        """Wait ``delay`` virtual ms (or until abandoned) before acknowledging."""
        if not isinstance(delay, int) or delay <= 0 or abandoned.is_set():
            return
        woken = anyio.Event()
        timer = self._clock.call_at(self._clock.now() + delay / 1000, woken.set)
        self._acknowledging.append(woken)
        try:
            await woken.wait()
        finally:
            timer.cancel()
            self._acknowledging.remove(woken)

    async def _work(
        self, call: ToolCallPart, context: ToolContext, behaviour: dict[str, object]
    ) -> ToolResultPart:
        duration = behaviour.get("duration_ms")
        if isinstance(duration, int) and duration > 0:
            await self._clock.sleep_until(self._clock.now() + duration / 1000)
        if behaviour.get("hang") is True:
            await anyio.sleep_forever()
        failure = behaviour.get("fail")
        if isinstance(failure, str):
            result = ToolResultPart(
                call_id=call.call_id, name=call.name, output={"error": failure}, is_error=True
            )
        else:
            result = ToolResultPart(
                call_id=call.call_id, name=call.name, output=behaviour.get("result")
            )
        if behaviour.get("lose_completion") is True:
            context.record_completion(result)  # the tool layer's own record (OP-5)
            await anyio.sleep_forever()  # ... and the signal that never arrives
        return result

    def _defaults(self) -> dict[str, object]:
        spec = self._spec
        return {
            "duration_ms": spec.duration_ms,
            "result": spec.result,
            "fail": spec.fail,
            "hang": spec.hang,
            "on_cancel": spec.on_cancel,
            "ack_delay_ms": spec.ack_delay_ms,
            "lose_completion": spec.lose_completion,
        }


class InjectedFailure(TurnkeeperError):
    """A failure the scenario asked for with ``fail_next``."""


class ProcessCrashed(TurnkeeperError):
    """The scenario crashed the process: the dead engine writes nothing more."""


class Faults:
    """``fail_next`` counters: the pre-stream gate, and store writes through ``FaultyStore``."""

    def __init__(self) -> None:
        self.pending: dict[str, int] = {"pre_stream": 0, "store_write": 0, "queue_write": 0}
        #: The store whose calls the gate waits for: a gate check is answered only once no
        #: store call is in flight, so a write racing it (a queue commit a host call started)
        #: lands at the same point whatever the store's thread does (a deterministic trace).
        self.store: FaultyStore | None = None

    def arm(self, what: str, count: int) -> None:
        """Make the next ``count`` operations of kind ``what`` fail."""
        self.pending[what] = self.pending.get(what, 0) + count

    def take(self, what: str) -> bool:
        """Consume one armed failure of kind ``what``; ``True`` when one was armed."""
        if self.pending.get(what, 0) > 0:
            self.pending[what] -= 1
            return True
        return False

    async def check(self, session: str, purpose: str) -> None:
        """The engine's pre-stream gate: fails while ``pre_stream`` failures are armed."""
        await anyio.lowlevel.checkpoint()
        if self.store is not None and self.store.in_flight:
            await self.store.settled()
        if self.take("pre_stream"):
            raise PreStreamFailure(f"injected pre-stream failure ({purpose} of {session})")


class FaultyStore:
    """The one wrapper over the store port: faults on ``commit``, every call counted.

    While ``store_write`` failures are armed, the next commits fail (:class:`InjectedFailure`),
    except those that write only the durable queue: ``queue_write`` failures are theirs
    (``fault_of``);
    after a ``crash`` (``crashed``), every commit is refused (:class:`ProcessCrashed`). Either
    way nothing of the boundary reaches the store. It counts calls in flight, so the
    virtual-time driver can tell "every task waits for the database thread" from "every task
    is idle" (a blocked task is not a finished one).
    """

    def __init__(self, inner: Store, faults: Faults) -> None:
        self._inner = inner
        self._faults = faults
        faults.store = self
        self._in_flight = 0
        self._settled = anyio.Event()
        self._settled.set()
        #: Set by a ``crash`` action: every later commit through this wrapper is refused.
        self.crashed = False

    @property
    def in_flight(self) -> int:
        """Store calls started and not yet returned."""
        return self._in_flight

    async def settled(self) -> None:
        """Return once no store call is in flight."""
        await self._settled.wait()

    def _enter(self) -> None:
        self._in_flight += 1
        if self._settled.is_set():
            self._settled = anyio.Event()

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._settled.set()

    async def _counted(self, call: Awaitable[T]) -> T:
        self._enter()
        try:
            return await call
        finally:
            self._leave()

    @property
    def owner(self) -> str | None:
        """The wrapped store's owner token."""
        return self._inner.owner

    async def open(self) -> None:
        """Open the wrapped store."""
        await self._inner.open()

    async def close(self) -> None:
        """Close the wrapped store."""
        await self._inner.close()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        """Commit a boundary, unless a failure is armed or the process crashed."""
        self._enter()
        try:
            what = _parts(session, boundary)
            if self.crashed:
                raise ProcessCrashed(f"the process crashed: no {what} is written")
            if self._faults.take(fault_of(boundary)):
                raise InjectedFailure(f"injected store write failure ({what})")
            return await self._inner.commit(session, boundary, owner=owner)
        finally:
            self._leave()

    async def load(self, session: str, *, envelopes: bool = True) -> SessionLoad | None:
        """A session's record, rows and envelopes (unless not asked for)."""
        return await self._counted(self._inner.load(session, envelopes=envelopes))

    async def sessions(self) -> list[SessionRecord]:
        """Every session."""
        return await self._counted(self._inner.sessions())

    async def scan_recoverable(self) -> RecoveryScan:
        """The startup scan."""
        return await self._counted(self._inner.scan_recoverable())

    async def receipts(
        self,
        session: str | None = None,
        *,
        op_id: str | None = None,
        states: frozenset[OpState] | None = None,
        recent: int | None = None,
    ) -> ReceiptQuery:
        """Receipts, open ones first."""
        query = self._inner.receipts(session, op_id=op_id, states=states, recent=recent)
        return await self._counted(query)

    async def open_receipts(self, session: str | None = None) -> OpenReceipts:
        """The receipts that may still be running (the overlap guard's read)."""
        return await self._counted(self._inner.open_receipts(session))

    async def handles(self, *, owner: str | None = None, target: str | None = None) -> HandleQuery:
        """Delegated-turn handle records, by id."""
        return await self._counted(self._inner.handles(owner=owner, target=target))

    async def abandon_markers(self) -> AbandonQuery:
        """Every session's abandon marker."""
        return await self._counted(self._inner.abandon_markers())

    async def queued(self, session: str | None = None) -> QueueQuery:
        """The durable queue entries."""
        return await self._counted(self._inner.queued(session))


def fault_of(boundary: Boundary) -> str:
    """Which ``fail_next`` kind a commit of ``boundary`` takes.

    ``queue_write`` for a commit that writes only the durable queue, ``store_write`` for
    every other (so a scenario's ``store_write`` fails the writes it always failed).
    """
    queue_only = (
        boundary.queue is not None
        and boundary.create is None
        and boundary.envelope is None
        and not (
            boundary.rows
            or boundary.delete
            or boundary.cut_states
            or boundary.operations
            or boundary.handles
        )
    )
    return "queue_write" if queue_only else "store_write"


def _parts(session: str, boundary: Boundary) -> str:
    """What a boundary writes, for messages: ``commit of s1 (rows, envelope)``."""
    parts = [
        name
        for name, present in (
            ("create", boundary.create is not None),
            ("delete", bool(boundary.delete)),
            ("rows", bool(boundary.rows)),
            ("cut_states", bool(boundary.cut_states)),
            ("envelope", boundary.envelope is not None),
            ("operations", bool(boundary.operations)),
            ("handles", bool(boundary.handles)),
            ("queue", boundary.queue is not None),
        )
        if present
    ]
    return f"commit of {session} ({', '.join(parts) or 'nothing'})"
