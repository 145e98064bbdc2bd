"""A rig for the operation-lifecycle tests (``docs/operations.md``): a real Engine on virtual time.

The rig wraps the store (a ``MemoryStore`` or a ``SqliteStore`` in ``tmp_path``) so that

* every receipt write is logged in order (``writes``), to assert what was durable when;
* ``settle`` never mistakes "waiting for the database thread" for quiescence;
* ``crash()`` drops every later write: the engine dies with no further write, and a new engine
  opening the same file runs startup recovery (the ``crash`` op of ``docs/scenarios.md``).

``OpTool`` is a client tool whose behaviour each test (or each call, through the scripted
call's ``behaviour``, which the rig's models record in its ``CallBehaviours``) chooses:
duration, result, capability error, raise, hang, lost completion, and how it reacts to
cancellation (acknowledge, ignore, finish anyway, or report termination unconfirmed).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
import msgspec

from agent_session import AgentSession, Engine, EngineConfig, EngineEvent
from agent_session.harness.fakes import Faults, FaultyStore
from agent_session.harness.virtual_time import VirtualTime
from persistence import Boundary, Committed, MemoryStore, OperationRecord, Store
from stream_manager import (
    CallBehaviours,
    ChatMessage,
    ErrorType,
    Finish,
    FinishReason,
    Model,
    ModelError,
    ModelRequest,
    Part,
    Role,
    ScriptedModel,
    ScriptStep,
    ScriptToolCall,
    TerminationUnconfirmed,
    TextPart,
    Tool,
    ToolCallPart,
    ToolContext,
    ToolDefinition,
    ToolKind,
    ToolResultPart,
    ToolTransportLost,
    ToolUnavailable,
    VirtualClock,
)
from tests import store_kit

T = TypeVar("T")

DEADLINE_S = 10.0  # the tool deadline of these tests: 10 s (fake clock)
GRACE_S = 2.0  # ... acknowledgement interval 2 s
CONFIG = EngineConfig(max_stream_steps=8, tool_deadline_s=DEADLINE_S, cancel_grace_s=GRACE_S)

ToolHook = Callable[[ToolCallPart, ToolContext], Awaitable[None]]


# ---------------------------------------------------------------- scripts


def call(tool: str, /, **args: object) -> ScriptToolCall:
    """A client call of ``tool`` with ``args``."""
    return ScriptToolCall(tool=tool, args=args)


def odd(tool: str, behaviour: Mapping[str, object], /, **args: object) -> ScriptToolCall:
    """A client call whose tool behaves as ``behaviour`` says for this call only."""
    return ScriptToolCall(tool=tool, args=args, behaviour=behaviour)


def step(*calls: ScriptToolCall | str) -> ScriptStep:
    """A step making client calls (a bare name is a call without arguments)."""
    return ScriptStep(
        tool_calls=tuple(ScriptToolCall(tool=c) if isinstance(c, str) else c for c in calls)
    )


def text(words: str = "done") -> ScriptStep:
    """A text-only step (it ends the stream)."""
    return ScriptStep(text=words)


def op_id(stream: int, step_n: int, index: int, session: str = "s1") -> str:
    """The id the engine gives the ``index``-th client call of a step (position, not luck)."""
    return f"{session}/{stream}/{step_n}/{index}"


def tool_results(request: ModelRequest) -> list[ToolResultPart]:
    """Every tool result a model request carries."""
    return [r for m in request.messages if m.role is Role.TOOL for r in m.tool_results]


def last_results(model: ScriptedModel | Model) -> list[ToolResultPart]:
    """The tool results of the newest message of the model's latest request."""
    assert isinstance(model, ScriptedModel | LiveModel)
    messages: tuple[ChatMessage, ...] = model.requests[-1].messages
    tools = [m for m in messages if m.role is Role.TOOL]
    assert tools, "the model got no tool results"
    return list(tools[-1].tool_results)


# ---------------------------------------------------------------- a model we drive part by part


@dataclass(frozen=True)
class LiveStep:
    """One step of a ``LiveModel``: its parts, then a finish, a hang, or a stream error."""

    parts: tuple[Part, ...] = ()
    then: str = "finish"  # "finish" | "hang" | "error"
    finish: FinishReason = FinishReason.STOP


class LiveModel:
    """A model whose steps stream given parts and may hang or fail before their finish.

    The ``ScriptedModel`` always follows a provider-executed call with its result; this one can
    stop in between (a provider tool cut by a stop, or a stream lost mid-step).
    """

    def __init__(self, model_id: str, steps: Sequence[LiveStep]) -> None:
        self._id = model_id
        self._steps = list(steps)
        self.requests: list[ModelRequest] = []

    @property
    def id(self) -> str:
        return self._id

    def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        self.requests.append(request)
        index = len(self.requests) - 1
        played = (
            self._steps[index] if index < len(self._steps) else LiveStep((TextPart(text="ok"),))
        )
        return self._play(played)

    async def _play(self, played: LiveStep) -> AsyncIterator[Part]:
        for part in played.parts:
            await anyio.lowlevel.checkpoint()
            yield part
        if played.then == "hang":
            await anyio.sleep_forever()
        if played.then == "error":
            raise ModelError(ErrorType.PROVIDER_ERROR, "network: connection reset mid-step")
        yield Finish(reason=played.finish)


def provider_call(call_id: str, name: str = "web_search", **args: object) -> ToolCallPart:
    """A provider-executed call part."""
    return ToolCallPart(call_id=call_id, name=name, args=args, provider_executed=True)


def provider_result(call_id: str, name: str = "web_search", output: object = "r") -> ToolResultPart:
    """A provider-executed call's result part."""
    return ToolResultPart(call_id=call_id, name=name, output=output, provider_executed=True)


# ---------------------------------------------------------------- tools


_RAISES: dict[str, type[Exception]] = {
    "runtime": RuntimeError,
    "lost": ToolTransportLost,
    "unavailable": ToolUnavailable,
}


@dataclass(eq=False)
class OpTool:
    """A client tool on the virtual clock whose behaviour the test scripts.

    Per call, the keys of the scripted call's ``behaviour`` (looked up in ``behaviours``, which
    the rig shares with its models) override the fields of the same name. ``on_cancel``:

    * ``ack``: stop after ``ack_delay_s`` (the cancellation propagates: acknowledged);
    * ``ignore``: never stop nor answer until ``release()`` (the end of the test);
    * ``finish``: keep working ``ack_delay_s`` more, then return the result anyway;
    * ``unconfirmed``: stop, but report that the layer below did not confirm termination.

    ``raises_as`` picks what ``raises`` raises: ``runtime`` (a ``RuntimeError``), ``lost`` (the
    transport broke mid-call, ``ToolTransportLost``) or ``unavailable`` (never sent,
    ``ToolUnavailable``). ``definition`` is the tool's declaration (e.g. ``read_only``).

    ``lose_completion`` records the result through ``context.record_completion`` (OP-5) and then
    never returns it: with ``stuck`` it does not even end when cancelled (until ``release()``).
    """

    name: str
    kind: ToolKind = ToolKind.CLIENT
    duration_s: float = 0.0
    output: object = "ok"
    fail: str | None = None
    raises: str | None = None
    raises_as: str = "runtime"
    definition: ToolDefinition | None = None
    hang: bool = False
    on_cancel: str = "ack"
    ack_delay_s: float = 0.0
    lose_completion: bool = False
    stuck: bool = False
    deadline_s: float | None = None
    on_start: ToolHook | None = None
    on_cancelled: ToolHook | None = None
    clock: VirtualClock = field(default_factory=VirtualClock)
    behaviours: CallBehaviours = field(default_factory=CallBehaviours)
    calls: list[ToolCallPart] = field(default_factory=list)
    contexts: list[ToolContext] = field(default_factory=list)
    cancels: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    _released: anyio.Event | None = None

    def deadline_for(self, call: ToolCallPart) -> float | None:
        """This tool's own deadline (seconds), else the engine's."""
        return self.deadline_s

    def _event(self) -> anyio.Event:
        if self._released is None:
            self._released = anyio.Event()
        return self._released

    def release(self) -> None:
        """Let a tool that ignores its cancellation (or is stuck) end."""
        self._event().set()

    def _get(self, call: ToolCallPart, key: str) -> object:
        return self.behaviours.of(call.call_id).get(key, getattr(self, key))

    async def _sleep(self, seconds: object) -> None:
        assert isinstance(seconds, int | float)
        if seconds > 0:
            await self.clock.sleep_until(self.clock.now() + seconds)

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        self.calls.append(call)
        self.contexts.append(context)
        released = self._event()
        result = (
            ToolResultPart(
                call_id=call.call_id,
                name=call.name,
                output={"error": self._get(call, "fail")},
                is_error=True,
            )
            if self._get(call, "fail") is not None
            else ToolResultPart(
                call_id=call.call_id, name=call.name, output=self._get(call, "output")
            )
        )
        try:
            if self.on_start is not None:
                await self.on_start(call, context)
            await self._sleep(self._get(call, "duration_s"))
            if self._get(call, "hang"):
                await anyio.sleep_forever()
            message = self._get(call, "raises")
            if message is not None:
                raise _RAISES[str(self._get(call, "raises_as"))](str(message))
            if self._get(call, "lose_completion"):
                context.record_completion(result)
                if self._get(call, "stuck"):
                    with anyio.CancelScope(shield=True):
                        await released.wait()
                await anyio.sleep_forever()
            return result
        except anyio.get_cancelled_exc_class():
            self.cancels.append(self.clock.now())
            with anyio.CancelScope(shield=True):
                if self.on_cancelled is not None:
                    await self.on_cancelled(call, context)
                mode = self._get(call, "on_cancel")
                if mode == "ignore":
                    await released.wait()
                else:
                    await self._sleep(self._get(call, "ack_delay_s"))
                if mode == "finish":
                    return result  # it finished its work after all (a late completion)
                if mode == "unconfirmed":
                    raise TerminationUnconfirmed("the layer below did not confirm") from None
            raise
        finally:
            self.ends.append(self.clock.now())


# ---------------------------------------------------------------- the store


class LedgerStore(FaultyStore):
    """The fault wrapper, with receipt writes logged in order; a crash drops every commit.

    Unlike ``FaultyStore``'s crash (commits refused), a crashed ledger drops commits quietly:
    the test's process goes on as if they were written, the file never sees them.
    """

    def __init__(self, inner: Store) -> None:
        super().__init__(inner, Faults())
        self.inner = inner
        self.writes: list[OperationRecord] = []
        #: The receipts of each receipt-writing call, by op id: one tuple per transaction.
        self.write_calls: list[tuple[str, ...]] = []
        self.crashed = False

    def crash(self) -> None:
        """The process dies here: no later write reaches the store."""
        self.crashed = True

    async def track(self, work: Awaitable[T]) -> T:
        """Await ``work`` (e.g. a read through another connection) counted as a store call."""
        self._enter()
        try:
            return await work
        finally:
            self._leave()

    def states_of(self, op: str) -> list[str]:
        """The states ``op``'s receipt was written with, in order."""
        return [w.state.value for w in self.writes if w.op_id == op]

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        """Log the boundary's receipts (one tuple per transaction); after a crash, drop it."""
        if self.crashed:
            return Committed()
        if boundary.operations:
            self.writes.extend(boundary.operations)
            self.write_calls.append(tuple(r.op_id for r in boundary.operations))
        return await super().commit(session, boundary, owner=owner)


# ---------------------------------------------------------------- the rig


@dataclass
class OpRig:
    engine: Engine
    clock: VirtualClock
    models: dict[str, Model]
    tools: dict[str, OpTool]
    store: LedgerStore
    events: list[EngineEvent]
    hooks: list[Callable[[EngineEvent], None]]
    time: VirtualTime

    def session(self, name: str = "s1") -> AgentSession:
        return self.engine.session(name)

    def of(self, kind: type[T]) -> list[T]:
        return [e for e in self.events if isinstance(e, kind)]

    def on(self, hook: Callable[[EngineEvent], None]) -> None:
        """Run ``hook`` inside every later event's emission."""
        self.hooks.append(hook)

    def scripted(self, name: str = "M") -> ScriptedModel:
        model = self.models[name]
        assert isinstance(model, ScriptedModel)
        return model

    async def settle(self) -> None:
        """Move virtual time until nothing sleeps; every session must then be idle."""
        await self.time.settle(self.engine)

    async def run_until(self, when: float) -> None:
        """Move virtual time to ``when`` (every sleeper due on the way runs), then quiesce."""
        await self.time.run_until(when)

    async def receipt(self, op: str) -> OperationRecord:
        record = await store_kit.receipt(self.store, op)
        assert record is not None, f"no receipt {op}"
        return record

    async def receipts(self) -> list[OperationRecord]:
        return list((await self.store.receipts()).records)

    def release(self) -> None:
        for tool in self.tools.values():
            tool.release()


@asynccontextmanager
async def op_rig(
    scripts: Mapping[str, Sequence[ScriptStep]] | None = None,
    *,
    tools: Sequence[OpTool] = (),
    models: Sequence[Model] = (),
    config: EngineConfig = CONFIG,
    store: Store | None = None,
    clock: VirtualClock | None = None,
    sessions: Sequence[tuple[str, str]] = (("s1", "M"),),
    extra_tools: Mapping[str, Tool] | None = None,
) -> AsyncIterator[OpRig]:
    """A running engine with one session per ``sessions`` entry; tools released on exit."""
    the_clock = clock if clock is not None else VirtualClock()
    behaviours = CallBehaviours()
    all_models: dict[str, Model] = {
        name: ScriptedModel(name, steps, clock=the_clock, behaviours=behaviours)
        for name, steps in (scripts or {}).items()
    }
    all_models.update({m.id: m for m in models})
    tool_map = {t.name: t for t in tools}
    for tool in tool_map.values():
        tool.clock = the_clock
        tool.behaviours = behaviours
    engine_tools: dict[str, Tool] = {**tool_map, **(extra_tools or {})}
    events: list[EngineEvent] = []
    hooks: list[Callable[[EngineEvent], None]] = []

    def observe(event: EngineEvent) -> None:
        events.append(event)
        for hook in hooks:
            hook(event)

    ledger = LedgerStore(store if store is not None else MemoryStore())
    engine = Engine(
        store=ledger,
        models=all_models,
        tools=engine_tools,
        clock=the_clock,
        config=config,
        observers=[observe],
    )
    time = VirtualTime(the_clock, store=ledger)
    rig = OpRig(engine, the_clock, all_models, tool_map, ledger, events, hooks, time)
    try:
        async with engine:
            for session, model in sessions:
                await engine.open_session(session, model=model)
            try:
                yield rig
            finally:
                rig.release()
    finally:
        rig.release()


def encoded(values: Sequence[object]) -> list[bytes]:
    """Each value as JSON (receipts and events are msgspec Structs)."""
    return [msgspec.json.encode(v) for v in values]
