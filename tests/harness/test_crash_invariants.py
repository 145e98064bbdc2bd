"""The crash sweep's sixth invariant and its two companions (issue 24), on hand-made facts.

Each test builds the killed child's trace and what recovery saw by hand, one bad case per
class, so a clean sweep means the invariants hold rather than that the checker cannot see:
``in-flight`` (a turn in flight at the kill is taken up), ``message-lost`` (every message sent
before the kill is in history or queued after recovery, exactly once) and ``op-twice`` (no
operation runs twice without an ``indeterminate`` receipt between).
"""

from __future__ import annotations

from typing import Any

from agent_session.harness.crashcheck import CLASSES, Finding, RecoveryFacts, check_trial
from agent_session.harness.crashturns import OpKey, QueuedMessage, UserRowText


def ev(event: str, session: str | None = "dev", **fields: Any) -> dict[str, Any]:
    return {"event": event, "session": session, **fields}


def classes(findings: list[Finding]) -> list[str]:
    return [finding.cls for finding in findings]


MID_STREAM = [
    ev("persisted", what="user-row", id="dev:r1"),
    ev("persisted", what="envelope", id="dev/1"),
    ev("stream-start", stream="dev/1", cause="send"),
    ev("step", stream="dev/1", n=1, model="m"),
]
ROW = {"dev:r1": b'{"text":"build it"}'}
TEXT = {"dev:r1": UserRowText(session="dev", text="build it")}


def facts(**changes: Any) -> RecoveryFacts:
    made = RecoveryFacts(
        user_rows_after_kill=dict(ROW),
        user_rows_after_recovery=dict(ROW),
        texts_after_kill=dict(TEXT),
        texts_after_recovery=dict(TEXT),
    )
    for key, value in changes.items():
        setattr(made, key, value)
    return made


RETRIED = [
    ev("recovered", action="retry", why="stream dev/1 was interrupted with 4 of 5 steps left"),
    ev("stream-start", stream="dev/2", cause="recovery"),
]


def test_the_new_classes_are_reported_in_order() -> None:
    assert CLASSES[-3:] == ("in-flight", "message-lost", "op-twice")


def test_in_flight_a_stream_running_at_the_kill_must_be_taken_up() -> None:
    found = check_trial(MID_STREAM, facts())
    assert classes(found) == ["in-flight"]
    assert "stream dev/1 was running" in found[0].reason
    assert "neither resumed, retried nor abandoned" in found[0].reason
    assert check_trial(MID_STREAM, facts(recovery_events=RETRIED)) == []


def test_in_flight_a_retry_that_starts_nothing_is_not_taken_up() -> None:
    said = [RETRIED[0]]
    found = check_trial(MID_STREAM, facts(recovery_events=said))
    assert classes(found) == ["in-flight"]
    assert "nothing took the turn up" in found[0].reason


def test_in_flight_abandoned_needs_a_reason() -> None:
    gave_up = [ev("retry-abandoned", why="the turn has no steps left (R61)")]
    assert check_trial(MID_STREAM, facts(recovery_events=gave_up)) == []
    silent = [ev("recovered", action="abandon", why=" ")]
    found = check_trial(MID_STREAM, facts(recovery_events=silent))
    assert classes(found) == ["in-flight"]
    assert "without a reason" in found[0].reason


def test_in_flight_an_owed_cut_counts_until_its_void_is_durable() -> None:
    owed = [
        *MID_STREAM[:3],
        ev("persisted", what="cut", id="dev:r2"),
        ev("owed", cut="dev/1", remaining=3, model="m", handle=None),
        ev("stream-end", stream="dev/1", finish="tool-calls"),
    ]
    assert classes(check_trial(owed, facts())) == ["in-flight"]
    voided = [*owed, ev("persisted", what="cut-void", id="dev:r2")]
    assert check_trial(voided, facts()) == []
    # a stream whose final row is durable has ended, even before its stream-end is told
    ended = [*MID_STREAM, ev("persisted", what="assistant", id="dev:r2")]
    assert check_trial(ended, facts()) == []


def test_in_flight_a_cut_the_store_no_longer_owes_ended_durably_before_the_kill() -> None:
    # a disposal's forfeit landed, the kill came before its telling: nothing was in flight
    owed = [
        *MID_STREAM[:3],
        ev("persisted", what="cut", id="dev:r2"),
        ev("owed", cut="dev/1", remaining=3, model="m", handle=None),
        ev("stream-end", stream="dev/1", finish="tool-calls"),
    ]
    assert check_trial(owed, facts(owed_after_kill=[])) == []
    assert classes(check_trial(owed, facts(owed_after_kill=["dev/1"]))) == ["in-flight"]


def test_in_flight_a_restart_inside_the_child_takes_its_sessions_up() -> None:
    restarted = [*MID_STREAM, ev("crash", session=None), *RETRIED, ev("stream-end", stream="dev/2")]
    assert check_trial(restarted, facts()) == []


LINT = QueuedMessage(
    session="dev", entry="lint", message="lint", text="and run clippy", user_authored=True
)
QUEUED = [
    *MID_STREAM,
    ev("persisted", what="queue", id="lint"),
    ev("queued", entry="lint", kind="user", mode="tool-end", into=None),
]


def answered(*rows: str) -> dict[str, UserRowText]:
    made = dict(TEXT)
    for index, text in enumerate(rows, start=3):
        made[f"dev:r{index}"] = UserRowText(session="dev", text=text)
    return made


def test_message_lost_a_queued_message_must_survive_recovery_once() -> None:
    base = facts(recovery_events=RETRIED, queued_after_kill=[LINT])
    found = check_trial(QUEUED, base)
    assert classes(found) == ["message-lost"]
    assert "queued at the kill and is gone after recovery" in found[0].reason
    base.texts_after_recovery = answered("and run clippy")
    assert check_trial(QUEUED, base) == []
    base.queued_after_recovery = [LINT]  # answered and still queued: twice
    assert classes(check_trial(QUEUED, base)) == ["message-lost"]
    base.queued_after_recovery = []
    base.texts_after_recovery = answered("and run clippy", "and run clippy")
    assert "2 times" in check_trial(QUEUED, base)[0].reason


def test_message_lost_a_message_still_queued_after_recovery_settled_was_never_drained() -> None:
    # recovery runs to quiescence: a user's live entry left queued was rebuilt, not drained
    base = facts(recovery_events=RETRIED, queued_after_kill=[LINT], queued_after_recovery=[LINT])
    found = check_trial(QUEUED, base)
    assert classes(found) == ["message-lost"]
    assert "still queued after recovery settled" in found[0].reason


def test_message_lost_a_batch_row_holds_each_add_once() -> None:
    fmt = QueuedMessage(session="dev", entry="lint", message="fmt", text="fmt", user_authored=True)
    base = facts(
        recovery_events=RETRIED,
        queued_after_kill=[LINT, fmt],
        texts_after_recovery=answered("and run clippy\nfmt"),
    )
    assert check_trial(QUEUED, base) == []


def test_message_lost_told_durable_but_not_in_the_store() -> None:
    found = check_trial(QUEUED, facts(recovery_events=RETRIED))
    assert classes(found) == ["message-lost"]
    assert "told durable but after the kill is neither queued" in found[0].reason
    # withdrawn, or an agent's wake, it may be gone
    withdrawn = [*QUEUED, ev("withdrawn", entry="lint")]
    assert check_trial(withdrawn, facts(recovery_events=RETRIED)) == []
    wake = [*QUEUED[:-1], ev("queued", entry="lint", kind="wake", mode="tool-end", into=None)]
    assert check_trial(wake, facts(recovery_events=RETRIED)) == []


def test_message_lost_accepted_and_still_queued_after_the_kill() -> None:
    accepted = [
        *QUEUED,
        ev("dequeued", entry="lint"),
        ev("persisted", what="user-row", id="dev:r3"),
    ]
    rows = {**ROW, "dev:r3": b'{"text":"and run clippy"}'}
    base = facts(
        recovery_events=RETRIED,
        queued_after_kill=[LINT],
        queued_after_recovery=[LINT],
        user_rows_after_kill=rows,
        user_rows_after_recovery=rows,
        texts_after_kill=answered("and run clippy"),
        texts_after_recovery=answered("and run clippy"),
    )
    found = check_trial(accepted, base)
    assert "in history (dev:r3) and still queued after the kill" in found[0].reason


def test_message_lost_a_users_message_cancelled_by_recovery() -> None:
    cancelled = [*RETRIED, ev("entry-canceled", entry="lint", reason="restart")]
    found = check_trial(QUEUED, facts(recovery_events=cancelled, queued_after_kill=[LINT]))
    assert [f.reason for f in found] == ["message lint was cancelled by recovery (restart)"]


BASH = [
    OpKey(op="dev/1/1/0", session="dev", capability="client:bash", target="t-9f2"),
    OpKey(op="dev/2/1/0", session="dev", capability="client:bash", target="t-9f2"),
]


def op_start(op: str) -> dict[str, Any]:
    return ev("op-start", op=op, tool="bash", stream=op.rsplit("/", 2)[0], deadline=60000)


def receipt(op: str, state: str) -> dict[str, Any]:
    return ev("receipt", op=op, tool="bash", state=state, resolved_late=False)


def test_op_twice_a_second_run_while_the_first_had_no_receipt() -> None:
    trace = [*MID_STREAM, op_start("dev/1/1/0")]
    again = [*RETRIED, op_start("dev/2/1/0"), receipt("dev/2/1/0", "completed")]
    found = check_trial(trace, facts(recovery_events=again, ops_after_recovery=BASH))
    assert classes(found) == ["op-twice"]
    assert "while dev/1/1/0 had no receipt" in found[0].reason


def test_op_twice_after_an_indeterminate_receipt_only_with_a_warning() -> None:
    trace = [*MID_STREAM, op_start("dev/1/1/0")]
    marked = [receipt("dev/1/1/0", "indeterminate"), *RETRIED]
    silent = [*marked, op_start("dev/2/1/0"), receipt("dev/2/1/0", "completed")]
    found = check_trial(trace, facts(recovery_events=silent, ops_after_recovery=BASH))
    assert classes(found) == ["op-twice"]
    assert "again silently" in found[0].reason
    warned = [
        *marked,
        ev("op-overlap-warned", op="dev/2/1/0", tool="bash", overlaps="dev/1/1/0"),
        *silent[-2:],
    ]
    assert check_trial(trace, facts(recovery_events=warned, ops_after_recovery=BASH)) == []


def test_op_twice_a_completed_call_may_be_asked_again_and_one_op_starts_once() -> None:
    trace = [*MID_STREAM, op_start("dev/1/1/0"), receipt("dev/1/1/0", "completed")]
    again = [*RETRIED, op_start("dev/2/1/0"), receipt("dev/2/1/0", "completed")]
    assert check_trial(trace, facts(recovery_events=again, ops_after_recovery=BASH)) == []
    twice = [*RETRIED, op_start("dev/1/1/0")]
    found = check_trial(trace, facts(recovery_events=twice, ops_after_recovery=BASH))
    assert [f.reason for f in found] == ["operation dev/1/1/0 started twice"]
