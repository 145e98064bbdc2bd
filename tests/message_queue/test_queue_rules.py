"""MessageQueue rules MQ-1 to MQ-16 and the queue side of R31, R62 and R63.

Each test names the rule it protects and fails when that rule is removed. These are unit tests
of the pure queue (no event loop) because the rules are the queue's own; the queue cases
that also involve dispatch live with the session's tests.
"""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from message_queue import (
    Attachment,
    CancelState,
    CancelToken,
    Correlation,
    DispatchMode,
    EntryKind,
    MessageMetadata,
    MessageQueue,
    MetadataType,
    NewMessage,
    Queued,
    QueueEmpty,
    Rejected,
    RejectReason,
    SendOptions,
    notify_all_canceled,
)
from tests.message_queue.helpers import C2, C, Log, queued, report, user, wake

PDF = Attachment(media_type="application/pdf", url="file:///a.pdf", filename="a.pdf")
PNG = Attachment(media_type="image/png", url="file:///b.png")


# ---------------------------------------------------------------- MQ-1


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_mq1_blank_message_without_files_is_rejected_and_changes_nothing(text: str) -> None:
    queue = MessageQueue()
    queued(queue, user("first", mode=DispatchMode.TURN_END))
    before = (repr(queue), list(queue))

    outcome = queue.add(user(text))

    assert isinstance(outcome, Rejected)
    assert outcome.reason is RejectReason.EMPTY
    assert "non-blank text or attachments" in outcome.detail
    assert (repr(queue), list(queue)) == before


def test_mq1_blank_text_with_an_attachment_is_accepted() -> None:
    queue = MessageQueue()
    outcome = queue.add(user("", attachments=(PDF,)))
    assert isinstance(outcome, Queued)
    assert len(queue) == 1


# ---------------------------------------------------------------- MQ-2


def test_mq2_plain_user_messages_batch_into_the_tail_entry() -> None:
    queue = MessageQueue()
    first = queued(queue, user("a"))
    second = queued(queue, user("b"))
    assert first.into is None
    assert second.into == first.entry_id
    assert len(queue) == 1
    assert queue.dequeue_next().text == "a\nb"


def test_mq2_user_and_synthetic_adds_never_share_an_entry() -> None:
    queue = MessageQueue()
    queued(queue, user("a"))
    heartbeat = queued(queue, NewMessage(text="hb", kind=EntryKind.SYSTEM))
    after = queued(queue, user("b"))
    assert heartbeat.into is None
    assert after.into is None
    assert len(queue) == 3


def test_mq2_agent_initiated_adds_batch_with_each_other() -> None:
    queue = MessageQueue()
    queued(queue, NewMessage(text="p1", kind=EntryKind.SYSTEM, agent_initiated=True))
    second = queued(queue, NewMessage(text="p2", kind=EntryKind.SYSTEM, agent_initiated=True))
    assert second.into is not None
    assert len(queue) == 1


# ---------------------------------------------------------------- MQ-3


def _noop_canceled(reason: str) -> None:
    del reason


SEALING_ADDS: dict[str, NewMessage] = {
    "explicit": NewMessage(text="x", sealed=True),
    "agent-skill": NewMessage(text="x", metadata=MessageMetadata(type=MetadataType.AGENT_SKILL)),
    "workspace-turn": NewMessage(
        text="x", metadata=MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=C)
    ),
    "snapshot-refs": NewMessage(text="x", metadata=MessageMetadata(snapshot_refs=("skill:1",))),
    "on_accepted": NewMessage(text="x", on_accepted=lambda: None),
    "on_pre_stream_failure": NewMessage(
        text="x", on_accepted_pre_stream_failure=lambda failure: None
    ),
    "on_canceled": NewMessage(text="x", on_canceled=_noop_canceled),
    "cancel_token": NewMessage(text="x", cancel_token=CancelToken()),
}


@pytest.mark.parametrize("why", sorted(SEALING_ADDS))
def test_mq3_sealing_add_starts_a_sealed_entry_that_absorbs_nothing(why: str) -> None:
    queue = MessageQueue()
    queued(queue, user("before"))
    sealed = queued(queue, SEALING_ADDS[why])
    later = queued(queue, user("after"))
    assert sealed.into is None
    assert later.into is None
    entries = list(queue)
    assert [e.sealed for e in entries] == [False, True, False]
    assert entries[1].texts == ("x",)


def test_mq3_removable_dedupe_key_seals_but_a_plain_key_does_not() -> None:
    queue = MessageQueue()
    queued(queue, user("a"))
    plain = queue.add_once(user("b"), "k-plain")
    removable = queue.add_once(user("c"), "k-removable", removable=True)
    assert isinstance(plain, Queued)
    assert plain.into is not None
    assert isinstance(removable, Queued)
    assert removable.into is None
    assert [e.sealed for e in queue] == [False, True]


def test_mq3_a_wake_is_sealed_and_withdrawable_even_without_a_given_token() -> None:
    queue = MessageQueue()
    queued(queue, NewMessage(text="w", id="w", kind=EntryKind.WAKE))
    assert queued(queue, NewMessage(text="w2", kind=EntryKind.WAKE)).into is None
    assert queue.withdraw("w", "consumed")
    withdrawn = queue.get("w")
    assert withdrawn is not None
    assert withdrawn.withdrawn


# ---------------------------------------------------------------- MQ-4


def test_mq4_compaction_request_starts_an_open_entry() -> None:
    queue = MessageQueue()
    queued(queue, user("before"))
    compaction = MessageMetadata(type=MetadataType.COMPACTION_REQUEST)
    started = queued(queue, user("/compact", metadata=compaction))
    after = queued(queue, user("after"))
    assert started.into is None
    assert after.into == started.entry_id
    entries = list(queue)
    assert len(entries) == 2
    assert entries[1].texts == ("/compact", "after")
    assert entries[1].metadata == compaction
    assert not entries[1].sealed


# ---------------------------------------------------------------- MQ-5


def test_mq5_first_metadata_and_latest_options_win() -> None:
    m1 = MessageMetadata()
    m2 = MessageMetadata()
    queue = MessageQueue()
    queued(queue, user("a", options=SendOptions(model="p:M1", thinking_level="low"), metadata=m1))
    queued(queue, user("b", options=SendOptions(model="p:M2", thinking_level="high"), metadata=m2))
    queued(queue, user("c"))  # an add without options keeps the latest ones
    out = queue.dequeue_next()
    assert out.text == "a\nb\nc"
    assert out.metadata is m1
    assert out.options == SendOptions(model="p:M2", thinking_level="high")


def test_mq5_texts_in_order_files_accumulate() -> None:
    queue = MessageQueue()
    queued(queue, user("one", attachments=(PDF,)))
    queued(queue, user("two"))
    queued(queue, user("three", attachments=(PNG,)))
    out = queue.dequeue_next()
    assert out.text == "one\ntwo\nthree"
    assert out.attachments == (PDF, PNG)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (DispatchMode.TURN_END, DispatchMode.TOOL_END),
        (DispatchMode.TOOL_END, DispatchMode.TURN_END),
    ],
)
def test_mq5_tool_end_is_sticky_within_an_entry(first: DispatchMode, second: DispatchMode) -> None:
    queue = MessageQueue()
    queued(queue, user("a", mode=first))
    queued(queue, user("b", mode=second))
    assert len(queue) == 1
    assert queue.next_dispatch_mode() is DispatchMode.TOOL_END


def test_mq5_goal_pause_policy_is_sticky() -> None:
    queue = MessageQueue()
    queued(queue, user("a", options=SendOptions(model="p:M1", goal_policy="pause")))
    queued(queue, user("b", options=SendOptions(model="p:M2", goal_policy="continue")))
    out = queue.dequeue_next()
    assert out.options is not None
    assert out.options.model == "p:M2"
    assert out.options.goal_policy == "pause"


# ---------------------------------------------------------------- MQ-6


def test_mq6_default_mode_is_tool_end_and_empty_queue_reports_tool_end() -> None:
    queue = MessageQueue()
    assert queue.next_dispatch_mode() is DispatchMode.TOOL_END
    assert queue.aggregate_dispatch_mode() is DispatchMode.TOOL_END
    queued(queue, user("a"))
    assert queue.next_dispatch_mode() is DispatchMode.TOOL_END


def test_mq6_next_mode_is_the_heads_and_aggregate_is_tool_end_if_any() -> None:
    queue = MessageQueue()
    queued(queue, user("a", mode=DispatchMode.TURN_END))
    queued(queue, NewMessage(text="s", kind=EntryKind.SYSTEM, mode=DispatchMode.TOOL_END))
    assert queue.next_dispatch_mode() is DispatchMode.TURN_END
    assert queue.aggregate_dispatch_mode() is DispatchMode.TOOL_END
    assert not queue.has_queued(DispatchMode.TOOL_END)
    queue.dequeue_next()
    assert queue.next_dispatch_mode() is DispatchMode.TOOL_END

    only_turn_end = MessageQueue()
    queued(only_turn_end, user("a", mode=DispatchMode.TURN_END))
    assert only_turn_end.aggregate_dispatch_mode() is DispatchMode.TURN_END


# ---------------------------------------------------------------- MQ-7 / R31 / R62


def test_mq7_reader_skips_withdrawn_head() -> None:
    queue = MessageQueue()
    queued(queue, wake("w1"))
    queued(queue, user("u", mode=DispatchMode.TURN_END))
    assert queue.next_is_wake()
    queue.withdraw("w1", "consumed")

    assert not queue.next_is_wake()
    assert queue.next_dispatch_mode() is DispatchMode.TURN_END
    assert not queue.has_queued(DispatchMode.TOOL_END)
    assert queue.has_queued(DispatchMode.TURN_END)
    first = queue.first_live()
    assert first is not None
    assert first.texts == ("u",)


def test_mq7_next_continuation_reader_skips_withdrawn_entries() -> None:
    queue = MessageQueue()
    token = CancelToken()
    queued(queue, dataclasses.replace(report("r-old", C), cancel_token=token))
    queued(queue, report("r2", C2))
    assert queue.next_continues(C)
    token.cancel()
    assert not queue.next_continues(C)
    assert queue.next_continues(C2)


def test_mq7_all_predecessors_scan_ignores_withdrawn_entries() -> None:
    queue = MessageQueue()
    queued(queue, wake("w1"))
    assert not queue.all_continue(C)
    queue.withdraw("w1")
    assert queue.all_continue(C)  # only withdrawn entries: no predecessor at all
    queued(queue, report("r", C))
    assert queue.all_continue(C)
    queued(queue, user("u"))
    assert not queue.all_continue(C)


def test_r31_withdrawn_wake_ahead_of_unrelated_entry_is_not_next() -> None:
    """R31: a canceled wake ahead of an unrelated live entry must not make the owner defer."""
    queue = MessageQueue()
    queued(queue, wake("w1"))
    queued(queue, user("unrelated"))
    queue.withdraw("w1", "consumed")
    assert not queue.next_is_wake()
    assert not queue.next_continues(C)
    first = queue.first_live()
    assert first is not None
    assert first.kind is EntryKind.USER


def test_r62_draining_withdrawn_wake_does_not_make_a_report_look_superseded() -> None:
    """R62: the all-predecessors scan behind hasQueuedOrDispatchingEntry skips withdrawn ones."""
    queue = MessageQueue()
    queued(queue, wake("w1"))
    queued(queue, report("r", C))
    queue.withdraw("w1", "consumed")
    assert queue.all_continue(C)


# ---------------------------------------------------------------- MQ-8 / R63


def test_mq8_has_queued_is_live_only_while_raw_emptiness_counts_withdrawn() -> None:
    queue = MessageQueue()
    assert not queue.has_queued()
    queued(queue, wake("w1"))
    assert queue.has_queued()
    assert queue.has_queued(DispatchMode.TOOL_END)
    assert not queue.has_queued(DispatchMode.TURN_END)

    queue.withdraw("w1")
    assert not queue.has_queued()
    assert not queue.has_queued(DispatchMode.TOOL_END)
    assert not queue.is_empty
    assert len(queue) == 1


def test_r63_wake_withdrawn_after_soft_stop_is_still_drained() -> None:
    """R63: the soft-stop decision saw a live wake; the drain after the abort uses raw emptiness."""
    log = Log()
    queue = MessageQueue()
    queued(queue, wake("w1", log=log))
    assert queue.has_queued(DispatchMode.TOOL_END)  # the soft stop is requested on this
    queue.withdraw("w1", "consumed")

    assert not queue.has_queued(DispatchMode.TOOL_END)
    assert not queue.is_empty  # so the post-abort drain still runs
    out = queue.dequeue_next()
    assert out.entry_id == "w1"
    assert out.withdrawn
    assert out.cancel_token is not None
    out.callbacks.notify_canceled(out.cancel_token.reason or "")
    assert log.calls == [("w1", "on_canceled", "consumed")]
    assert queue.is_empty


# ---------------------------------------------------------------- MQ-9


def test_mq9_add_once_rejects_a_held_key_until_it_is_released() -> None:
    queue = MessageQueue()
    assert isinstance(queue.add_once(NewMessage(text="hb", kind=EntryKind.SYSTEM), "k"), Queued)
    again = queue.add_once(NewMessage(text="hb", kind=EntryKind.SYSTEM), "k")
    assert isinstance(again, Rejected)
    assert again.reason is RejectReason.DUPLICATE_KEY
    assert len(queue) == 1
    assert next(iter(queue)).adds == 1

    queue.dequeue_next()
    assert isinstance(queue.add_once(NewMessage(text="hb", kind=EntryKind.SYSTEM), "k"), Queued)
    queue.clear()
    assert not queue.holds_dedupe_key("k")
    assert isinstance(queue.add_once(NewMessage(text="hb", kind=EntryKind.SYSTEM), "k"), Queued)


def test_mq9_holds_only_dedupe_key_needs_exactly_one_entry_with_one_add() -> None:
    queue = MessageQueue()
    assert not queue.holds_only_dedupe_key("k")
    queue.add_once(NewMessage(text="hb", kind=EntryKind.SYSTEM), "k")
    assert queue.holds_only_dedupe_key("k")
    assert not queue.holds_only_dedupe_key("other")
    queued(queue, NewMessage(text="more", kind=EntryKind.SYSTEM))  # batches: two adds
    assert len(queue) == 1
    assert not queue.holds_only_dedupe_key("k")


def test_mq9_dropping_the_lone_keyed_add_removes_it_and_nothing_else() -> None:
    queue = MessageQueue()
    assert queue.drop_only_dedupe_key("hb:7") == []
    queue.add_once(NewMessage(text="hb", kind=EntryKind.SYSTEM), "hb:7")
    assert queue.drop_only_dedupe_key("hb:8") == []  # another key: kept
    (callbacks,) = queue.drop_only_dedupe_key("hb:7")
    assert queue.is_empty
    assert not queue.holds_dedupe_key("hb:7")
    assert callbacks.entry_id
    queue.add_once(NewMessage(text="hb", kind=EntryKind.SYSTEM), "hb:7")
    queued(queue, NewMessage(text="more", kind=EntryKind.SYSTEM))  # batched: two adds
    assert queue.drop_only_dedupe_key("hb:7") == []
    assert len(queue) == 1


# ---------------------------------------------------------------- MQ-10


def test_mq10_prefix_removal_keeps_unrelated_messages() -> None:
    queue = MessageQueue()
    queue.add_once(NewMessage(text="p1", kind=EntryKind.SYSTEM, agent_initiated=True), "prog:1")
    queue.add_once(NewMessage(text="p2", kind=EntryKind.SYSTEM, agent_initiated=True), "prog:2")
    assert len(queue) == 1

    removal = queue.remove_by_dedupe_key_prefix("prog:1")

    assert removal.removed_messages == 1
    assert removal.removed_entries == []
    (entry,) = list(queue)
    assert entry.texts == ("p2",)
    assert entry.dedupe_keys == ("prog:2",)
    assert entry.adds == 1
    assert not queue.holds_dedupe_key("prog:1")
    assert queue.get(entry.id) is not None  # the entry keeps its id


def test_mq10_an_entry_losing_every_message_leaves_with_its_callbacks() -> None:
    log = Log()
    queue = MessageQueue()
    queue.add_once(
        NewMessage(text="r", id="r", kind=EntryKind.REPORT, on_canceled=log.canceled("r")),
        "report:h1",
        removable=True,
    )
    queued(queue, user("u"))
    removal = queue.remove_by_dedupe_key_prefix("report:")
    assert removal.removed_messages == 1
    assert [c.entry_id for c in removal.removed_entries] == ["r"]
    notify_all_canceled(removal.removed_entries, "removed")
    assert log.calls == [("r", "on_canceled", "removed")]
    assert queue.get("r") is None
    assert [e.texts for e in queue] == [("u",)]


def test_mq10_empty_prefix_is_a_no_op() -> None:
    queue = MessageQueue()
    queue.add_once(NewMessage(text="p1", kind=EntryKind.SYSTEM), "prog:1")
    assert queue.remove_by_dedupe_key_prefix("").removed_messages == 0
    assert len(queue) == 1


# ---------------------------------------------------------------- MQ-11


def test_mq11_remove_workspace_turn_takes_only_that_handle() -> None:
    log = Log()
    queue = MessageQueue()
    queued(queue, report("r1", C, log))
    queued(queue, report("r2", C2, log))
    queued(queue, user("u", id="u"))
    removed = queue.remove_workspace_turn("h1")
    assert [c.entry_id for c in removed] == ["r1"]
    assert [e.id for e in queue] == ["r2", "u"]
    assert queue.get("r1") is None


# ---------------------------------------------------------------- MQ-12 / MQ-13


def test_mq12_prioritize_moves_the_oldest_user_entry_to_the_head() -> None:
    queue = MessageQueue()
    queued(queue, NewMessage(text="s", id="s", kind=EntryKind.SYSTEM))
    queued(queue, user("u1", id="u1"))
    queued(queue, NewMessage(text="s2", id="s2", kind=EntryKind.SYSTEM))
    queued(queue, user("u2", id="u2"))
    assert queue.prioritize_next_user_entry()
    assert [e.id for e in queue] == ["u1", "s", "s2", "u2"]

    hidden_only = MessageQueue()
    queued(hidden_only, NewMessage(text="s", kind=EntryKind.SYSTEM))
    assert not hidden_only.prioritize_next_user_entry()


def test_mq12_visible_dispatch_mode_moves_user_entries_ahead_in_order() -> None:
    queue = MessageQueue()
    queued(queue, NewMessage(text="s", id="s", kind=EntryKind.SYSTEM))
    queued(queue, user("u1", id="u1"))
    queued(queue, NewMessage(text="s2", id="s2", kind=EntryKind.SYSTEM))
    queued(queue, user("u2", id="u2"))
    assert queue.set_visible_dispatch_mode(DispatchMode.TURN_END)
    assert [e.id for e in queue] == ["u1", "u2", "s", "s2"]
    assert [e.mode for e in queue] == [
        DispatchMode.TURN_END,
        DispatchMode.TURN_END,
        DispatchMode.TOOL_END,
        DispatchMode.TOOL_END,
    ]
    assert not MessageQueue().set_visible_dispatch_mode(DispatchMode.TURN_END)


def delegated_prompt(name: str, correlation: Correlation) -> NewMessage:
    """A user-authored delegated prompt: the turn's original prompt, not a continuation."""
    return NewMessage(
        text=f"prompt {name}",
        id=name,
        kind=EntryKind.USER,
        metadata=MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=correlation),
    )


def assert_stripped(queue: MessageQueue, entry_id: str) -> None:
    entry = queue.get(entry_id)
    assert entry is not None
    assert (entry.metadata, entry.correlation) == (None, None)
    assert not entry.has_on_canceled
    assert not entry.has_on_accepted_pre_stream_failure


def assert_kept(queue: MessageQueue, entry_id: str, correlation: Correlation) -> None:
    entry = queue.get(entry_id)
    assert entry is not None
    assert entry.correlation == correlation
    assert entry.has_on_canceled
    assert entry.has_on_accepted_pre_stream_failure


def test_mq12_prioritize_revalidates_once_a_user_entry_is_moved_ahead_of_continuations() -> None:
    log = Log()
    queue = MessageQueue()
    queued(queue, report("R1", C, log))
    queued(queue, report("R2", C, log))
    queued(queue, report("P", C2, log, continuation=False))  # an original prompt: never stripped
    queued(queue, user("u", id="u"))
    for name in ("R1", "R2"):  # at the head, of one turn: nothing stale before the move
        assert_kept(queue, name, C)

    assert queue.prioritize_next_user_entry()

    assert [e.id for e in queue] == ["u", "R1", "R2", "P"]
    assert_stripped(queue, "R1")  # now behind the user's unrelated message: stale
    assert_stripped(queue, "R2")
    assert_kept(queue, "P", C2)
    notify_all_canceled(queue.clear(), "cleared")
    assert [name for name, _, _ in log.calls] == ["P"]  # a stripped report settles nothing


def test_mq12_visible_dispatch_mode_revalidates_once_user_entries_lead() -> None:
    log = Log()
    queue = MessageQueue()
    queued(queue, report("R", C, log))
    queued(queue, user("u1", id="u1"))
    queued(queue, NewMessage(text="s", id="s", kind=EntryKind.SYSTEM))
    queued(queue, user("u2", id="u2"))
    assert_kept(queue, "R", C)

    assert queue.set_visible_dispatch_mode(DispatchMode.TURN_END)

    assert [(e.id, e.mode) for e in queue] == [
        ("u1", DispatchMode.TURN_END),
        ("u2", DispatchMode.TURN_END),
        ("R", DispatchMode.TOOL_END),
        ("s", DispatchMode.TOOL_END),
    ]
    assert_stripped(queue, "R")
    assert [queue.dequeue_next().entry_id for _ in range(2)] == ["u1", "u2"]
    stale = queue.dequeue_next()  # what the dispatcher gets: no turn to settle, no callbacks
    assert (stale.entry_id, stale.metadata) == ("R", None)
    assert not stale.callbacks.has_cancellation
    assert log.calls == []


@pytest.mark.parametrize("reorder", ["prioritize", "visible"])
def test_mq12_a_reorder_behind_the_same_turns_prompt_strips_nothing(reorder: str) -> None:
    # The user-authored entry moved to the head is the delegated turn's own prompt: the
    # reports behind it still continue that turn, and revalidation must leave them alone.
    log = Log()
    queue = MessageQueue()
    queued(queue, report("R1", C, log))
    queued(queue, delegated_prompt("P", C))
    queued(queue, report("R2", C, log))
    if reorder == "prioritize":
        assert queue.prioritize_next_user_entry()
    else:
        assert queue.set_visible_dispatch_mode(DispatchMode.TURN_END)
    assert [e.id for e in queue] == ["P", "R1", "R2"]
    assert_kept(queue, "R1", C)
    assert_kept(queue, "R2", C)


def test_mq13_reordering_strips_stale_continuations_but_keeps_original_prompts() -> None:
    log = Log()
    queue = MessageQueue()
    queued(queue, report("R", C, log, continuation=True))
    queued(queue, report("P", C2, log, continuation=False))
    queued(queue, user("u", id="u"))

    assert queue.set_visible_dispatch_mode(DispatchMode.TURN_END)

    by_id = {e.id: e for e in queue}
    assert [e.id for e in queue] == ["u", "R", "P"]
    assert by_id["u"].mode is DispatchMode.TURN_END
    assert by_id["R"].metadata is None
    assert not by_id["R"].has_on_canceled
    assert not by_id["R"].has_on_accepted_pre_stream_failure
    assert by_id["P"].correlation == C2
    notify_all_canceled(queue.clear(), "cleared")
    assert [name for name, _, _ in log.calls] == ["P"]  # nothing for the stripped R


def test_mq13_continuations_of_the_first_correlation_keep_their_metadata() -> None:
    prompt = NewMessage(
        text="delegated prompt",
        id="P",
        kind=EntryKind.USER,
        metadata=MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=C),
    )
    queue = MessageQueue()
    queued(queue, report("R1", C))
    queued(queue, prompt)
    queued(queue, NewMessage(text="s", id="s", kind=EntryKind.SYSTEM))
    queued(queue, report("R2", C))

    assert queue.set_visible_dispatch_mode(DispatchMode.TOOL_END)  # P (user-authored) first

    assert [e.id for e in queue] == ["P", "R1", "s", "R2"]
    by_id = {e.id: e for e in queue}
    assert by_id["R1"].correlation == C  # same turn as the head: still a continuation
    assert by_id["R2"].correlation is None  # behind unrelated work: stale


def test_mq13_withdrawn_entries_are_not_predecessors() -> None:
    prompt = NewMessage(
        text="delegated prompt",
        id="P",
        kind=EntryKind.USER,
        metadata=MessageMetadata(type=MetadataType.WORKSPACE_TURN, correlation=C),
    )
    queue = MessageQueue()
    queued(queue, prompt)
    queued(queue, wake("W"))
    queued(queue, report("R", C))
    queue.withdraw("W")
    assert queue.prioritize_next_user_entry()
    report_entry = queue.get("R")
    assert report_entry is not None
    assert report_entry.correlation == C


# ---------------------------------------------------------------- MQ-14


def test_mq14_dequeue_returns_the_joined_head_with_authorship_and_callbacks() -> None:
    token = CancelToken()
    state = CancelState()
    log = Log()
    queue = MessageQueue()
    queued(
        queue,
        NewMessage(
            text="w",
            id="w",
            kind=EntryKind.WAKE,
            cancel_token=token,
            cancel_state=state,
            on_canceled=log.canceled("w"),
        ),
    )
    queued(queue, NewMessage(text="s1", kind=EntryKind.SYSTEM, agent_initiated=True))
    queued(queue, NewMessage(text="s2", kind=EntryKind.SYSTEM, agent_initiated=False))

    head = queue.dequeue_next()
    assert head.entry_id == "w"
    assert head.text == "w"
    assert head.kind is EntryKind.WAKE
    assert head.synthetic
    assert head.agent_initiated
    assert head.cancel_token is token
    assert head.cancel_state is state
    assert head.callbacks.on_canceled is not None
    assert head.attachments is None

    mixed = queue.dequeue_next()
    assert mixed.text == "s1\ns2"
    assert mixed.synthetic
    assert not mixed.agent_initiated  # not every add was agent-initiated
    assert queue.is_empty
    with pytest.raises(QueueEmpty):
        queue.dequeue_next()


def test_mq14_an_entry_mixing_synthetic_and_agent_initiated_adds_is_neither() -> None:
    """Authorship is "every add": one add that is only synthetic and one that is only
    agent-initiated batch into one entry (neither is user-authored), which is neither."""
    queue = MessageQueue()
    system = EntryKind.SYSTEM
    queued(queue, NewMessage(text="s", kind=system, synthetic=True, agent_initiated=False))
    queued(queue, NewMessage(text="a", kind=system, synthetic=False, agent_initiated=True))
    assert len(queue) == 1
    mixed = queue.dequeue_next()
    assert mixed.text == "s\na"
    assert not mixed.synthetic
    assert not mixed.agent_initiated
    assert not mixed.user_authored


def test_mq14_dequeued_options_carry_no_dispatch_mode() -> None:
    queue = MessageQueue()
    queued(queue, user("a", mode=DispatchMode.TURN_END, options=SendOptions(model="p:m")))
    out = queue.dequeue_next()
    assert out.options is not None
    assert "mode" not in msgspec.structs.asdict(out.options)
    assert out.mode is DispatchMode.TURN_END


# ---------------------------------------------------------------- MQ-15


def test_mq15_only_user_authored_entries_are_visible_or_restored() -> None:
    log = Log()
    queue = MessageQueue()
    queued(queue, user("a", attachments=(PDF,)))
    queued(
        queue, NewMessage(text="s", id="s", kind=EntryKind.SYSTEM, on_canceled=log.canceled("s"))
    )
    queued(queue, user("b"))
    assert len(queue) == 3
    assert [e.texts for e in queue.visible()] == [("a",), ("b",)]

    restored = queue.restore_to_input()

    assert restored.text == "a\nb"
    assert restored.attachments == (PDF,)
    assert queue.is_empty
    notify_all_canceled(restored.removed, "restored")
    assert log.calls == [("s", "on_canceled", "restored")]


# ---------------------------------------------------------------- MQ-16


def test_mq16_clear_returns_callbacks_in_queue_order_and_a_failing_one_stops_none() -> None:
    log = Log()
    queue = MessageQueue()
    queued(queue, user("u"))

    def broken(reason: str) -> None:
        raise RuntimeError(f"producer bug: {reason}")

    queued(queue, NewMessage(text="x", id="x", kind=EntryKind.SYSTEM, on_canceled=broken))
    queued(queue, report("R", C, log))
    queued(queue, wake("W", log=log))

    removed = queue.clear()

    assert queue.is_empty
    assert [c.entry_id for c in removed if c.has_cancellation] == ["x", "R", "W"]
    errors = notify_all_canceled(removed, "cleared by test")
    assert [entry for entry, _ in errors] == ["x"]
    assert log.calls == [
        ("R", "on_canceled", "cleared by test"),
        ("W", "on_canceled", "cleared by test"),
    ]


def test_mq16_pre_stream_failure_runs_when_there_is_no_on_canceled() -> None:
    log = Log()
    queue = MessageQueue()
    queued(
        queue,
        NewMessage(text="r", id="r", on_accepted_pre_stream_failure=log.failed("r")),
    )
    notify_all_canceled(queue.clear(), "gone")
    assert log.calls == [("r", "on_accepted_pre_stream_failure", "gone")]
