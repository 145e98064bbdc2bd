"""Regressions found by the delegation state machine (``test_delegation_bookkeeping.py``).

Each is that machine's shrunk order of actions on its scenario (``tests/stateful/
delegation_kit.py``: ``lead`` delegates to ``worker`` under ``h-9``; a wake cuts the worker's
first stream at a tool boundary), run on both stores, with what must hold spelled out.
"""

from __future__ import annotations

import pytest

from persistence import HandleStatus
from tests.stateful.delegation_kit import HANDLE, Action, check, lines_of, run_example

KINDS = ["memory", "sqlite"]


def settles_once(
    actions: tuple[Action, ...], kind: str, *statuses: HandleStatus
) -> list[dict[str, object]]:
    """Run ``actions``: the handle is settled once, durably, with one of ``statuses``."""
    outcome = run_example(actions, kind)
    trace = outcome.result.trace
    assert outcome.handles[HANDLE] in statuses, trace
    settled = [trace[i] for i in lines_of(trace, "settled", handle=HANDLE)]
    told = [(line["session"], line["status"]) for line in settled]
    assert told == [("lead", outcome.handles[HANDLE].value)], trace
    check(outcome)
    return trace


@pytest.mark.parametrize("kind", KINDS)
def test_r27_as31_disposing_the_target_before_its_delegated_turn_starts_settles_the_owner(
    kind: str,
) -> None:
    # the worker is disposed as the handle becomes durable: the prompt's send never streams,
    # nothing is owed, and no stream event will ever tell the owner anything
    trace = settles_once((("handle-1", "dispose"),), kind, HandleStatus.INTERRUPTED)
    assert not lines_of(trace, "stream-start")


@pytest.mark.parametrize("kind", KINDS)
def test_r27_as31_disposing_the_target_while_its_delegated_turn_streams_settles_the_owner(
    kind: str,
) -> None:
    # the wake's turn carries the delegated turn on (its cut consumed); disposal stops that
    # stream with a system abort, which settles nothing (TD-5), and nothing is owed to forfeit;
    # in memory the stream may end (stop: completed) before the disposal's task runs
    statuses = (HandleStatus.INTERRUPTED, HandleStatus.COMPLETED)
    trace = settles_once((("ended", "dispose"),), kind, *statuses)
    starts = [trace[i]["handle"] for i in lines_of(trace, "stream-start")]
    assert starts == [HANDLE, HANDLE]


@pytest.mark.parametrize("kind", KINDS)
def test_td6_a_delegated_prompt_whose_send_is_refused_settles_the_owner_error(
    kind: str,
) -> None:
    # the handle is durable; the write of the prompt's user row then fails, so the send is
    # refused (no row, no stream, nothing owed): nothing else would ever settle the handle
    trace = settles_once((("handle-1", "fail-store-1"),), kind, HandleStatus.ERROR)
    assert not lines_of(trace, "stream-start")
    assert not lines_of(trace, "persisted", what="user-row")


@pytest.mark.parametrize("kind", KINDS)
def test_td5_st5_a_user_stop_after_the_owner_deferred_settles_it_interrupted(kind: str) -> None:
    # the owner deferred on the queued wake; the user's Stop comes before the wake's turn
    # starts: the continuation is withdrawn (ST-5) and the Stop's abort has no stream, so the
    # owner must hear the user's abort from the withdrawal itself (TD-5)
    trace = settles_once((("claim", "stop"),), kind, HandleStatus.INTERRUPTED)
    assert [trace[i]["stream"] for i in lines_of(trace, "stream-start")] == ["worker/1"]


@pytest.mark.parametrize("kind", KINDS)
def test_td4_after_a_restart_an_uncorrelated_stream_end_supersedes_the_recovered_turn(
    kind: str,
) -> None:
    # a crash as the cut is owed (before the owner's claim); the next engine recovers the cut
    # and a user message then supersedes it (R35): the user's stream ends uncorrelated, which
    # supersedes the delegated turn (TD-4), although it began in the previous process
    trace = settles_once((("owed", "crash"), ("recovered", "send")), kind, HandleStatus.INTERRUPTED)
    assert [trace[i]["handle"] for i in lines_of(trace, "stream-start")] == [HANDLE, None]


@pytest.mark.parametrize("kind", KINDS)
def test_td4_r35_a_superseding_stream_that_fails_settles_the_deferred_owner(kind: str) -> None:
    # the owner deferred on the wake; the wake's row fails to write (it goes nowhere, the cut
    # stays owed), then a queued user message supersedes the cut (R35: withdrawn, for the
    # superseding stream's end to settle, TD-4); that stream fails instead of ending
    actions = (("claim", "fail-store-1"), ("claim", "send"), ("start-2", "fail-store-1"))
    trace = settles_once(actions, kind, HandleStatus.INTERRUPTED)
    # the failed superseding stream is retried (AS-32), uncorrelated as it was
    assert [trace[i]["handle"] for i in lines_of(trace, "stream-start")] == [HANDLE, None, None]
    assert [trace[i]["cause"] for i in lines_of(trace, "stream-start")][-1] == "retry"
    assert [trace[i]["type"] for i in lines_of(trace, "stream-error")] == ["store_write"]


@pytest.mark.parametrize("kind", KINDS)
def test_r32_a_delegated_prompt_cleared_from_the_queue_settles_the_owner(kind: str) -> None:
    # a user message keeps the worker busy, so the delegated prompt is queued; it cuts the
    # user's turn, and a plain clear then removes it before it ever ran: nothing carries the
    # delegated turn any more
    trace = settles_once((("cut-end", "clear"), ("start", "send")), kind, HandleStatus.INTERRUPTED)
    assert all(trace[i]["handle"] is None for i in lines_of(trace, "stream-start"))


@pytest.mark.parametrize("kind", KINDS)
def test_r27_disposing_the_target_as_it_is_delegated_to_settles_and_the_engine_runs_on(
    kind: str,
) -> None:
    # the disposal runs before the delegation's own task writes the handle and sends the
    # prompt: the send must not reach the disposed session (that failed the engine)
    settles_once((("start", "dispose"), ("start", "dispose")), kind, HandleStatus.INTERRUPTED)
