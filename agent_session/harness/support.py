"""What the harness runtime cannot play yet, named honestly instead of silently ignored.

Delegated turns, goals and workspaces are not built: the ops ``delegate``, ``handle``,
``goal`` and ``workspace`` are refused by the loader (they are not in ``SUPPORTED_OPS``), and
this module refuses the rest of that work: a session's ``goal``, ``fail_next`` of
``settlement`` and expectations on delegated handles (``expect.handles``). Either way the
scenario is invalid for this runtime (exit 2, the field named), never a run that pretends the
feature exists. (An ``enqueue`` may name a ``handle`` only when a ``delegate`` action
declares it, so it is refused with the ``delegate``.)
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
    problems += [
        f"$.sessions[{index}].goal: goals are not supported yet"
        for index, session in enumerate(scenario.sessions)
        if session.goal is not None
    ]
    expect = scenario.expect
    if expect is not None and expect.handles:
        problems.append("$.expect.handles: expectations on handles are not supported yet")
    return problems
