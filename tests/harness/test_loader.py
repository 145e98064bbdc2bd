"""The scenario loader: every library scenario loads, and every bad input is named exactly."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from agent_session.harness import (
    ACTION_OPS,
    TRACE_EVENTS,
    EventTrigger,
    ScenarioError,
    load_scenario,
    script_steps,
)
from persistence import UsageError

#: The scenario library (docs/scenarios): examples users copy from, so every one must load.
LIBRARY = Path(__file__).resolve().parents[2] / "docs" / "scenarios"

BODY = """
[[models]]
id = "m"

[[tools]]
name = "bash"

[[sessions]]
id = "s1"
model = "m"

[scripts.m]
steps = [{ tool_calls = [{ tool = "bash" }] }, { text = "done" }]

[[actions]]
at = "start"
do = { op = "send", session = "s1", text = "go", entry = "u1" }
"""


def scenario(*, top: str = "", tail: str = "", name: str | None = "base") -> str:
    head = f'name = "{name}"\n' if name is not None else ""
    return f"{head}{top}\n{BODY}\n{tail}\n"


def action(do: str, at: str = '"start"') -> str:
    return f"[[actions]]\nat = {at}\ndo = {do}\n"


def problems_of(path: str, **kwargs: frozenset[str]) -> list[str]:
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path, **kwargs)
    return caught.value.problems


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def library() -> list[Path]:
    paths = sorted(LIBRARY.glob("*.toml"))
    if not paths:
        pytest.fail(f"the scenario library is missing: expected it in {LIBRARY}")
    return paths


def test_every_library_scenario_loads() -> None:
    paths = library()
    assert len(paths) >= 15, f"expected the scenario library in {LIBRARY}"
    for path in paths:
        loaded = load_scenario(path, supported_ops=ACTION_OPS)
        assert loaded.name, path
        assert loaded.description, f"{path.name}: a library scenario says what it pins"
        assert loaded.expect is not None, path.name
        assert loaded.expect.events, path.name


def test_library_scenario_fields_are_converted() -> None:
    s = load_scenario(LIBRARY / "withdrawn-wake.toml")
    assert s.name.startswith("withdrawn wake: the cut turn resumes")
    assert s.description is not None
    assert "a budget of 3" in s.description
    assert s.engine.max_stream_steps == 5
    assert s.engine.resume_attempt_cap == 3
    assert s.limits.max_events == 10_000
    assert s.actions[0].at == "start"
    trigger = s.actions[1].at
    assert isinstance(trigger, EventTrigger)
    assert (trigger.event, trigger.nth, trigger.match) == ("op-start", 1, {"tool": "job_wait"})
    assert s.actions[2].do.op == "withdraw"
    assert s.expect is not None
    assert s.expect.events[3] == {"event": "owed", "cut": "dev/1", "remaining": 3, "model": "m"}


def test_a_minimal_scenario_gets_the_defaults(here: Path) -> None:
    Path("min.toml").write_text('name = "n"\n', encoding="utf-8")
    s = load_scenario("min.toml")
    assert s.engine.model_dump() == {
        "max_stream_steps": 100,
        "resume_attempt_cap": 3,
        "tool_deadline_ms": 60_000,
        "cancel_grace_ms": 5_000,
        "auto_retry": True,
        "retry_backoff_ms": 1000,
        "retry_max_attempts": 3,
        "context_window": 200_000,
        "compact_at": 0.8,
    }
    assert s.limits.max_virtual_ms == 3_600_000
    assert (s.models, s.actions, s.expect) == ([], [], None)


BAD = [
    pytest.param(
        scenario(top='colour = "red"'), "$.colour: unknown key 'colour'", id="unknown-top-key"
    ),
    pytest.param(
        scenario(tail="[engine]\nmax_steps = 3"),
        "$.engine.max_steps: unknown key 'max_steps'",
        id="unknown-nested-key",
    ),
    pytest.param(
        scenario(tail=action('{ op = "send", session = "s1", text = "x", colour = 1 }')),
        "$.actions[1].do.colour: unknown key 'colour'",
        id="unknown-action-key",
    ),
    pytest.param(
        scenario(tail='[engine]\nmax_stream_steps = "eight"'),
        "$.engine.max_stream_steps: should be an integer, got 'eight'",
        id="wrong-type",
    ),
    pytest.param(
        scenario(tail="[engine]\nmax_stream_steps = 0"),
        "$.engine.max_stream_steps: should be greater than or equal to 1, got 0",
        id="out-of-range",
    ),
    pytest.param(
        scenario(tail='[[tools]]\nname = "t"\nkind = "server"'),
        "$.tools[1].kind: should be 'client', 'provider' or 'completion', got 'server'",
        id="bad-literal",
    ),
    pytest.param(
        scenario(tail='[[tools]]\nname = "t"\nresult = 5'),
        "$.tools[1].result: should be a string or a table, got 5",
        id="bad-result",
    ),
    pytest.param(scenario(name=None), "$.name: missing required key 'name'", id="missing-name"),
    pytest.param(scenario(name=" "), "$.name: must not be empty", id="empty-name"),
    pytest.param(
        scenario(tail=action('{ op = "send", text = "x" }')),
        "$.actions[1].do.session: missing required key 'session'",
        id="missing-action-arg",
    ),
    pytest.param(
        scenario(tail=action('{ session = "s1" }')),
        "$.actions[1].do.op: missing required key 'op'",
        id="missing-op",
    ),
    pytest.param(
        scenario(tail=action('{ op = "explode" }')),
        "$.actions[1].do.op: unknown op 'explode'; expected one of 'send', 'enqueue', "
        "'withdraw', 'remove_dedupe', 'clear_queue', 'restore_queue', 'stop', 'hard_stop', "
        "'dispose', 'cancel_op', 'goal', 'workspace', 'delegate', 'handle', 'thinking', "
        "'discard_context', 'fail_next', 'crash', 'restart'",
        id="unknown-op",
    ),
    pytest.param(
        scenario(tail=action('{ op = "cancel_op" }')),
        "$.actions[1].do: give exactly one of 'op_id' and 'tool'",
        id="cancel-op-needs-one-target",
    ),
    pytest.param(
        scenario(tail=action('{ op = "crash" }', at='"begin"')),
        "$.actions[1].at: should be 'start', got 'begin'",
        id="bad-start-trigger",
    ),
    pytest.param(
        scenario(tail=action('{ op = "crash" }', at='{ event = "step", nth = 0 }')),
        "$.actions[1].at.nth: should be greater than or equal to 1, got 0",
        id="bad-nth",
    ),
    pytest.param(
        scenario(tail=action('{ op = "crash" }', at='{ event = "step", session = ["s1"] }')),
        "$.actions[1].at.session: should be a string, number or boolean, got an array",
        id="bad-match-value",
    ),
    pytest.param(
        scenario(tail=action('{ op = "crash" }', at="7")),
        "$.actions[1].at: should be 'start', an event trigger table or a time trigger table, got 7",
        id="bad-trigger-type",
    ),
    pytest.param(
        scenario(tail="[expect]\nreceipts = { lost = 1 }"),
        "$.expect.receipts.lost: key should be 'completed', 'failed', 'timed_out', 'cancelled' "
        "or 'indeterminate', got 'lost'",
        id="bad-receipt-state",
    ),
    pytest.param(
        scenario(tail="[expect]\nevents = [{ entry = 'u1' }]"),
        "$.expect.events[0]: missing required key 'event'",
        id="expect-event-without-name",
    ),
    pytest.param(
        scenario(tail="[scripts.ghost]\nsteps = []"),
        "$.scripts.ghost: script for undeclared model 'ghost'",
        id="dangling-script-model",
    ),
    pytest.param(
        scenario(tail='[scripts."gpt 4.1"]\nsteps = []'),
        "$.scripts[\"gpt 4.1\"]: script for undeclared model 'gpt 4.1'",
        id="odd-key-is-quoted",
    ),
    pytest.param(
        scenario(tail='[[models]]\nid = "n"\nfallbacks = ["m", "ghost"]'),
        "$.models[1].fallbacks[1]: unknown model 'ghost'",
        id="dangling-fallback",
    ),
    pytest.param(
        scenario(tail='[[sessions]]\nid = "s2"\nmodel = "ghost"'),
        "$.sessions[1].model: unknown model 'ghost'",
        id="dangling-session-model",
    ),
    pytest.param(
        scenario(
            tail='[[models]]\nid = "n"\n[scripts.n]\nsteps = [{ tool_calls = [{ tool = "grep" }] }]'
        ),
        "$.scripts.n.steps[0].tool_calls[0].tool: unknown tool 'grep'",
        id="unknown-script-tool",
    ),
    pytest.param(
        scenario(tail='[[tools]]\nname = "bash"'),
        "$.tools[1].name: duplicate tool name 'bash'",
        id="duplicate-tool",
    ),
    pytest.param(
        scenario(tail=action('{ op = "stop", session = "nope" }')),
        "$.actions[1].do.session: unknown session 'nope'",
        id="unknown-action-session",
    ),
    pytest.param(
        scenario(
            tail=action(
                '{ op = "delegate", owner = "s1", target = "kid", handle = "h", text = "x" }'
            )
        ),
        "$.actions[1].do.target: unknown session 'kid'",
        id="unknown-delegate-target",
    ),
    pytest.param(
        scenario(tail=action('{ op = "withdraw", session = "s1", entry = "ghost" }')),
        "$.actions[1].do.entry: unknown entry 'ghost'; no send or enqueue action on session "
        "'s1' declares it",
        id="withdraw-undeclared-entry",
    ),
    pytest.param(
        scenario(tail=action('{ op = "handle", handle = "h9", state = "interrupted" }')),
        "$.actions[1].do.handle: unknown handle 'h9'; no delegate action declares it",
        id="undeclared-handle",
    ),
    pytest.param(
        scenario(tail=action('{ op = "crash" }', at='{ event = "stream-begin" }')),
        "$.actions[1].at.event: unknown event 'stream-begin'",
        id="unknown-trigger-event",
    ),
    pytest.param(
        scenario(tail=action('{ op = "crash" }', at='{ event = "op-start", tool = "grep" }')),
        "$.actions[1].at.tool: unknown tool 'grep'",
        id="trigger-matches-unknown-tool",
    ),
    pytest.param(
        scenario(tail='[expect]\nphases = { ghost = "idle" }'),
        "$.expect.phases.ghost: unknown session 'ghost'",
        id="unknown-expect-session",
    ),
    pytest.param(
        scenario(tail='[expect]\nhandles = { h1 = "completed" }'),
        "$.expect.handles.h1: unknown handle 'h1'",
        id="unknown-expect-handle",
    ),
    pytest.param(
        scenario(tail='[expect]\nevents = [{ event = "stream-begin" }]'),
        "$.expect.events[0].event: unknown event 'stream-begin'",
        id="unknown-expect-event",
    ),
    pytest.param(
        "name = \n", "$: invalid TOML: Invalid value (at line 1, column 8)", id="bad-toml"
    ),
]


@pytest.mark.parametrize(("text", "problem"), BAD)
def test_bad_input_is_named_exactly(here: Path, text: str, problem: str) -> None:
    Path("scen.toml").write_text(text, encoding="utf-8")
    assert problems_of("scen.toml") == [f"scen.toml: {problem}"]


def test_the_base_of_the_bad_inputs_is_good(here: Path) -> None:
    Path("scen.toml").write_text(scenario(), encoding="utf-8")
    assert load_scenario("scen.toml").name == "base"


def test_an_unsupported_op_is_named(here: Path) -> None:
    tail = action('{ op = "cancel_op", tool = "bash" }')
    Path("scen.toml").write_text(scenario(tail=tail), encoding="utf-8")
    assert problems_of("scen.toml", supported_ops=frozenset({"send"})) == [
        "scen.toml: $.actions[1].do.op: op 'cancel_op' is not supported yet"
    ]
    assert load_scenario("scen.toml", supported_ops=frozenset({"send", "cancel_op"})).actions


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("scen.yaml", "scen.yaml: $: unsupported file type '.yaml'; use .toml or .json"),
        ("scen", "scen: $: unsupported file type ''; use .toml or .json"),
        ("missing.toml", "missing.toml: $: cannot read the file: No such file or directory"),
    ],
)
def test_files_that_cannot_be_scenarios(here: Path, name: str, problem: str) -> None:
    if name != "missing.toml":
        Path(name).write_text(scenario(), encoding="utf-8")
    assert problems_of(name) == [problem]


def test_bad_json_syntax(here: Path) -> None:
    Path("scen.json").write_text('{"name": }', encoding="utf-8")
    assert problems_of("scen.json") == [
        "scen.json: $: invalid JSON: Expecting value: line 1 column 10 (char 9)"
    ]


def test_a_json_document_that_is_not_an_object(here: Path) -> None:
    Path("scen.json").write_text("[]", encoding="utf-8")
    assert problems_of("scen.json") == ["scen.json: $: should be a table, got an array"]


def test_the_file_is_named_as_given(tmp_path: Path) -> None:
    path = tmp_path / "scen.toml"
    path.write_text(scenario(top="x = 1"), encoding="utf-8")
    assert problems_of(str(path)) == [f"{path}: $.x: unknown key 'x'"]


def test_json_and_toml_give_the_same_scenario(here: Path) -> None:
    for source in library():
        as_json = Path(source.stem + ".json")
        as_json.write_text(json.dumps(tomllib.loads(source.read_text("utf-8"))), "utf-8")
        assert load_scenario(as_json) == load_scenario(source), source.name


def test_json_can_clear_an_override_toml_cannot_express(here: Path) -> None:
    doc = tomllib.loads(scenario())
    doc["scripts"]["m"]["steps"][0]["tool_calls"][0].update(fail=None, hang=None)
    Path("scen.json").write_text(json.dumps(doc), encoding="utf-8")
    step = script_steps(load_scenario("scen.json"), "m")[0]
    assert step.tool_calls[0].behaviour == {"fail": None}


def test_every_structural_problem_is_reported_at_once(here: Path) -> None:
    text = scenario(
        top="colour = 1",
        tail="[engine]\nmax_stream_steps = -1\ncancel_grace_ms = true\n"
        + action('{ op = "goal", session = "s1", state = "lost" }'),
    )
    Path("scen.toml").write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario("scen.toml")
    expected = [
        "scen.toml: $.engine.max_stream_steps: should be greater than or equal to 1, got -1",
        "scen.toml: $.engine.cancel_grace_ms: should be an integer, got true",
        "scen.toml: $.actions[1].do.state: should be 'active', 'paused', 'replaced' or "
        "'complete', got 'lost'",
        "scen.toml: $.colour: unknown key 'colour'",
    ]
    assert caught.value.problems == expected
    assert str(caught.value) == "\n".join(expected)
    assert isinstance(caught.value, UsageError)


def test_every_dangling_reference_is_reported_at_once(here: Path) -> None:
    text = scenario(
        tail='[[sessions]]\nid = "s2"\nmodel = "ghost"\n'
        + action('{ op = "withdraw", session = "s9", entry = "u1" }', at='{ event = "nope" }')
        + '[expect]\nstreams = { s3 = 1 }\nevents = [{ event = "stream-start", model = "q" }]'
    )
    Path("scen.toml").write_text(text, encoding="utf-8")
    assert problems_of("scen.toml") == [
        "scen.toml: $.sessions[1].model: unknown model 'ghost'",
        "scen.toml: $.actions[1].at.event: unknown event 'nope'",
        "scen.toml: $.actions[1].do.session: unknown session 's9'",
        "scen.toml: $.actions[1].do.entry: unknown entry 'u1'; no send or enqueue action on "
        "session 's9' declares it",
        "scen.toml: $.expect.streams.s3: unknown session 's3'",
        "scen.toml: $.expect.events[0].model: unknown model 'q'",
    ]


def test_entries_may_be_declared_after_their_withdrawal(here: Path) -> None:
    tail = action('{ op = "withdraw", session = "s1", entry = "w" }') + action(
        '{ op = "enqueue", session = "s1", entry = "w", kind = "wake", text = "x" }',
        at="{ time_ms = 5 }",
    )
    Path("scen.toml").write_text(scenario(tail=tail), encoding="utf-8")
    assert load_scenario("scen.toml").actions[2].do.op == "enqueue"


def test_the_models_are_frozen(here: Path) -> None:
    Path("scen.toml").write_text(scenario(), encoding="utf-8")
    loaded = load_scenario("scen.toml")
    with pytest.raises(ValueError, match="frozen"):
        loaded.name = "other"  # type: ignore[misc]


def test_a_trigger_built_in_code_keeps_its_match() -> None:
    trigger = EventTrigger(event="stream-end", nth=2, match={"session": "s1"})
    assert trigger.match == {"session": "s1"}
    assert EventTrigger.model_validate({"event": "stream-end", "session": "s1"}).match == {
        "session": "s1"
    }


def test_trace_events_cover_the_contract() -> None:
    # The contract's 31, ``usage`` (a real model's per-step token counts; docs/trace.md),
    # ``op-progress`` (a tool layer's progress, e.g. MCP's), ``op-overlap-warned`` (a
    # declared read-only or idempotent call ran beside an indeterminate one,
    # docs/operations.md) and ``session-broken`` (an engine bug broke a session,
    # docs/session.md); no scenario emits them.
    assert len(TRACE_EVENTS) == 35
    assert {
        "stream-start",
        "owed",
        "continuation-ended",
        "tool-call-end",
        "usage",
        "op-progress",
        "op-overlap-warned",
        "session-broken",
    } <= TRACE_EVENTS
