"""What the harness runtime cannot play yet, named honestly instead of silently ignored.

Expectations on delegated handles (``expect.handles``) and the ops of the delegation, goal,
workspace and crash-recovery work make a scenario invalid for this runtime: exit 2 with the
field named, never a run that pretends the feature exists. (The ops are refused by the loader
through ``SUPPORTED_OPS``; ``fail_next`` of ``settlement`` and expectations are checked here.)
"""

from __future__ import annotations

from agent_session.harness.scenario import Scenario


def unsupported_features(scenario: Scenario) -> list[str]:
    """``$.path: reason`` lines for what this runtime cannot carry out yet."""
    problems = [
        f"$.actions[{index}].do.what: fail_next of 'settlement' is not supported yet"
        for index, action in enumerate(scenario.actions)
        if action.do.op == "fail_next" and getattr(action.do, "what", None) == "settlement"
    ]
    expect = scenario.expect
    if expect is not None and expect.handles:
        problems.append("$.expect.handles: expectations on handles are not supported yet")
    return problems
