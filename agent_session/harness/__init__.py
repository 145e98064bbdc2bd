"""The scripted fake-model harness: scenario files in, deterministic runs out.

A scenario file (``docs/scenarios.md``) declares models and their scripts, tools and their
behaviour, sessions, actions pinned to trace events or virtual times, limits and expectations.
This package holds, for now, its validated boundary: the pydantic schema
(:mod:`~agent_session.harness.scenario`) and the loader that reads TOML or JSON, reports every
problem as ``FILE: $.path.to.field: reason`` and converts scripts into the ``stream_manager``
Structs the ``ScriptedModel`` plays (:mod:`~agent_session.harness.loader`). The runtime that
wires a scenario to an engine, the virtual-time driver and the trace observer come next; like
the loader, they keep pydantic at this edge and hand the engine plain Structs.
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
