"""What the harness runtime cannot play yet, named honestly instead of silently ignored.

Tool behaviours of the Operations issue (``on_cancel = "ignore"``, ``ack_delay_ms``,
``lose_completion``, ``deadline_ms``) and expectations on features still to come
(``expect.receipts``, ``expect.handles``) make a scenario invalid for this runtime: exit 2 with
the field named, never a run that pretends the feature exists.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent_session.harness.scenario import Scenario

#: Tool behaviours the runtime cannot play yet, with the value that means "not used".
_UNSUPPORTED_BEHAVIOUR: Mapping[str, object] = {
    "on_cancel": "ack",
    "ack_delay_ms": 0,
    "lose_completion": False,
    "deadline_ms": None,
}


def unsupported_features(scenario: Scenario) -> list[str]:
    """``$.path: reason`` lines for what this runtime cannot carry out yet."""
    problems: list[str] = []
    for index, tool in enumerate(scenario.tools):
        for key, unused in _UNSUPPORTED_BEHAVIOUR.items():
            if getattr(tool, key) != unused:
                problems.append(
                    f"$.tools[{index}].{key}: tool behaviour {key!r} is not supported yet"
                )
    for model, script in scenario.scripts.items():
        for s_index, step in enumerate(script.steps):
            for c_index, call in enumerate(step.tool_calls):
                for key in _UNSUPPORTED_BEHAVIOUR:
                    if getattr(call, key) is not None:
                        where = f"$.scripts.{model}.steps[{s_index}].tool_calls[{c_index}].{key}"
                        problems.append(f"{where}: tool behaviour {key!r} is not supported yet")
    problems.extend(
        f"$.actions[{index}].do.what: fail_next of 'settlement' is not supported yet"
        for index, action in enumerate(scenario.actions)
        if action.do.op == "fail_next" and getattr(action.do, "what", None) == "settlement"
    )
    expect = scenario.expect
    if expect is not None:
        problems.extend(
            f"$.expect.{key}: expectations on {key} are not supported yet"
            for key in ("receipts", "handles")
            if getattr(expect, key)
        )
    return problems
