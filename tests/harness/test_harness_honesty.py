"""The harness does what a scenario says, and nothing a scenario did not cause.

* ``withdraw`` fires the entry's cancel signal wherever the entry is: queued, or dequeued and
  not yet accepted (AS-3's window).
* A tool with ``on_cancel = "ignore"`` never stops and never acknowledges: the run's end, a
  ``restart`` and a ``crash`` leave its operation ``indeterminate`` with one receipt (OP-8: only
  the same layer really ending it resolves it); a real late acknowledgement is still recorded,
  and its receipt event says ``resolved_late``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_session.cli import main

Line = dict[str, object]

WITHDRAW_AFTER_DEQUEUE = """
name = "a wake withdrawn after it left the queue, before it was accepted"
[[models]]
id = "m"
[[sessions]]
id = "s1"
model = "m"
[scripts.m]
steps = [{ text = "first answer" }, { text = "never said" }]
[[actions]]
at = "start"
do = { op = "send", session = "s1", text = "hello" }
[[actions]]
at = { event = "stream-start", nth = 1 }
do = { op = "enqueue", session = "s1", entry = "wake", kind = "wake", text = "w", mode = "turn-end"}
[[actions]]
at = TRIGGER
do = { op = "withdraw", session = "s1", entry = "wake" }
[expect]
phases = { s1 = "idle" }
streams = { s1 = 1 }
unanswered = { s1 = 0 }
events = [
  { event = "dequeued", entry = "wake" },
  { event = "withdrawn", entry = "wake" },
  { event = "entry-canceled", entry = "wake", reason = "withdrawn" },
]
"""

IGNORING_TOOL = """
name = "a call that ignores its cancellation"
[engine]
tool_deadline_ms = 1000
cancel_grace_ms = 500
[[models]]
id = "m"
[[tools]]
name = "stuck"
hang = true
on_cancel = "ignore"
[[sessions]]
id = "s1"
model = "m"
[scripts.m]
steps = [
  { tool_calls = [{ tool = "stuck", args = { path = "/srv/a" } }] },
  { text = "gave up waiting" },
]
[[actions]]
at = "start"
do = { op = "send", session = "s1", text = "go" }
"""

LATE_ACK = """
name = "a call that acknowledges after the grace interval"
[engine]
tool_deadline_ms = 1000
cancel_grace_ms = 500
[[models]]
id = "m"
[[tools]]
name = "slow"
hang = true
ack_delay_ms = 800
[[sessions]]
id = "s1"
model = "m"
[scripts.m]
steps = [{ tool_calls = [{ tool = "slow" }] }, { text = "moved on" }]
[[actions]]
at = "start"
do = { op = "send", session = "s1", text = "go" }
"""

STORES = pytest.mark.parametrize("store", [(), ("--memory",)], ids=["sqlite", "memory"])


def run(tmp_path: Path, text: str, *extra: str) -> tuple[int, list[Line]]:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(text, encoding="utf-8")
    trace = tmp_path / "trace.jsonl"
    code = main(["run", *extra, "--trace", str(trace), str(scenario)])
    return code, [json.loads(line) for line in trace.read_bytes().splitlines()]


def receipts(lines: list[Line]) -> list[tuple[object, ...]]:
    return [
        (line["op"], line["state"], line["acknowledged"], line["resolved_late"])
        for line in lines
        if line["event"] == "receipt"
    ]


@STORES
@pytest.mark.parametrize(
    "trigger",
    [
        '{ event = "dequeued", entry = "wake" }',  # out of the queue, nothing persisted yet
        '{ event = "persisted", what = "user-row", nth = 2 }',  # its row is durable: rolled back
    ],
    ids=["at-dequeue", "after-its-row"],
)
def test_as3_withdraw_reaches_an_entry_dequeued_but_not_yet_accepted(
    tmp_path: Path, store: tuple[str, ...], trigger: str
) -> None:
    code, lines = run(tmp_path, WITHDRAW_AFTER_DEQUEUE.replace("TRIGGER", trigger), *store)
    assert code == 0
    assert [line["cause"] for line in lines if line["event"] == "stream-start"] == ["send"]


@STORES
def test_op8_the_runs_end_leaves_an_ignoring_call_indeterminate(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    text = IGNORING_TOOL + "[expect]\nreceipts = { indeterminate = 1, timed_out = 0 }\n"
    code, lines = run(tmp_path, text, *store)
    assert code == 0
    assert receipts(lines) == [("s1/1/1/0", "indeterminate", False, False)]


@STORES
@pytest.mark.parametrize("how", ["restart", "crash"])
def test_op8_a_restart_or_crash_while_a_call_ignores_its_cancel_leaves_it_indeterminate(
    tmp_path: Path, store: tuple[str, ...], how: str
) -> None:
    text = IGNORING_TOOL + (
        f'[[actions]]\nat = {{ event = "op-start", nth = 1 }}\ndo = {{ op = "{how}" }}\n'
        "[expect]\nreceipts = { indeterminate = 1 }\n"
    )
    code, lines = run(tmp_path, text, *store)
    assert code == 0  # the run ends: nothing waits for the call that never stops
    assert receipts(lines) == [("s1/1/1/0", "indeterminate", False, False)]
    if how == "restart":  # a clean shutdown asks the call to stop, then gives it the grace
        (cancel,) = [line for line in lines if line["event"] == "op-cancel-requested"]
        assert cancel["why"] == "shutdown"
        (receipt,) = [line for line in lines if line["event"] == "receipt"]
        assert receipt["t"] == 500


@STORES
def test_op8_a_real_late_acknowledgement_is_recorded_and_traced_resolved_late(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    code, lines = run(tmp_path, LATE_ACK, *store)
    assert code == 0
    assert receipts(lines) == [
        ("s1/1/1/0", "indeterminate", False, False),
        ("s1/1/1/0", "timed_out", True, True),
    ]
    assert [line["t"] for line in lines if line["event"] == "receipt"] == [1500, 1800]


def test_every_receipt_event_carries_resolved_late(tmp_path: Path) -> None:
    _, lines = run(tmp_path, IGNORING_TOOL)
    assert all("resolved_late" in line for line in lines if line["event"] == "receipt")


# ---------------------------------------------------------------- refused, not faked

BASE = """
name = "refusals"
[[models]]
id = "m"
[[tools]]
name = "bash"
[[sessions]]
id = "s1"
model = "m"
[scripts.m]
steps = [{ text = "hi" }]
[[actions]]
at = "start"
do = { op = "send", session = "s1", text = "hello", entry = "u1" }
"""


def invalid(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> str:
    scenario = tmp_path / "invalid.toml"
    scenario.write_text(text, encoding="utf-8")
    assert main(["run", str(scenario)]) == 2
    return capsys.readouterr().err


def test_withdrawing_a_user_message_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        BASE + '[[actions]]\nat = "start"\ndo = { op = "withdraw", session = "s1", entry = "u1" }\n'
    )
    err = invalid(tmp_path, text, capsys)
    assert "$.actions[1].do.entry: entry 'u1' is a user message (send)" in err


# ---------------------------------------------------------------- expect.unanswered counts

UNANSWERED = """
name = "a stopped cut leaves both of its tool results unanswered"
[engine]
max_stream_steps = 8
[[models]]
id = "m"
[[tools]]
name = "bash"
[[sessions]]
id = "s1"
model = "m"
[scripts.m]
steps = [
  { tool_calls = [{ tool = "bash", args = { n = 1 } }, { tool = "bash", args = { n = 2 } }] },
  { text = "never said" },
]
[[actions]]
at = "start"
do = { op = "send", session = "s1", text = "go" }
[[actions]]
at = { event = "op-start", nth = 1 }
do = { op = "enqueue", session = "s1", entry = "wake", kind = "wake", text = "w" }
[[actions]]
at = { event = "stream-end", nth = 1 }
do = { op = "stop", session = "s1" }
[expect]
owed = { s1 = false }
unanswered = { s1 = 2 }
"""


def test_expect_unanswered_counts_every_unanswered_tool_result(tmp_path: Path) -> None:
    code, lines = run(tmp_path, UNANSWERED)
    assert code == 0
    assert [line["why"] for line in lines if line["event"] == "stop"] == ["queued-message"]
