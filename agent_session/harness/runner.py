"""Running a scenario: the engine on virtual time, actions pinned to events, expectations.

Theory of operation
-------------------
The runner builds an :class:`~agent_session.Engine` from the scenario: one ``ScriptedModel``
per model (their scripts consumed in order by every stream on that model), one
``ScenarioTool`` per tool, a ``VirtualClock``, the fault injector as the pre-stream gate and a
store wrapper. The trace recorder is the engine's first observer; the action runner listens to
it, so an action runs synchronously inside the emission of its trigger event, after the event
is recorded and before the engine takes its next step.

Virtual time moves only when every task is blocked: the driver then advances the clock to the
next sleeper's deadline. When every task is blocked and nobody sleeps, the run is quiescent.
The limits bound a run: ``max_events`` trace lines and ``max_virtual_ms`` of virtual time.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import anyio

from agent_session._engine import Engine
from agent_session._events import EngineEvent
from agent_session.harness.expect import check_expectations
from agent_session.harness.fakes import Faults, FaultyStore, ScenarioTool
from agent_session.harness.loader import script_steps
from agent_session.harness.scenario import (
    ActionSpec,
    CancelOpAction,
    ClearQueueAction,
    DiscardContextAction,
    DisposeAction,
    EnqueueAction,
    EventTrigger,
    FailNextAction,
    HardStopAction,
    RemoveDedupeAction,
    RestoreQueueAction,
    Scenario,
    SendAction,
    StopAction,
    ThinkingAction,
    TimeTrigger,
    WithdrawAction,
)
from agent_session.harness.trace import TraceLine, TraceRecorder
from agent_session.ports import EngineConfig
from message_queue import DispatchMode
from persistence import Store
from stream_manager import ScriptedModel, VirtualClock

#: The action ops the runtime carries out today; the loader refuses the others.
SUPPORTED_OPS: frozenset[str] = frozenset(
    {
        "send",
        "enqueue",
        "withdraw",
        "remove_dedupe",
        "clear_queue",
        "restore_queue",
        "stop",
        "hard_stop",
        "dispose",
        "fail_next",
        "thinking",
        "discard_context",
        "cancel_op",
    }
)


class RunFailed(Exception):
    """The engine failed, an action could not run, or the run hit its limits (exit 3)."""


@dataclass
class RunResult:
    """What one scenario run produced."""

    name: str
    trace: list[TraceLine]
    failures: list[str] = field(default_factory=list)
    error: str | None = None
    virtual_ms: int = 0

    @property
    def exit_code(self) -> int:
        """CONTRACT.md: 0 passed, 1 an expectation failed, 3 the engine failed."""
        if self.error is not None:
            return 3
        return 1 if self.failures else 0


class _Actions:
    """Runs the scenario's actions when their triggers fire."""

    def __init__(self, scenario: Scenario, engine: Engine, faults: Faults) -> None:
        self._engine = engine
        self._faults = faults
        self._event_actions: list[tuple[int, ActionSpec, EventTrigger]] = [
            (index, action, action.at)
            for index, action in enumerate(scenario.actions)
            if isinstance(action.at, EventTrigger)
        ]
        self._counts: dict[int, int] = {}
        self.errors: list[str] = []

    def on_line(self, line: TraceLine, event: EngineEvent) -> None:
        del event
        for index, action, trigger in self._event_actions:
            if line["event"] != trigger.event:
                continue
            if any(line.get(key) != value for key, value in trigger.match.items()):
                continue
            seen = self._counts.get(index, 0) + 1
            self._counts[index] = seen
            if seen == trigger.nth:
                self.run(index, action)

    def run(self, index: int, action: ActionSpec) -> None:
        try:
            self._do(action)
        except Exception as error:  # an action that cannot run fails the run, with its reason
            self.errors.append(f"$.actions[{index}].do ({action.do.op}): {error}")

    def _do(self, action: ActionSpec) -> None:
        handler = _HANDLERS.get(type(action.do))
        if handler is None:  # the loader refuses every op outside SUPPORTED_OPS
            raise RunFailed(f"op {action.do.op!r} is not supported yet")
        handler(self._engine, self._faults, action.do)


def _send(engine: Engine, faults: Faults, do: Any) -> None:
    engine.session(do.session).send(do.text, entry=do.entry, mode=do.mode or DispatchMode.TOOL_END)


def _enqueue(engine: Engine, faults: Faults, do: Any) -> None:
    if do.handle is not None:
        raise RunFailed("enqueue with a delegated handle is not supported yet")
    engine.session(do.session).enqueue(
        do.text,
        kind=do.kind,
        entry=do.entry,
        mode=do.mode or DispatchMode.TOOL_END,
        dedupe_key=do.dedupe_key,
        sealed=do.sealed,
    )


def _fail_next(engine: Engine, faults: Faults, do: Any) -> None:
    if do.what == "settlement":
        raise RunFailed("fail_next of settlement is not supported yet")
    faults.arm(do.what, do.count)


def _cancel_op(engine: Engine, faults: Faults, do: Any) -> None:
    if not engine.manager.operations.cancel_nowait(op_id=do.op_id, tool=do.tool):
        raise RunFailed(f"no running operation {do.op_id or do.tool!r} to cancel")


def _dispose(engine: Engine, faults: Faults, do: Any) -> None:
    engine._spawn(engine.session(do.session).dispose)


_Handler = Callable[[Engine, Faults, Any], object]
_HANDLERS: dict[type, _Handler] = {
    SendAction: _send,
    EnqueueAction: _enqueue,
    WithdrawAction: lambda e, f, do: e.session(do.session).withdraw(do.entry, "withdrawn"),
    RemoveDedupeAction: lambda e, f, do: e.session(do.session).remove_dedupe(do.prefix),
    ClearQueueAction: lambda e, f, do: e.session(do.session).clear_queue(
        "cleared by the scenario", hard_stop=do.hard_stop
    ),
    RestoreQueueAction: lambda e, f, do: e.session(do.session).restore_queue(),
    StopAction: lambda e, f, do: e.session(do.session).stop(),
    HardStopAction: lambda e, f, do: e.session(do.session).hard_stop(),
    DisposeAction: _dispose,
    CancelOpAction: _cancel_op,
    FailNextAction: _fail_next,
    ThinkingAction: lambda e, f, do: e.session(do.session).set_thinking(do.level),
    DiscardContextAction: lambda e, f, do: e.session(do.session).discard_context(),
}


async def run_scenario(
    scenario: Scenario,
    store: Store,
    *,
    observers: tuple[Callable[[EngineEvent], None], ...] = (),
) -> RunResult:
    """Run ``scenario`` on ``store`` to quiescence and check its expectations."""
    clock = VirtualClock()
    faults = Faults()
    models = {
        m.id: ScriptedModel(m.id, script_steps(scenario, m.id), clock=clock)
        for m in scenario.models
    }
    tools = {t.name: ScenarioTool(t, clock) for t in scenario.tools}
    recorder = TraceRecorder(clock)
    config = EngineConfig(
        max_stream_steps=scenario.engine.max_stream_steps,
        resume_attempt_cap=scenario.engine.resume_attempt_cap,
        tool_deadline_s=scenario.engine.tool_deadline_ms / 1000,
        cancel_grace_s=scenario.engine.cancel_grace_ms / 1000,
    )
    faulty = FaultyStore(store, faults)
    engine = Engine(
        store=faulty,
        models=models,
        tools={name: tool for name, tool in tools.items() if tool.kind.value != "provider"},
        fallbacks={m.id: m.fallbacks for m in scenario.models},
        clock=clock,
        config=config,
        gate=faults,
        observers=(recorder, *observers),
    )
    result = RunResult(name=scenario.name, trace=recorder.lines)
    async with engine:
        actions = _Actions(scenario, engine, faults)
        recorder.listen(actions.on_line)
        for spec in scenario.sessions:
            await engine.open_session(spec.id, model=spec.model)
        try:
            await _drive(scenario, engine, clock, actions, recorder, faulty)
            if actions.errors:
                raise RunFailed("; ".join(actions.errors))
            exhausted = [
                line["message"]
                for line in recorder.lines
                if line["event"] == "stream-error" and line["type"] == "script_exhausted"
            ]
            if exhausted:
                raise RunFailed("; ".join(exhausted))
        except RunFailed as error:
            result.error = str(error)
        else:
            if scenario.expect is not None:
                result.failures = await check_expectations(
                    scenario.expect, engine.sessions, store, recorder.lines
                )
        finally:
            for tool in tools.values():
                tool.release()
    result.virtual_ms = round(clock.now() * 1000)
    return result


async def _drive(
    scenario: Scenario,
    engine: Engine,
    clock: VirtualClock,
    actions: _Actions,
    recorder: TraceRecorder,
    store: FaultyStore,
) -> None:
    """Start the actions, then move virtual time until the run is quiescent."""
    limits = scenario.limits
    for index, action in enumerate(scenario.actions):
        if action.at == "start":
            actions.run(index, action)
        elif isinstance(action.at, TimeTrigger):
            engine._spawn(_at_time(clock, action.at.time_ms, index, action, actions))
    while True:
        await anyio.wait_all_tasks_blocked()
        if store.in_flight:
            await store.settled()  # blocked on the database thread is not idle
            continue
        if len(recorder.lines) > limits.max_events:
            raise RunFailed(f"more than {limits.max_events} events (limits.max_events)")
        deadline = clock.next_deadline()
        if deadline is None:
            break
        if deadline * 1000 > limits.max_virtual_ms:
            raise RunFailed(
                f"no quiescence within {limits.max_virtual_ms} virtual ms (limits.max_virtual_ms)"
            )
        clock.advance_to(deadline)
    busy = [s.describe() for s in engine.sessions.values() if not s.idle]
    if busy:
        raise RunFailed("the engine did not reach quiescence: " + "; ".join(busy))


def _at_time(
    clock: VirtualClock, time_ms: int, index: int, action: ActionSpec, actions: _Actions
) -> Callable[[], Coroutine[Any, Any, None]]:
    async def wait_then_run() -> None:
        await clock.sleep_until(time_ms / 1000)
        actions.run(index, action)

    return wait_then_run
