"""The ``crash`` and ``restart`` scenario ops (``docs/scenarios.md``) with startup recovery.

A crash kills the engine inside the emission of its trigger: nothing more is written and no
further event of that engine reaches the trace; a new engine opens the same store, recovers
what is owed (PS-6) and the run goes on with the same scripts, tools and clock. A restart
shuts the engine down cleanly first. Each scenario runs on SQLite and in memory, and its trace
is the same bytes on a second run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_session.cli import main

# The withdrawn-wake incident, but the process dies the moment the cut's row commits: before the
# queued wake was dispatched or withdrawn (an agent-initiated entry is not kept durably on its
# own, so the wake dies with its producer).
CRASH_AT_CUT = """
name = "a crash right after the cut: the next engine resumes the owed turn"
[engine]
max_stream_steps = 8
[[models]]
id = "m"
[[tools]]
name = "bash"
result = "3 monitored tasks started"
[[tools]]
name = "task_await"
result = "all three tasks exited 0"
[[sessions]]
id = "s1"
model = "m"
[scripts.m]
steps = [
  { tool_calls = [{ tool = "bash" }] },
  { tool_calls = [{ tool = "task_await" }] },
  { text = "All three tasks passed." },
]
[[actions]]
at = "start"
do = { op = "send", session = "s1", text = "start and wait" }
[[actions]]
at = { event = "op-start", tool = "task_await", nth = 1 }
do = { op = "enqueue", session = "s1", entry = "wake", kind = "wake", text = "w", mode = "tool-end"}
[[actions]]
at = { event = "persisted", what = "cut", nth = 1 }
do = { op = "crash" }
[expect]
phases = { s1 = "idle" }
owed = { s1 = false }
unanswered = { s1 = 0 }
events = [
  { event = "stop", why = "queued-message" },
  { event = "persisted", what = "cut" },
  { event = "crash" },
  { event = "recovered", action = "resume" },
  { event = "stream-start", cause = "resume", budget = 6 },
  { event = "continuation-ended", how = "consumed" },
  { event = "stream-end", finish = "stop" },
]
"""

RESTART_IDLE = """
name = "a clean restart between two turns recovers nothing and loses nothing"
[[models]]
id = "m"
[[sessions]]
id = "s1"
model = "m"
[scripts.m]
steps = [ { text = "one" }, { text = "two" } ]
[[actions]]
at = "start"
do = { op = "send", session = "s1", text = "first" }
[[actions]]
at = { event = "stream-end", nth = 1 }
do = { op = "restart" }
[[actions]]
at = { time_ms = 5000 }
do = { op = "send", session = "s1", text = "second" }
[expect]
phases = { s1 = "idle" }
owed = { s1 = false }
unanswered = { s1 = 0 }
events = [
  { event = "stream-end", finish = "stop" },
  { event = "stream-start", cause = "send" },
  { event = "stream-end", finish = "stop" },
]
"""


def run(tmp_path: Path, text: str, *extra: str) -> tuple[int, list[dict[str, object]], bytes]:
    scenario = tmp_path / "s.toml"
    scenario.write_text(text, encoding="utf-8")
    trace = tmp_path / "trace.jsonl"
    code = main(["run", *extra, "--trace", str(trace), str(scenario)])
    raw = trace.read_bytes()
    return code, [json.loads(line) for line in raw.splitlines()], raw


@pytest.mark.parametrize("store", [(), ("--memory",)], ids=["sqlite", "memory"])
def test_ps6_a_crash_scenario_resumes_the_owed_turn_in_the_next_engine(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    code, lines, raw = run(tmp_path, CRASH_AT_CUT, *store)
    assert code == 0
    names = [line["event"] for line in lines]
    crash = names.index("crash")
    assert "persisted" not in names[crash + 1 : names.index("recovered")]  # the dead wrote nothing
    # an agent-initiated entry wrote nothing of its own: it died with its producer, untold
    assert not any(line.get("entry") == "wake" for line in lines[crash + 1 :])
    assert code == run(tmp_path, CRASH_AT_CUT, *store)[0]
    assert raw == run(tmp_path, CRASH_AT_CUT, *store)[2]  # byte-identical on re-run


@pytest.mark.parametrize("store", [(), ("--memory",)], ids=["sqlite", "memory"])
def test_ps6_a_restart_at_the_cut_is_recovered_like_a_crash_without_the_crash(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    text = CRASH_AT_CUT.replace('op = "crash"', 'op = "restart"').replace(
        '  { event = "crash" },\n', ""
    )
    code, lines, _ = run(tmp_path, text, *store)
    assert code == 0
    names = [line["event"] for line in lines]
    assert "crash" not in names
    assert names.count("recovered") == 1  # a new engine started and found the owed cut


@pytest.mark.parametrize("store", [(), ("--memory",)], ids=["sqlite", "memory"])
def test_a_restart_scenario_goes_on_in_the_next_engine(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    code, lines, _ = run(tmp_path, RESTART_IDLE, *store)
    assert code == 0
    assert [line["event"] for line in lines].count("recovered") == 0
    starts = [line for line in lines if line["event"] == "stream-start"]
    assert [s["stream"] for s in starts] == ["s1/1", "s1/2"]  # numbering survives the restart
