"""script_steps: a model's scripted steps become the Structs the ScriptedModel plays."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_session.harness import Scenario, load_scenario, script_steps
from persistence import UsageError
from stream_manager import ScriptStep, ScriptToolCall

SCRIPTED = """
name = "scripted"

[[models]]
id = "m"

[[models]]
id = "bare"

[[tools]]
name = "search"
kind = "provider"
result = { hits = 3 }

[[tools]]
name = "bash"
duration_ms = 10
result = "ok"

[[scripts.m.steps]]
reasoning = "think"
text = "looking"
delay_ms = 5

[[scripts.m.steps.tool_calls]]
tool = "search"
args = { q = "x" }

[[scripts.m.steps.tool_calls]]
tool = "bash"
args = { cmd = "make" }
duration_ms = 50
hang = true
on_cancel = "ignore"

[[scripts.m.steps]]
tool_calls = [{ tool = "search", result = "override" }]

[[scripts.m.steps]]
refuse = true

[[scripts.m.steps]]
error = "retryable"
"""


@pytest.fixture
def scripted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    monkeypatch.chdir(tmp_path)
    Path("scripted.toml").write_text(SCRIPTED, encoding="utf-8")
    return load_scenario("scripted.toml")


def test_script_steps_flag_provider_calls_and_carry_overrides(scripted: Scenario) -> None:
    steps = script_steps(scripted, "m")
    assert steps[0] == ScriptStep(
        text="looking",
        reasoning="think",
        delay_ms=5,
        tool_calls=(
            ScriptToolCall(
                tool="search", args={"q": "x"}, provider_executed=True, result={"hits": 3}
            ),
            ScriptToolCall(
                tool="bash",
                args={"cmd": "make"},
                behaviour={"duration_ms": 50, "hang": True, "on_cancel": "ignore"},
            ),
        ),
    )
    override = steps[1].tool_calls[0]
    assert (override.provider_executed, override.result) == (True, "override")
    assert override.behaviour == {"result": "override"}
    assert steps[2] == ScriptStep(refuse=True)
    assert steps[3] == ScriptStep(error="retryable")


def test_script_steps_copy_what_they_carry(scripted: Scenario) -> None:
    first = script_steps(scripted, "m")[0].tool_calls[0]
    assert isinstance(first.result, dict)
    first.result["hits"] = 99
    assert scripted.tools[0].result == {"hits": 3}


def test_script_steps_of_a_model_without_a_script(scripted: Scenario) -> None:
    assert script_steps(scripted, "bare") == []
    with pytest.raises(UsageError, match="declares no model 'ghost'"):
        script_steps(scripted, "ghost")
