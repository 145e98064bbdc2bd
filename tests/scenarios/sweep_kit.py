"""What the scenario sweeps share: the library, one more action at an event, a guarded run.

``test_crash_sweep`` adds a ``crash`` or ``restart``, ``test_failed_writes`` a ``fail_next
store_write``, at a trace event of a library scenario's unfaulted run, and runs it under a
real-time guard (a hang guard, never a synchronisation).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent_session import EngineEvent
from agent_session.harness import load_scenario
from agent_session.harness.runner import RunResult, run_scenario
from agent_session.harness.scenario import ActionSpec, Scenario
from persistence import Store

LIBRARY = Path(__file__).resolve().parents[2] / "docs" / "scenarios"
#: ``TURNKEEPER_FUZZ=full`` (``make fuzz``): every placement; ``make test`` runs a sample.
FULL = os.environ.get("TURNKEEPER_FUZZ") == "full"
#: Real seconds one run may take before it counts as a hang (a run takes milliseconds).
GUARD_S = 20.0


def library() -> list[Path]:
    paths = sorted(LIBRARY.glob("*.toml"))
    assert len(paths) >= 15, f"the scenario library is missing from {LIBRARY}"
    return paths


@cache
def loaded(name: str) -> Scenario:
    return load_scenario(LIBRARY / f"{name}.toml")


def with_action(scenario: Scenario, event: str, nth: int, do: dict[str, Any]) -> Scenario:
    """``scenario`` with one more action: ``do`` at its ``nth`` trace event named ``event``."""
    action = ActionSpec.model_validate({"at": {"event": event, "nth": nth}, "do": do})
    return scenario.model_copy(update={"actions": [*scenario.actions, action]})


async def run_guarded(
    scenario: Scenario, store: Store, observers: tuple[Callable[[EngineEvent], None], ...] = ()
) -> RunResult:
    """The run, or a failure naming the hang."""
    with anyio.move_on_after(GUARD_S) as guard:
        return await run_scenario(scenario, store, observers=observers)
    assert not guard.cancelled_caught
    pytest.fail(f"no end within {GUARD_S} real seconds: a hang")
