"""Running a scenario: the engine on virtual time, actions pinned to events, expectations.

Theory of operation
-------------------
The runner builds an :class:`~agent_session.Engine` from the scenario: one ``ScriptedModel``
per model (their scripts consumed in order by every stream on that model), one
``ScenarioTool`` per tool, a ``VirtualClock``, the fault injector as the pre-stream gate and a
store wrapper. The trace recorder is the engine's first observer; the action runner listens to
it, so an action runs synchronously inside the emission of its trigger event, after the event
is recorded and before the engine takes its next step.

Virtual time moves only when every task is blocked and no store call is in flight: the driver
(:class:`~agent_session.harness.virtual_time.VirtualTime`) then advances the clock to the next
deadline, a sleeper's or a timed action's. When every task is blocked and nobody sleeps, the
run is quiescent. The limits bound a run: ``max_events`` trace lines and ``max_virtual_ms`` of
virtual time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from agent_session._admission import GoalBoard, WorkspaceBoard
from agent_session._engine import Engine
from agent_session._events import EngineEvent
from agent_session._retry import RETRY_BACKOFF_CAP_S
from agent_session.harness.expect import check_expectations
from agent_session.harness.fakes import Faults, FaultyStore, ProcessCrashed, ScenarioTool
from agent_session.harness.loader import script_steps, shorten
from agent_session.harness.scenario import (
    ActionSpec,
    CancelOpAction,
    ClearQueueAction,
    CrashAction,
    DelegateAction,
    DiscardContextAction,
    DisposeAction,
    EnqueueAction,
    EventTrigger,
    FailNextAction,
    GoalAction,
    HandleAction,
    HardStopAction,
    RemoveDedupeAction,
    RestartAction,
    RestoreQueueAction,
    Scenario,
    SendAction,
    StopAction,
    ThinkingAction,
    TimeTrigger,
    WithdrawAction,
    WorkspaceAction,
)
from agent_session.harness.trace import Crash, Recorded, TraceLine, TraceRecorder
from agent_session.harness.virtual_time import VirtualTime, busy_sessions
from agent_session.ports import EngineConfig
from message_queue import Correlation, DispatchMode
from persistence import Store
from stream_manager import CallBehaviours, ScriptedModel, VirtualClock

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
        "crash",
        "restart",
        "delegate",
        "handle",
        "goal",
        "workspace",
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
        """As ``docs/cli.md`` says: 0 passed, 1 an expectation failed, 3 the engine failed."""
        if self.error is not None:
            return 3
        return 1 if self.failures else 0


@dataclass
class _Generation:
    """One engine's life in a run: a ``crash`` or ``restart`` ends it and starts the next.

    The engine lives in a host task of its own, so cancelling a crashed engine's task group
    never reaches the driver.
    """

    engine: Engine
    store: FaultyStore
    #: Set to shut the engine down (``restart``, the end of the run).
    stop: anyio.Event = field(default_factory=anyio.Event)
    #: Set once the engine is open and the scenario's sessions too (or opening failed).
    ready: anyio.Event = field(default_factory=anyio.Event)
    #: Set once the engine has exited.
    finished: anyio.Event = field(default_factory=anyio.Event)
    failure: BaseException | None = None
    #: The host's scope around the engine: a crash cancels it (the engine and all its tasks).
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    #: Cleared when the process "dies": a dead engine's events never reach the trace.
    alive: bool = True
    #: ``crash`` or ``restart``: what ends this generation at the driver's next turn.
    ending: str | None = None

    def ended(self) -> bool:
        """Whether a ``crash`` or ``restart`` ended this generation."""
        return self.ending is not None


class _Actions:
    """Runs the scenario's actions when their triggers fire."""

    def __init__(
        self,
        scenario: Scenario,
        faults: Faults,
        *,
        generation: _Generation,
        record: TraceRecorder,
    ) -> None:
        self._scenario = scenario
        self._faults = faults
        #: The running generation (the runner moves it on; ``crash``/``restart`` end it).
        self.generation = generation
        self._record = record
        #: Timed actions not yet run, earliest first (ties in file order). The driver runs
        #: them, outside any engine, so they outlive a crash. A restart's shutdown runs only
        #: the engine's own timers: an action falling due meanwhile runs, late, on the next
        #: engine, never on the one going away.
        self._timed: list[tuple[float, int, ActionSpec]] = []
        self._started = False
        self._event_actions: list[tuple[int, ActionSpec, EventTrigger]] = [
            (index, action, action.at)
            for index, action in enumerate(scenario.actions)
            if isinstance(action.at, EventTrigger)
        ]
        self._counts: dict[int, int] = {}
        self.errors: list[str] = []

    def on_line(self, line: TraceLine, event: Recorded) -> None:
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

    def start_all(self) -> None:
        """Once per run: ``start`` actions now; timed ones wait for the driver."""
        if self._started:
            return
        self._started = True
        for index, action in enumerate(self._scenario.actions):
            if action.at == "start":
                self.run(index, action)
            elif isinstance(action.at, TimeTrigger):
                self._timed.append((action.at.time_ms / 1000, index, action))
        self._timed.sort(key=lambda timed: (timed[0], timed[1]))

    def next_timed(self) -> float | None:
        """When the next timed action is due (virtual seconds), or ``None``."""
        return self._timed[0][0] if self._timed else None

    def run_due(self, now: float) -> None:
        """Run every timed action due at ``now``, in order."""
        while self._timed and self._timed[0][0] <= now:
            _, index, action = self._timed.pop(0)
            self.run(index, action)

    @property
    def engine(self) -> Engine:
        """The engine actions act on (the running generation's)."""
        return self.generation.engine

    def _do(self, action: ActionSpec) -> None:
        if isinstance(action.do, CrashAction | RestartAction):
            self._end_generation(action.do.op)
            return
        handler = _HANDLERS.get(type(action.do))
        if handler is None:  # the loader refuses every op outside SUPPORTED_OPS
            raise RunFailed(f"op {action.do.op!r} is not supported yet")
        handler(self.engine, self._faults, action.do)

    def _end_generation(self, how: str) -> None:
        """End the engine's generation; the driver then starts a new engine on the store.

        Either way the engine's tasks are cancelled now, at the trigger. ``crash``: the
        process dies: no further write, no further event. ``restart``: a clean shutdown:
        writes in flight finish and what the engine reports on its way out is traced.
        """
        generation = self.generation
        if generation.ending is not None:
            raise RunFailed(f"{how}: the engine is already going away")
        generation.ending = how
        if how == "crash":
            self._record(Crash())
            generation.alive = False
            generation.store.crashed = True
        generation.scope.cancel()  # a restart's writes in flight finish; its events are traced


def _send(engine: Engine, faults: Faults, do: Any) -> None:
    engine.session(do.session).send(do.text, entry=do.entry, mode=do.mode or DispatchMode.TOOL_END)


def _enqueue(engine: Engine, faults: Faults, do: Any) -> None:
    mode = do.mode or DispatchMode.TOOL_END
    if do.kind == "report" and do.handle is not None:  # TD-9: the engine decides its correlation
        engine.queue_report(
            do.session,
            do.text,
            entry=do.entry,
            dedupe_key=do.dedupe_key,
            mode=mode,
            handle=do.handle,
        )
        return
    correlation = None
    if do.handle is not None:  # correlated to the delegated turn under that handle
        record = engine.delegations.record(do.handle)
        correlation = Correlation(
            handle_id=record.handle_id, owner_session=record.owner, turn_id=record.turn_id
        )
    engine.session(do.session).enqueue(
        do.text,
        kind=do.kind,
        entry=do.entry,
        mode=mode,
        dedupe_key=do.dedupe_key,
        correlation=correlation,
        sealed=do.sealed,
    )


def _fail_next(engine: Engine, faults: Faults, do: Any) -> None:
    if do.what == "settlement":  # the owner's settlement writes (retried, R54)
        engine.delegations.fail_next += do.count
        return
    faults.arm(do.what, do.count)


def _cancel_op(engine: Engine, faults: Faults, do: Any) -> None:
    if not engine.manager.operations.cancel_nowait(op_id=do.op_id, tool=do.tool):
        raise RunFailed(f"no running operation {do.op_id or do.tool!r} to cancel")


def _goal(engine: Engine, faults: Faults, do: Any) -> None:
    goal = engine.session(do.session).goal
    if goal is None or not isinstance(engine.goals, GoalBoard):  # the loader refuses the first
        raise RunFailed(f"goal: session {do.session!r} has no goal the scenario can move")
    engine.goals.set(goal, do.state)


def _workspace(engine: Engine, faults: Faults, do: Any) -> None:
    if not isinstance(engine.workspaces, WorkspaceBoard):
        raise RunFailed("workspace: the engine's workspaces are not the scenario's")
    engine.workspaces.set(do.session, do.state)


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
    DelegateAction: lambda e, f, do: e.delegate(do.owner, do.target, do.handle, do.text),
    HandleAction: lambda e, f, do: e.interrupt_handle(do.handle),
    GoalAction: _goal,
    WorkspaceAction: _workspace,
}


def engine_config(scenario: Scenario) -> EngineConfig:
    """The engine settings of a scenario's ``[engine]`` table."""
    return EngineConfig(
        max_stream_steps=scenario.engine.max_stream_steps,
        resume_attempt_cap=scenario.engine.resume_attempt_cap,
        tool_deadline_s=scenario.engine.tool_deadline_ms / 1000,
        cancel_grace_s=scenario.engine.cancel_grace_ms / 1000,
        auto_retry=scenario.engine.auto_retry,
        retry_backoff_s=scenario.engine.retry_backoff_ms / 1000,
        retry_backoff_cap_s=max(RETRY_BACKOFF_CAP_S, scenario.engine.retry_backoff_ms / 1000),
        retry_max_attempts=scenario.engine.retry_max_attempts,
        context_window=scenario.engine.context_window,
        context_windows={
            model.id: model.context_window
            for model in scenario.models
            if model.context_window is not None
        },
        compact_at=scenario.engine.compact_at,
    )


async def run_scenario(
    scenario: Scenario,
    store: Store,
    *,
    observers: tuple[Callable[[EngineEvent], None], ...] = (),
) -> RunResult:
    """Run ``scenario`` on ``store`` to quiescence and check its expectations.

    A ``crash`` or ``restart`` action ends the engine's generation; the driver then starts a
    new engine on the same store (startup recovery runs), with the same scripts, tools and
    clock, and the run goes on.
    """
    return await _ScenarioRun(scenario, store, observers).run()


class _ScenarioRun:
    """One run: the scripts, tools, clock and trace that outlive every engine generation."""

    def __init__(
        self,
        scenario: Scenario,
        store: Store,
        observers: tuple[Callable[[EngineEvent], None], ...],
    ) -> None:
        self.scenario = scenario
        self.store = store
        self.observers = observers
        self.clock = VirtualClock()
        self.faults = Faults()
        behaviours = CallBehaviours()  # the scripts' per-call overrides, for the tools
        self.models = {
            m.id: ScriptedModel(
                m.id, script_steps(scenario, m.id), clock=self.clock, behaviours=behaviours
            )
            for m in scenario.models
        }
        self.tools = {t.name: ScenarioTool(t, self.clock, behaviours) for t in scenario.tools}
        self.recorder = TraceRecorder(self.clock)
        #: The host's goals and workspaces: they outlive every engine generation.
        self.goals = GoalBoard()
        self.workspaces = WorkspaceBoard()
        self.config = engine_config(scenario)
        self.actions: _Actions | None = None
        self.group: anyio.abc.TaskGroup | None = None

    async def run(self) -> RunResult:
        result = RunResult(name=self.scenario.name, trace=self.recorder.lines)
        finished = False
        async with anyio.create_task_group() as group:
            self.group = group
            generation = await self._start_generation()
            actions = _Actions(
                self.scenario, self.faults, generation=generation, record=self.recorder
            )
            self.actions = actions
            self.recorder.listen(actions.on_line)
            result.error = await self._drive_generations(actions)
            if result.error is None:
                result.error = self._run_errors(actions)
            if result.error is None and self.scenario.expect is not None:
                result.failures = await check_expectations(
                    self.scenario.expect, actions.engine.sessions, self.store, self.recorder.lines
                )
            result.virtual_ms = round(self.clock.now() * 1000)
            closing = await self.close()
            result.error = result.error or closing
            finished = True
        if not finished:  # a cancellation ended the run early: never a silent pass
            result.error = result.error or "the run was cancelled before the scenario finished"
        return result

    async def _drive_generations(self, actions: _Actions) -> str | None:
        while True:
            try:
                await _drive(self.scenario, actions, self.clock, self.recorder)
                current = actions.generation
                if current.ending is None:
                    return None
                await self._end(current)  # a crashed one writes nothing on its way out
                await self._start_generation()
            except RunFailed as error:
                return str(error)

    def _run_errors(self, actions: _Actions) -> str | None:
        if actions.errors:
            return "; ".join(actions.errors)
        exhausted = [
            line["message"]
            for line in self.recorder.lines
            if line["event"] == "stream-error" and line["type"] == "script_exhausted"
        ]
        return "; ".join(exhausted) if exhausted else None

    async def _start_generation(self) -> _Generation:
        faulty = FaultyStore(self.store, self.faults)
        holder: list[_Generation] = []

        def observe(event: EngineEvent) -> None:
            if not holder or holder[0].alive:
                self.recorder(event)
                for observer in self.observers:
                    observer(event)

        engine = Engine(
            store=faulty,
            models=self.models,
            tools={k: t for k, t in self.tools.items() if t.kind.value != "provider"},
            fallbacks={m.id: m.fallbacks for m in self.scenario.models},
            clock=self.clock,
            config=self.config,
            gate=self.faults,
            goals=self.goals,
            workspaces=self.workspaces,
            observers=(observe,),
        )
        generation = _Generation(engine=engine, store=faulty)
        holder.append(generation)
        if self.actions is not None:
            self.actions.generation = generation
        assert self.group is not None
        self.group.start_soon(self._host, generation)
        await generation.ready.wait()
        if generation.failure is not None and not generation.ended():
            if self.actions is None:  # the first engine: its store's refusal is the caller's
                raise generation.failure
            raise RunFailed(engine_failure(generation.failure))
        # A crash or restart while it opened (at a recovery's event) ended it already: what
        # it raised meanwhile is the dying engine's; the driver starts the next one.
        return generation

    async def _host(self, generation: _Generation) -> None:
        """The engine's own task: open it and the sessions, then live until stopped."""
        try:
            with generation.scope:
                async with generation.engine as engine:
                    try:
                        for spec in self.scenario.sessions:
                            await engine.open_session(spec.id, model=spec.model, goal=spec.goal)
                    except Exception as error:
                        generation.failure = error
                        return
                    finally:
                        generation.ready.set()
                    await generation.stop.wait()
        except Exception as error:  # opening the engine itself failed
            generation.failure = generation.failure or error
        finally:
            generation.ready.set()
            generation.finished.set()

    async def _end(self, generation: _Generation) -> None:
        """Stop the engine and wait for it; what it raised on its way out is the run's.

        A ``restart`` is a clean shutdown: the engine's own timers (a cancelled call's grace
        interval) run on the virtual clock. A ``crash`` and the run's end take no time. What
        then still runs in a tool, once the engine waits only for it, is abandoned: it ends
        unacknowledged, so its receipt stays ``indeterminate`` (OP-8: nothing resolves it).
        """
        generation.stop.set()
        finished = generation.finished.is_set
        if not finished():
            time = VirtualTime(self.clock, store=generation.store)
            if generation.ending == "restart":  # the engine's own timers run, within limits
                await time.advance(stop=finished, check=self._within_time_limit)
            else:
                await time.quiet()
        if not finished():  # it waits only for what runs in a tool
            self._abandon_tools()
            await generation.finished.wait()
        failure = generation.failure
        if failure is not None and generation.ending == "crash":
            failure = _not_of_the_crash(failure)
        if failure is not None:
            raise RunFailed(engine_failure(failure))

    def _within_time_limit(self, deadline: float) -> None:
        _check_virtual_time(self.scenario, deadline)

    def _abandon_tools(self) -> None:
        for tool in self.tools.values():
            tool.abandon()

    async def close(self) -> str | None:
        """End the last engine; what it raised on its way out, described, or ``None``."""
        if self.actions is None:
            return None
        generation = self.actions.generation
        try:
            await self._end(generation)
        except RunFailed as error:
            # A limit refused the restart's own shutdown: end what is left of it now.
            if not generation.finished.is_set():
                generation.scope.cancel()
                self._abandon_tools()
                await generation.finished.wait()
            return str(error)
        return None


def engine_failure(error: BaseException) -> str:
    """One line for what an engine raised: its first leaf error, type and message."""
    leaf = error
    while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
        leaf = leaf.exceptions[0]
    return f"the engine failed: {type(leaf).__name__}: {shorten(str(leaf))}"


def _not_of_the_crash(error: BaseException) -> BaseException | None:
    """What a crashed engine raised, less the writes the crash refused (``ProcessCrashed``).

    A dead process reports nothing: a task of it that went on to write after the crash met
    the sealed store, and that refusal is the crash itself, not a failure of the run.
    """
    if isinstance(error, BaseExceptionGroup):
        _, rest = error.split(ProcessCrashed)
        return rest
    return None if isinstance(error, ProcessCrashed) else error


def _check_virtual_time(scenario: Scenario, deadline: float) -> None:
    limit = scenario.limits.max_virtual_ms
    if deadline * 1000 > limit:
        raise RunFailed(f"no quiescence within {limit} virtual ms (limits.max_virtual_ms)")


async def _drive(
    scenario: Scenario,
    actions: _Actions,
    clock: VirtualClock,
    recorder: TraceRecorder,
) -> None:
    """Move virtual time until the run is quiescent or its engine's generation ends.

    The driver (``VirtualTime.advance``) moves the clock; the run adds its rules: the timed
    actions are deadlines of their own (run once the clock reaches them), a ``crash`` or
    ``restart`` stops the driving at the next quiet point, and the limits fail the run.
    """
    limits = scenario.limits
    generation = actions.generation
    actions.start_all()
    if generation.ended():
        return

    def stop() -> bool:
        if generation.ended():
            return True
        if len(recorder.lines) > limits.max_events:
            raise RunFailed(f"more than {limits.max_events} events (limits.max_events)")
        return False

    def within_limits(deadline: float) -> None:
        _check_virtual_time(scenario, deadline)

    time = VirtualTime(clock, store=generation.store)
    if await time.advance(
        stop=stop, due=actions.next_timed, check=within_limits, then=actions.run_due
    ):
        return
    busy = busy_sessions(generation.engine)
    if busy:
        raise RunFailed("the engine did not reach quiescence: " + "; ".join(busy))
