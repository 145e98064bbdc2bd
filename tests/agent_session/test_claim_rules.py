"""ST-15: the owner's claim on a delegated turn's cut, on the real machine (the kit).

The claim is one synchronous answer in ST-15's order: a consumed cut, the engaged cutter, the
first live queued entry, the owed marker, a running stream of the turn; a ``False`` withdraws
the marker of exactly that cut, for good. The owner asks while it is told of the cut's end
(TD-2), before the session drains its queue (:meth:`Kit.claim_when_told`).
"""

from __future__ import annotations

from agent_session import _inputs as _in
from agent_session._delegation import ChildEnded
from message_queue import Correlation, EntryKind
from persistence import CutState
from stream_manager import FinishReason
from tests.agent_session.kit import CORRELATION, Kit

OTHER = Correlation(handle_id="handle-2", owner_session="owner-3", turn_id="turn-4")


def _correlated_cut(kit: Kit, cutter: EntryKind, *, cutter_correlated: bool = False) -> str:
    """A correlated turn streams; ``cutter`` is queued; the stream is cut for it (not drained)."""
    stream = kit.streaming(EntryKind.WAKE, correlated=True)
    kit.queue(cutter, correlated=cutter_correlated)
    kit.end(3, cut=True)
    return stream


def test_st15_r28_a_live_wake_behind_the_cut_answers_defer_and_keeps_the_marker() -> None:
    kit = Kit()
    answers = kit.claim_when_told()
    cut = _correlated_cut(kit, EntryKind.WAKE)

    assert answers == [True]
    assert kit.machine.continuation.marker is not None
    assert kit.ended() == []
    heard = kit.owner_heard[-1]
    assert isinstance(heard, ChildEnded)
    assert (heard.stream, heard.finish, heard.correlation) == (
        cut,
        FinishReason.TOOL_CALLS,
        CORRELATION,
    )


def test_st15_an_unrelated_live_entry_answers_no_and_the_no_binds() -> None:
    kit = Kit()
    answers = kit.claim_when_told()
    cut = _correlated_cut(kit, EntryKind.USER)

    assert answers == [False]
    assert kit.ended() == [(cut, "voided")]
    # the superseding entry leaves before acceptance: the cut never resumes all the same
    dispatch = kit.dispatches[0]
    assert dispatch.turn.entry_id is not None
    kit.withdraw(dispatch.turn.entry_id)
    assert kit.accept() is None
    kit.sweep()
    assert kit.resumes == []
    assert kit.state_of(cut) is CutState.VOIDED


def test_st15_a_withdrawn_entry_is_skipped_and_the_owed_marker_answers() -> None:
    kit = Kit()
    stream = kit.streaming(EntryKind.WAKE, correlated=True)
    user = kit.queue(EntryKind.USER)
    wake = kit.queue(EntryKind.WAKE)
    kit.withdraw(user)
    kit.withdraw(wake)
    answers = kit.claim_when_told()
    kit.end(3, cut=True)

    assert answers == [True]  # no live entry: step 4, the marker of exactly this cut
    assert kit.machine.continuation.marker is not None
    assert kit.machine.continuation.marker.cut == stream


def test_st15_r30_the_dispatching_cutter_answers_before_the_queue() -> None:
    kit = Kit()
    cut = _correlated_cut(kit, EntryKind.USER)  # the drain dequeued it: PREPARING
    kit.queue(EntryKind.REPORT, correlated=True)  # R(C) now heads the queue

    assert kit.claim(cut) is False
    assert kit.ended() == [(cut, "voided")]


def test_st15_a_dispatching_cutter_whose_cancel_fired_is_looked_past() -> None:
    kit = Kit()
    cut = _correlated_cut(kit, EntryKind.USER)
    dispatch = kit.dispatches[0]
    assert dispatch.turn.entry_id is not None
    kit.withdraw(dispatch.turn.entry_id)  # it will cancel before acceptance

    assert kit.claim(cut) is True  # step 4: the owed marker of this cut
    assert kit.machine.continuation.marker is not None


def test_st15_r33_a_consumed_cut_answers_true_once() -> None:
    kit = Kit()
    cut = kit.stranded(remaining=3, correlated=True)
    kit.sweep()
    kit.resume()
    kit.start()  # the resume streams: the cut is consumed
    kit.end(2)  # and ends: nothing runs, nothing is owed or queued

    assert kit.claim(cut) is True  # its successor already ran
    assert kit.claim(cut) is False  # remembered once: then nothing continues it


def test_st15_a_newer_cut_of_the_same_turn_answers_true_for_an_older_end() -> None:
    kit = Kit()
    older = kit.stranded(remaining=4, correlated=True)
    kit.sweep()
    kit.resume()
    kit.start()
    kit.claim(older)  # forget the consumed cut
    kit.queue(EntryKind.WAKE)
    kit.end(2, cut=True)  # the resume is cut again: a newer marker of the same turn
    marker = kit.machine.continuation.marker
    assert marker is not None
    assert marker.cut != older

    assert kit.claim(older) is True  # an older end still settling must not void the newer cut
    assert kit.machine.continuation.marker == marker


def test_st15_a_running_stream_of_the_turn_answers_true() -> None:
    kit = Kit()
    kit.streaming(EntryKind.WAKE, correlated=True)

    assert kit.claim("an-older-stream") is True


def test_st15_nothing_to_continue_answers_false() -> None:
    kit = Kit()
    kit.streaming(EntryKind.WAKE, correlated=True)
    kit.end(2)

    assert kit.claim("the-ended-stream") is False
    assert kit.claim("the-ended-stream", OTHER) is False


def test_st15_the_claim_input_replies_without_writing() -> None:
    kit = Kit()
    kit.streaming(EntryKind.WAKE, correlated=True)

    effects = kit.give(_in.Claim(CORRELATION, "another-stream"))

    assert [type(e).__name__ for e in effects] == ["Reply"]


def test_st16_the_owners_queued_or_dispatching_read_ignores_withdrawn_entries() -> None:
    kit = Kit()
    kit.streaming(EntryKind.WAKE)  # an uncorrelated turn runs; entries queue behind it
    report = kit.queue(EntryKind.REPORT, correlated=True)
    assert kit.machine.queued_or_dispatching(CORRELATION) is True
    assert kit.machine.queued_or_dispatching(OTHER) is False
    kit.withdraw(report)
    assert kit.machine.queued_or_dispatching(CORRELATION) is False  # MQ-7: withdrawn is gone


def test_st16_a_dispatching_correlated_entry_counts_until_its_cancel_fires() -> None:
    kit = Kit()
    kit.streaming(EntryKind.WAKE)
    kit.queue(EntryKind.REPORT, correlated=True)
    kit.end(2)  # the drain dequeues the report: dispatching, PREPARING
    dispatch = kit.dispatches[0]
    assert dispatch.turn.entry_id is not None
    assert kit.machine.queued_or_dispatching(CORRELATION) is True
    kit.withdraw(dispatch.turn.entry_id)
    assert kit.machine.queued_or_dispatching(CORRELATION) is False
