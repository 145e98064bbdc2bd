"""A rig for session tests: an Engine over ScriptedModels, fake tools we own, a MemoryStore
and a virtual clock, with every engine event recorded in order.

Tests drive it with ``await r.settle()`` (``agent_session/harness/virtual_time.py``): virtual
time moves to the next sleeper whenever every task is blocked, until nothing sleeps
(quiescence), and then every session must be idle. Hooks on tools and on events let a test
act at an exact point of the turn, the way a scenario action runs inside its trigger's emission.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import anyio

from agent_session import (
    AgentSession,
    Engine,
    EngineConfig,
    EngineEvent,
    EntryDequeued,
    Phase,
    PhaseChanged,
    PreStreamGate,
)
from agent_session._owners import TurnOwner
from agent_session.harness.fakes import Faults, FaultyStore
from agent_session.harness.trace import event_name as tag
from agent_session.harness.virtual_time import VirtualTime
from message_queue import Correlation
from persistence import HandleRecord, HistoryRow, MemoryStore, RowKind, SqliteStore, Store
from persistence.postgres import PostgresStore
from stream_manager import (
    Model,
    ScriptedModel,
    ScriptStep,
    ScriptToolCall,
    StreamAborted,
    ToolCallPart,
    ToolContext,
    ToolKind,
    ToolResultPart,
    VirtualClock,
)
from tests import store_kit

T = TypeVar("T")


@dataclass
class HookTool:
    """A client tool: ``before`` runs first (queue something, stop the session ...), then an
    optional ``gate`` is awaited, then it answers ``output`` (or the call's ``output`` arg)."""

    name: str
    output: object = "ok"
    kind: ToolKind = ToolKind.CLIENT
    before: Callable[[ToolCallPart], object] | None = None
    gate: anyio.Event | None = None
    duration_s: float = 0.0
    clock: VirtualClock | None = None
    calls: list[ToolCallPart] = field(default_factory=list)

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        self.calls.append(call)
        if self.before is not None:
            self.before(call)
        if self.duration_s and self.clock is not None:
            await self.clock.sleep_until(self.clock.now() + self.duration_s)
        if self.gate is not None:
            await self.gate.wait()
        return ToolResultPart(
            call_id=call.call_id, name=call.name, output=call.args.get("output", self.output)
        )


def T_(*tools: str) -> ScriptStep:
    """A step calling client tools."""
    return ScriptStep(tool_calls=tuple(ScriptToolCall(tool=t) for t in tools))


def X(text: str = "done", delay_ms: int = 0) -> ScriptStep:
    """A text-only step."""
    return ScriptStep(text=text, delay_ms=delay_ms)


def P(tool: str, text: str = "partial text") -> ScriptStep:
    """A step with a provider-executed tool, then text."""
    return ScriptStep(
        tool_calls=(ScriptToolCall(tool=tool, provider_executed=True, result={"ok": True}),),
        text=text,
    )


@dataclass
class Rig:
    engine: Engine
    clock: VirtualClock
    models: dict[str, ScriptedModel]
    tools: dict[str, HookTool]
    store: Store
    events: list[EngineEvent]
    hooks: list[Callable[[EngineEvent], object]]
    time: VirtualTime

    def session(self, name: str = "s1") -> AgentSession:
        return self.engine.session(name)

    def names(self) -> list[str]:
        return [tag(e) for e in self.events]

    def of(self, kind: type[T]) -> list[T]:
        return [e for e in self.events if isinstance(e, kind)]

    def on(self, hook: Callable[[EngineEvent], object]) -> None:
        """Run ``hook`` synchronously inside every event's emission (after it is recorded)."""
        self.hooks.append(hook)

    async def settle(self) -> None:
        """Move virtual time until the engine is quiescent (every session idle)."""
        await self.time.settle(self.engine)

    async def history(self, session: str = "s1") -> list[HistoryRow]:
        return await store_kit.history(self.store, session)

    async def kinds(self, session: str = "s1") -> list[RowKind]:
        return [row.kind for row in await self.history(session)]

    def dequeued_only_once_idle(self) -> list[str]:
        """The entries dequeued after the last stream abort, each only after the session went
        IDLE: the abort path dispatched nothing itself, the idle drain sent them (AS-13)."""
        aborted = max(i for i, e in enumerate(self.events) if isinstance(e, StreamAborted))
        idle: int | None = None
        dequeued: list[str] = []
        for index, event in enumerate(self.events[aborted:], aborted):
            if isinstance(event, PhaseChanged) and event.to is Phase.IDLE and idle is None:
                idle = index
            elif isinstance(event, EntryDequeued):
                assert idle is not None, f"{event.entry} was dequeued before the abort went idle"
                dequeued.append(event.entry)
        return dequeued


@asynccontextmanager
async def session_rig(
    scripts: Mapping[str, Sequence[ScriptStep]],
    *,
    tools: Sequence[HookTool] = (),
    models: Sequence[Model] = (),
    fallbacks: Mapping[str, Sequence[str]] | None = None,
    config: EngineConfig | None = None,
    gate: PreStreamGate | None = None,
    store: Store | None = None,
    sessions: Sequence[tuple[str, str]] = (("s1", "M"),),
    handles: Sequence[tuple[Correlation, str]] = (),
    owner: TurnOwner | None = None,
) -> AsyncIterator[Rig]:
    """An engine with one session per ``sessions`` entry, running, with events recorded.

    ``models`` are models of the test's own (by id) beside the scripted ones, which they replace.
    ``handles``: ``(correlation, target)`` of delegated turns active once the engine is open
    (an owner of the test's own, known to the engine's: a resume of such a turn is admitted,
    R41). A test of startup writes them with :func:`active_handles` first instead.
    """
    clock = VirtualClock()
    scripted = {name: ScriptedModel(name, steps, clock=clock) for name, steps in scripts.items()}
    tool_map = {t.name: t for t in tools}
    for name in ("bash", "task_await", "a", "b"):
        tool_map.setdefault(name, HookTool(name))
    for tool in tool_map.values():
        tool.clock = clock
    events: list[EngineEvent] = []
    hooks: list[Callable[[EngineEvent], object]] = []

    def observe(event: EngineEvent) -> None:
        events.append(event)
        for hook in hooks:
            hook(event)

    the_store = store if store is not None else MemoryStore()
    # A SQLite call runs on a thread: counted in flight, the driver waits for it (a FaultyStore,
    # such as the operation tests' LedgerStore, counts its own calls).
    tracked: Store = (
        FaultyStore(the_store, Faults())
        if isinstance(the_store, SqliteStore | PostgresStore)
        else the_store
    )
    engine = Engine(
        store=tracked,
        models={**scripted, **{model.id: model for model in models}},
        tools=tool_map,
        fallbacks=fallbacks,
        clock=clock,
        config=config or EngineConfig(max_stream_steps=8),
        gate=gate,
        owner=owner,
        observers=[observe],
    )
    async with engine:
        engine.delegations.load(map(handle_record, handles), ())
        for session, model in sessions:
            await engine.open_session(session, model=model)
        time = VirtualTime(clock, store=tracked if isinstance(tracked, FaultyStore) else None)
        yield Rig(engine, clock, scripted, tool_map, the_store, events, hooks, time)


def handle_record(handle: tuple[Correlation, str]) -> HandleRecord:
    """The active handle record of ``(correlation, target)``."""
    correlation, target = handle
    return HandleRecord(
        handle_id=correlation.handle_id,
        owner=correlation.owner_session,
        target=target,
        turn_id=correlation.turn_id,
    )


async def active_handles(store: Store, *handles: tuple[Correlation, str]) -> None:
    """Write an active handle for each ``(correlation, target)`` (the owner's records)."""
    async with store:
        for handle in handles:
            record = handle_record(handle)
            await store_kit.commit(store, record.owner, handles=(record,))


class FailingGate:
    """A pre-stream gate that fails the next ``count`` checks (optionally only for ``purpose``)."""

    def __init__(self, count: int = 0, purpose: str | None = None) -> None:
        self.count = count
        self.purpose = purpose
        self.checks: list[str] = []

    async def check(self, session: str, purpose: str) -> None:
        from agent_session import PreStreamFailure

        self.checks.append(purpose)
        await anyio.lowlevel.checkpoint()
        if self.count > 0 and (self.purpose is None or self.purpose == purpose):
            self.count -= 1
            raise PreStreamFailure(f"gate refused the {purpose}")
