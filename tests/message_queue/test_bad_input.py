"""Bad input to the queue: typed errors that name the value, and nothing queued changes."""

from __future__ import annotations

import pytest

from message_queue import (
    Correlation,
    EntryKind,
    InvalidEntry,
    MessageMetadata,
    MessageQueue,
    MetadataType,
    NewMessage,
    UnknownEntry,
)
from persistence import TurnkeeperError, UsageError
from tests.message_queue.helpers import queued, user, wake


def _loaded() -> tuple[MessageQueue, str]:
    queue = MessageQueue()
    queued(queue, user("a", id="u1"))
    queued(queue, wake("w1"))
    return queue, repr(queue)


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        (NewMessage(text="x", kind="robot"), "unknown entry kind 'robot'"),
        (NewMessage(text="x", mode="step-end"), "unknown dispatch mode 'step-end'"),
        (NewMessage(text="x", id="u1"), "entry id 'u1' is already queued"),
        (
            NewMessage(text="x", metadata=MessageMetadata(type=MetadataType.WORKSPACE_TURN)),
            "workspace-turn metadata needs a correlation",
        ),
        (
            NewMessage(
                text="x",
                metadata=MessageMetadata(
                    correlation=Correlation(handle_id="h", owner_session="o", turn_id="t")
                ),
            ),
            "a correlation needs workspace-turn metadata",
        ),
    ],
)
def test_invalid_add_raises_a_typed_error_naming_the_value(
    message: NewMessage, needle: str
) -> None:
    queue, before = _loaded()
    with pytest.raises(InvalidEntry, match=needle):
        queue.add(message)
    assert repr(queue) == before
    assert [e.id for e in queue] == ["u1", "w1"]


def test_unknown_kind_is_reported_even_when_the_text_is_also_blank() -> None:
    queue = MessageQueue()
    with pytest.raises(InvalidEntry, match="expected one of: user, wake, report, system"):
        queue.add(NewMessage(text="", kind="nope"))


def test_add_once_needs_a_key() -> None:
    queue, before = _loaded()
    with pytest.raises(InvalidEntry, match="dedupe key must be a non-empty string"):
        queue.add_once(NewMessage(text="x", kind=EntryKind.SYSTEM), "")
    assert repr(queue) == before


def test_withdraw_names_the_unknown_or_unwithdrawable_entry() -> None:
    queue, before = _loaded()
    with pytest.raises(UnknownEntry, match="no queued entry 'ghost'"):
        queue.withdraw("ghost")
    with pytest.raises(InvalidEntry, match="'u1' has no cancel token"):
        queue.withdraw("u1")
    assert repr(queue) == before
    assert queue.withdraw("w1")
    assert not queue.withdraw("w1")  # already withdrawn: a no-op that says so


def test_readers_refuse_an_unknown_mode() -> None:
    queue, _ = _loaded()
    with pytest.raises(InvalidEntry, match="unknown dispatch mode 'soon'"):
        queue.has_queued("soon")


def test_queue_errors_share_the_turnkeeper_root() -> None:
    assert issubclass(InvalidEntry, UsageError)
    assert issubclass(UnknownEntry, TurnkeeperError)


def test_repr_is_a_one_line_oracle() -> None:
    queue, _ = _loaded()
    queue.withdraw("w1")
    assert repr(queue) == (
        "<MessageQueue [2 entries: 1 live, 1 withdrawn, 1 sealed | "
        "modes: 1 tool-end, 0 turn-end | keys: 0]>"
    )
