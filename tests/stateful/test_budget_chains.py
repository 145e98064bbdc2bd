"""One budget per logical turn across cuts, resumes, errors, retries, hops and compactions.

Hypothesis draws a turn: a step ceiling, and for each of three models (``alpha`` falls back to
``beta`` then ``gamma``) a script of tool steps, tool steps whose input usage crosses the
compaction threshold, refusals, retryable and context-limit errors; optionally a wake that cuts
the first stream and is withdrawn (so the turn resumes). The scenario runs to quiescence in
memory. Whatever the path (R36, R37, R40, AS-33, AS-35, ST-12):

* no stream starts with a budget larger than the remainder it inherited: a ``send`` gets the
  ceiling; a ``resume``, ``retry`` or ``follow-up`` at most what the stream before it reported
  left (``stream-end``, ``stream-abort`` or ``stream-error`` ``remaining``);
* the steps the turn spends (each stream's budget less what it left) never exceed the ceiling.
"""

from __future__ import annotations

from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_session.harness.runner import run_scenario
from agent_session.harness.scenario import Scenario
from persistence import MemoryStore

_TOOL = {"tool_calls": [{"tool": "bash"}], "usage": {"input": 1_000, "output": 10}}
_STEPS: dict[str, dict[str, Any]] = {
    "tool": _TOOL,
    "big": {"tool_calls": [{"tool": "bash"}], "usage": {"input": 9_000, "output": 10}},
    "refuse": {"refuse": True},
    "retryable": {"error": "retryable"},
    "context": {"error": "context_exceeded"},
    "text": {"text": "done"},
}
#: What a script ends with, so a model never runs out within one drawn turn.
_PADDING = [{"text": "enough"}] * 40

step_kinds = st.lists(st.sampled_from(sorted(_STEPS)), max_size=8)


def scenario(ceiling: int, scripts: dict[str, list[str]], wake: bool) -> Scenario:
    actions: list[dict[str, Any]] = [
        {"at": "start", "do": {"op": "send", "session": "s1", "text": "go"}}
    ]
    if wake:
        actions += [
            {
                "at": {"event": "op-start", "nth": 1},
                "do": {"op": "enqueue", "session": "s1", "entry": "w", "kind": "wake", "text": "w"},
            },
            {
                "at": {"event": "stream-end", "nth": 1},
                "do": {"op": "withdraw", "session": "s1", "entry": "w"},
            },
        ]
    return Scenario.model_validate(
        {
            "name": "budget chain",
            "engine": {
                "max_stream_steps": ceiling,
                "retry_backoff_ms": 100,
                "retry_max_attempts": 2,
                "context_window": 10_000,
                "compact_at": 0.8,
            },
            "models": [
                {"id": "alpha", "fallbacks": ["beta", "gamma"]},
                {"id": "beta"},
                {"id": "gamma"},
            ],
            "tools": [{"name": "bash", "duration_ms": 5}],
            "sessions": [{"id": "s1", "model": "alpha"}],
            "scripts": {
                name: {"steps": [*(_STEPS[kind] for kind in kinds), *_PADDING]}
                for name, kinds in scripts.items()
            },
            "actions": actions,
        }
    )


def check_one_budget(trace: list[dict[str, Any]], ceiling: int) -> None:
    left: int | None = None  # what the stream before reported left
    spent = 0
    budget: dict[str, int] = {}
    for line in trace:
        event = line["event"]
        if event == "stream-start":
            start = line["budget"]
            if line["cause"] == "send":
                assert start == ceiling, line
            else:
                assert left is not None, f"{line} continues no stream"
                assert start <= left, f"{line} starts above the {left} it inherited"
            budget[line["stream"]] = start
        elif event in ("stream-end", "stream-abort", "stream-error") and line["stream"]:
            left = line["remaining"]
            spent += budget[line["stream"]] - left
    assert spent <= ceiling, f"the turn spent {spent} of {ceiling}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ceiling=st.integers(min_value=1, max_value=9),
    alpha=step_kinds,
    beta=step_kinds,
    gamma=step_kinds,
    wake=st.booleans(),
)
def test_r36_r37_r40_no_path_refills_or_exceeds_the_turns_budget(
    ceiling: int, alpha: list[str], beta: list[str], gamma: list[str], wake: bool
) -> None:
    drawn = scenario(ceiling, {"alpha": alpha, "beta": beta, "gamma": gamma}, wake)

    async def run() -> None:
        result = await run_scenario(drawn, MemoryStore())  # the runner opens it
        # a drawn path may leave the wake nothing to withdraw (no tool ran before the end)
        assert result.error is None or "no queued entry 'w'" in result.error, result.error
        check_one_budget(result.trace, ceiling)

    anyio.run(run)
