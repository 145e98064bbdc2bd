"""A machine that fails loudly: an internal error breaks the session, once, and it reopens.

An illegal phase move halfway through a decision is an engine bug. The session must not go on
in whatever phase it reached: it moves to ``broken``, says so once (a log line and a
``session-broken`` event), stops what runs, refuses every input but disposal with
``BrokenSession``, and ``Engine.reopen_session`` opens it again from the store.
"""

from __future__ import annotations

import logging

import pytest

from agent_session import BrokenSession, IllegalTransition, Phase, PhaseChanged, SessionBroken
from agent_session import _inputs as _in
from agent_session._effects import AbortPrepared, AbortResume, Emit, StopStream
from agent_session._events import EntryCanceled
from agent_session._machine import TurnMachine
from agent_session._turn import TurnInput
from message_queue import NewMessage
from persistence import RowKind
from stream_manager import AbortReason, StartCause
from tests.agent_session.support import X, session_rig


def _streaming_machine() -> TurnMachine:
    machine = TurnMachine(
        "s-4", "model-k", known_models=frozenset({"model-k"}), resume_attempt_cap=3
    )
    turn = TurnInput(text="go")
    machine.handle(_in.DirectSend())
    machine.handle(_in.TurnAccepted(turn))
    machine.handle(_in.Launching(machine.turn_context(turn)))
    machine.handle(_in.StreamBegan("s-4/1", StartCause.SEND))
    machine.queue.add(NewMessage(text="later", id="q-8"))
    assert machine.phase is Phase.STREAMING
    return machine


def test_as1_an_illegal_move_halfway_through_a_decision_breaks_the_machine() -> None:
    machine = _streaming_machine()
    effects = machine.handle(_in.Drain())  # streaming -> preparing is not in the table
    assert machine.phase is Phase.BROKEN
    assert effects[0] == Emit(PhaseChanged(session="s-4", from_=Phase.STREAMING, to=Phase.BROKEN))
    broken = effects[1]
    assert isinstance(broken, Emit)
    assert isinstance(broken.event, SessionBroken)
    assert broken.event.input == "Drain"
    assert broken.event.phase is Phase.STREAMING
    assert "streaming -> preparing" in broken.event.error
    assert effects[2:] == [
        AbortPrepared(AbortReason.SYSTEM),
        AbortResume(),
        StopStream(AbortReason.SYSTEM),
    ]


def test_as1_a_broken_machine_refuses_every_input_but_disposal() -> None:
    machine = _streaming_machine()
    machine.handle(_in.Drain())
    with pytest.raises(BrokenSession, match="s-4 is broken"):
        machine.handle(_in.Queued())
    with pytest.raises(BrokenSession):
        machine.handle(_in.Stop())
    assert machine.handle(_in.Dispose()) == []  # nothing forfeited: the store's records stand
    dropped = [e.event for e in machine.handle(_in.DisposedNow()) if isinstance(e, Emit)]
    assert [(e.entry, e.reason) for e in dropped if isinstance(e, EntryCanceled)] == [
        ("q-8", "disposed")
    ]
    assert machine.handle(_in.DisposalDone()) == [
        Emit(PhaseChanged(session="s-4", from_=Phase.BROKEN, to=Phase.DISPOSED))
    ]


def test_as1_a_host_mistake_raises_and_breaks_nothing() -> None:
    machine = _streaming_machine()
    with pytest.raises(Exception, match="q-404"):
        machine.handle(_in.Withdraw("q-404", "gone"))
    assert machine.broken is None
    assert machine.phase is Phase.STREAMING


async def test_as1_a_session_that_breaks_is_told_once_and_reopens_from_the_store(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def bug(self: TurnMachine) -> list[object]:
        raise IllegalTransition(self.id, Phase.STREAMING, Phase.IDLE)

    async with session_rig({"M": [X("first answer"), X("second answer")]}) as r:
        monkeypatch.setattr(TurnMachine, "_ended", bug)
        with caplog.at_level(logging.ERROR, logger="turnkeeper.session"):
            r.session().send("hello there")
            await r.settle()
        assert r.session().phase is Phase.BROKEN
        assert [e.input for e in r.of(SessionBroken)] == ["AfterTelling"]
        assert [rec.getMessage() for rec in caplog.records if "broke" in rec.getMessage()] == [
            caplog.records[0].getMessage()
        ]
        with pytest.raises(BrokenSession):
            r.session().send("are you there")
        monkeypatch.undo()
        reopened = await r.engine.reopen_session("s1")
        assert reopened.phase is Phase.IDLE
        assert await r.kinds() == [RowKind.USER, RowKind.ASSISTANT]  # nothing durable lost
        reopened.send("again")
        await r.settle()
        assert await r.kinds() == [RowKind.USER, RowKind.ASSISTANT] * 2
        assert len(r.of(SessionBroken)) == 1
