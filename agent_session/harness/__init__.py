"""The scripted fake-model harness: scenario files in, deterministic runs out.

A scenario file (``docs/scenarios.md``) declares models and their scripts, tools and their
behaviour, sessions, actions pinned to trace events or virtual times, limits and expectations.
The package holds its validated boundary (the pydantic schema in
:mod:`~agent_session.harness.scenario`; the loader, :mod:`~agent_session.harness.loader`, which
reads TOML or JSON, reports every problem as ``FILE: $.path.to.field: reason`` and converts
scripts into the ``stream_manager`` Structs the ``ScriptedModel`` plays), the runtime
(:mod:`~agent_session.harness.runner`: an engine per generation, the scripted tools and fault
injection of :mod:`~agent_session.harness.fakes`, expectations), the one virtual-time driver
(:mod:`~agent_session.harness.virtual_time`), the trace (:mod:`~agent_session.harness.trace`),
the crash-point sweep (:mod:`~agent_session.harness.crashpoints`) and the commands behind
``turnkeeper``. Pydantic stays at this edge: the engine gets plain Structs.
"""

from agent_session.harness.loader import (
    TRACE_EVENTS,
    ScenarioError,
    format_path,
    load_scenario,
    reference_problems,
    script_steps,
)
from agent_session.harness.scenario import (
    ACTION_OPS,
    Action,
    ActionSpec,
    EngineConfig,
    EventTrigger,
    Expect,
    Limits,
    ModelSpec,
    Scenario,
    ScriptSpec,
    SessionSpec,
    StepSpec,
    TimeTrigger,
    ToolCallSpec,
    ToolSpec,
    Trigger,
)

__all__ = [
    "ACTION_OPS",
    "TRACE_EVENTS",
    "Action",
    "ActionSpec",
    "EngineConfig",
    "EventTrigger",
    "Expect",
    "Limits",
    "ModelSpec",
    "Scenario",
    "ScenarioError",
    "ScriptSpec",
    "SessionSpec",
    "StepSpec",
    "TimeTrigger",
    "ToolCallSpec",
    "ToolSpec",
    "Trigger",
    "format_path",
    "load_scenario",
    "reference_problems",
    "script_steps",
]
