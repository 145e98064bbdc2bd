"""What the harness runtime cannot play yet, named honestly instead of silently ignored.

Goals and workspaces are not built: the ops ``goal`` and ``workspace`` are refused by the
loader (they are not in ``SUPPORTED_OPS``), and this module refuses a session's ``goal``.
Either way the scenario is invalid for this runtime (exit 2, the field named), never a run
that pretends the feature exists.
"""

from __future__ import annotations

from agent_session.harness.scenario import Scenario


def unsupported_features(scenario: Scenario) -> list[str]:
    """``$.path: reason`` lines for what this runtime cannot carry out yet."""
    problems = [
        f"$.sessions[{index}].goal: goals are not supported yet"
        for index, session in enumerate(scenario.sessions)
        if session.goal is not None
    ]
    return problems
