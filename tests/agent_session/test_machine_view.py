"""The turn machine's one-line view (``repr``) and its statistics, driven with no engine.

Each test feeds the machine inputs through ``handle`` (performing only the ``Next`` inputs it
gives itself, as the shell does) and asserts the one line that says where it is: the phase,
then only the flags that are set, in a fixed order.
"""

from __future__ import annotations

from agent_session import SessionStatistics
from agent_session import _inputs as _in
from agent_session._continuation import Marker
from agent_session._effects import Commit, Effect, Next
from agent_session._machine import TurnMachine
from agent_session._phases import Phase
from message_queue import CancelToken, DispatchMode, EntryKind, NewMessage
from stream_manager import ModelFallbackProgress, StartCause

MODEL = "model-q"


def machine() -> TurnMachine:
    return TurnMachine("s7", MODEL, known_models=frozenset({MODEL}), resume_attempt_cap=4)


def feed(m: TurnMachine, given: _in.Input) -> list[Effect]:
    """``given``, then every ``Next`` the machine gives itself; the other effects, in order."""
    out: list[Effect] = []
    for effect in m.handle(given):
        if isinstance(effect, Next):
            out += feed(m, effect.input)
        else:
            out.append(effect)
    return out


def queue(m: TurnMachine, entry: str, kind: EntryKind, mode: DispatchMode) -> None:
    token = CancelToken()  # withdrawable
    m.queue.add(
        NewMessage(text=f"{entry}'s text", kind=kind, id=entry, mode=mode, cancel_token=token)
    )
    feed(m, _in.Queued())


def owed_marker(steps: int) -> Marker:
    return Marker(
        cut="s7/3",
        model=MODEL,
        step_budget=steps,
        progress=ModelFallbackProgress(requested_model=MODEL),
    )


def test_machine_repr_of_a_fresh_machine_names_only_its_phase() -> None:
    assert repr(machine()) == "<TurnMachine s7 idle>"


def test_machine_repr_follows_a_drained_entry_into_a_streaming_turn_with_a_soft_stop() -> None:
    m = machine()
    queue(m, "w1", EntryKind.WAKE, DispatchMode.TOOL_END)
    assert repr(m) == "<TurnMachine s7 preparing dispatching=w1>"
    feed(m, _in.StreamBegan("s7/1", StartCause.SEND))
    feed(m, _in.ToolStarted("call-a"))
    feed(m, _in.ToolStarted("call-b"))
    assert repr(m) == "<TurnMachine s7 streaming dispatching=w1 tools=2>"
    queue(m, "u1", EntryKind.USER, DispatchMode.TOOL_END)  # busy: it queues
    feed(m, _in.ToolEnded("call-a", provider=True))
    assert repr(m) == "<TurnMachine s7 streaming queue=1 dispatching=w1 tools=1>"
    feed(m, _in.ToolEnded("call-b", provider=True))  # AS-27: the last tool ended: soft stop
    assert repr(m) == "<TurnMachine s7 streaming queue=1 dispatching=w1 soft-stop>"


def test_machine_repr_shows_a_manual_send_in_preflight_and_what_queues_behind_it() -> None:
    m = machine()
    feed(m, _in.DirectSend())
    queue(m, "u2", EntryKind.USER, DispatchMode.TURN_END)
    queue(m, "u3", EntryKind.USER, DispatchMode.TOOL_END)
    m.queue.withdraw("u2")
    assert repr(m) == "<TurnMachine s7 idle queue=1 withdrawn=1 preflight=1>"
    assert m.statistics().queued == ("u3",)


def test_machine_repr_shows_an_owed_cut_then_the_record_change_its_stop_leaves_pending() -> None:
    m = machine()
    m.handle(_in.AdoptOwed(owed_marker(5), "s7:r9"))
    assert repr(m) == "<TurnMachine s7 idle owed=s7/3(5)>"
    feed(m, _in.Stop())  # withdrawn: the record change waits for its write
    assert repr(m) == "<TurnMachine s7 idle pending=1>"
    [commit] = m.handle(_in.FlushRecords())  # decided, handed to the writer
    assert repr(m) == "<TurnMachine s7 idle>"
    assert isinstance(commit, Commit)


def test_machine_statistics_read_the_machines_state_with_no_shell_counts() -> None:
    m = machine()
    m.handle(_in.AdoptOwed(owed_marker(2), "s7:r4"))
    queue(m, "u4", EntryKind.USER, DispatchMode.TURN_END)
    stats = m.statistics()
    assert stats == SessionStatistics(
        session="s7",
        phase=Phase.PREPARING,
        owed="s7/3",
        owed_steps=2,
        queued=(),
        dispatching="u4",
    )
    assert stats.busy
    assert not stats.settled


def test_machine_repr_of_a_disposed_machine() -> None:
    m = machine()
    queue(m, "u5", EntryKind.USER, DispatchMode.TURN_END)
    feed(m, _in.Dispose())
    feed(m, _in.DisposedNow())
    assert repr(m) == "<TurnMachine s7 preparing dispatching=u5 disposed>"
    feed(m, _in.DisposalDone())
    assert repr(m) == "<TurnMachine s7 disposed dispatching=u5>"
