"""The ST and AS families' core rules, on the turn machine alone (``tests/agent_session/kit.py``).

Each test reaches its state in a line or two, gives the input under test and asserts the
decision (the raw effects) or what the shell performed (events told, the fake store, what it
acted on). The engine-level tests (``test_st_rules``, ``test_as_*_rules``) keep the seams: the
store, the stream manager, the pipeline's awaits and tasks.
"""

from __future__ import annotations

from agent_session._effects import (
    AbortPrepared,
    AbortResume,
    CancelRemoved,
    Emit,
    Next,
    Reply,
    ScheduleSweep,
    StartResume,
    StopStream,
)
from agent_session._events import (
    ContinuationEnded,
    ContinuationOwed,
    EntryDequeued,
    PhaseChanged,
    ResumeAttempted,
)
from agent_session._inputs import (
    AdoptOwed,
    ArmResume,
    Clear,
    Consume,
    DirectSend,
    Discard,
    DispatchEntry,
    FlushRecords,
    HardStop,
    Queued,
    Restore,
    SendNow,
    SendWentNowhere,
    Stop,
    StreamBegan,
    Sweep,
    SweepDue,
    SweepWanted,
    SyntheticAbort,
    ToIdleFrom,
    ToolEnded,
    ToolStarted,
)
from agent_session._phases import Phase
from agent_session._turn import TurnInput
from message_queue import DispatchMode, EntryKind
from persistence import CutState, RowKind
from stream_manager import AbortReason, StartCause, StreamFailed, WriteFailed
from stream_manager.errors import ErrorType
from tests.agent_session.kit import CORRELATION, Kit

USER, WAKE = EntryKind.USER, EntryKind.WAKE
QUEUED = AbortReason.QUEUED_MESSAGE


def phase(kit: Kit, from_: Phase, to: Phase) -> Emit:
    return Emit(PhaseChanged(session=kit.session, from_=from_, to=to))


def soft_stopped(kit: Kit, *, correlated: bool = False, cutter: EntryKind = USER) -> str:
    """A provider tool's result soft-stopped a turn for a queued ``tool-end`` entry (AS-27)."""
    stream = kit.streaming(correlated=correlated)
    kit.queue(cutter)
    kit.call(ToolEnded("call-1", provider=True))
    assert kit.machine.soft_stop_in_flight
    return stream


# ---------------------------------------------------------------- ST-2 a normal cut


def test_st2_r1_r60_the_stop_report_owes_at_once_and_owed_is_told_after_the_cut_row() -> None:
    kit = Kit()
    cut = kit.cut(remaining=3)
    (owed,) = kit.of(ContinuationOwed)
    assert (owed.cut, owed.remaining, owed.model) == (cut, 3, "fallback-c")
    assert kit.names().index("Persisted:cut") < kit.names().index("ContinuationOwed")
    assert kit.state_of(cut) is CutState.OWED
    assert kit.machine.phase is Phase.PREPARING  # the cutter is dispatched (AS-24)
    assert kit.machine.continuation.marker is not None
    assert kit.machine.continuation.marker.step_budget == 3


def test_st2_r65_a_cut_with_no_steps_left_owes_nothing() -> None:
    kit = Kit()
    cut = kit.cut(remaining=0)
    assert not kit.machine.owes()
    assert kit.of(ContinuationOwed) == []
    assert [r.cut for r in kit.rows.values() if r.stream == cut] == [None]  # no record written


def test_st2_a_newer_cut_replaces_the_older_marker() -> None:
    kit = Kit()
    first = kit.cut(remaining=5)
    marker = kit.machine.continuation.marker
    assert marker is not None
    second = kit.streaming()  # the cutter consumed the first; re-owe it as recovery would
    kit.give(AdoptOwed(marker, kit.row_of(first)))
    kit.queue(WAKE)
    kit.end(2, cut=True)
    assert kit.machine.continuation.marker is not None
    assert (kit.machine.continuation.marker.cut, kit.state_of(second)) == (second, CutState.OWED)


# ---------------------------------------------------------------- ST-4 consumption


def test_st4_r64_claiming_preparing_does_not_consume_only_streaming_does() -> None:
    kit = Kit()
    cut = kit.stranded()
    kit.sweep()
    assert (kit.machine.phase, kit.machine.owes()) == (Phase.PREPARING, True)
    stream = kit.resume()
    assert stream is not None
    effects = kit.give(StreamBegan(stream, StartCause.RESUME))
    assert effects == [
        phase(kit, Phase.PREPARING, Phase.STREAMING),
        Next(Consume(stream, StartCause.RESUME)),
    ]
    assert kit.machine.owes()
    kit.give(Consume(stream, StartCause.RESUME))
    assert (kit.machine.owes(), kit.machine.continuation.consumed) == (False, (cut,))


def test_st4_the_consumed_record_is_durable_before_ended_and_started_are_told() -> None:
    kit = Kit()
    cut = kit.stranded()
    kit.sweep()
    kit.resume()
    kit.forget()
    kit.start()
    assert kit.names() == [
        "PhaseChanged",
        "Persisted:cut-void",
        "ContinuationEnded",
        "ResumeAttempted",
    ]
    assert kit.ended() == [(cut, "consumed")]
    assert kit.state_of(cut) is CutState.CONSUMED
    assert [e.outcome for e in kit.of(ResumeAttempted)] == ["started"]


def test_st4_a_live_cutter_consumes_the_marker_and_nothing_resumes_after() -> None:
    kit = Kit()
    cut = kit.cut(remaining=3)
    kit.accept()
    kit.start()
    kit.end()
    assert (kit.ended(), kit.state_of(cut)) == ([(cut, "consumed")], CutState.CONSUMED)
    kit.sweep()
    assert kit.resumes == []


# ---------------------------------------------------------------- ST-5 withdrawing


def test_st5_r6_a_user_stop_withdraws_durably_and_nothing_resumes() -> None:
    kit = Kit()
    cut = kit.stranded()
    kit.call(Stop())
    assert not kit.machine.owes()  # at once, before the queue is given back (AS-30)
    kit.call(Restore())
    assert (kit.ended(), kit.state_of(cut)) == ([(cut, "withdrawn")], CutState.WITHDRAWN)
    kit.sweep()
    assert kit.resumes == []


def test_st5_r35_a_superseding_user_send_withdraws_at_its_point_of_no_return() -> None:
    kit = Kit()
    cut = kit.cut(remaining=3, cutter=USER)
    assert kit.machine.owes()  # dispatched, not yet durable: still owed
    kit.accept()
    (ended,) = kit.of(ContinuationEnded)
    assert (ended.cut, ended.how.value, ended.why) == (
        cut,
        "withdrawn",
        "superseded by a send (R35)",
    )
    assert kit.names().index("Persisted:user-row") < kit.names().index("ContinuationEnded")
    assert kit.state_of(cut) is CutState.WITHDRAWN


def test_st5_r25_a_stream_error_withdraws_what_is_owed() -> None:
    kit = Kit()
    cut = kit.cut(remaining=4)
    marker = kit.machine.continuation.marker
    assert marker is not None
    kit.accept()
    kit.start()  # consumed; then owed again mid-stream, as startup recovery would
    kit.give(AdoptOwed(marker, kit.row_of(cut)))
    kit.error()
    assert kit.ended()[-1] == (cut, "withdrawn")
    assert (kit.machine.owes(), kit.state_of(cut)) == (False, CutState.WITHDRAWN)


def test_st5_r19_a_system_abort_withdraws_a_preparing_resume() -> None:
    kit = Kit()
    kit.stranded()
    kit.sweep()
    effects = kit.give(SyntheticAbort(AbortReason.SYSTEM))
    assert effects[0] == AbortResume()
    assert not kit.machine.owes()


def test_st5_as21_a_queued_message_synthetic_abort_leaves_a_preparing_resume_owed() -> None:
    kit = Kit()
    kit.stranded()
    kit.sweep()
    assert kit.give(SyntheticAbort(QUEUED)) == []
    assert kit.machine.owes()


# ---------------------------------------------------------------- ST-6 forfeiting


def test_st6_r27_discarding_the_history_forfeits() -> None:
    kit = Kit()
    cut = kit.stranded()
    kit.call(Discard())
    kit.run(FlushRecords())  # the session's discard writes the records in its task
    assert (kit.ended(), kit.state_of(cut)) == ([(cut, "forfeited")], CutState.FORFEITED)


# ---------------------------------------------------------------- ST-7 the sweep


def test_st7_the_sweep_starts_one_resume_and_is_idempotent() -> None:
    kit = Kit()
    cut = kit.stranded(remaining=3)
    kit.sweep()
    (start,) = kit.resumes
    assert (start.marker.cut, start.marker.step_budget, start.attempt) == (cut, 3, 1)
    assert kit.give(Sweep()) == []
    assert kit.give(SweepDue()) == []


def test_st7_r3_the_sweep_yields_to_a_manual_send_in_preflight_and_runs_when_it_fails() -> None:
    kit = Kit()
    kit.stranded()
    kit.call(DirectSend())
    kit.sweep()
    assert (kit.resumes, kit.machine.owes()) == ([], True)
    kit.run(SendWentNowhere(TurnInput(text="a typo")))  # the send failed validation
    kit.sweep()
    assert [r.attempt for r in kit.resumes] == [1]


def test_st7_the_sweep_resumes_nothing_while_a_turn_runs() -> None:
    kit = Kit()
    kit.cut(remaining=3)  # the cutter holds PREPARING
    assert kit.machine.owes()
    assert kit.give(Sweep()) == []


# ---------------------------------------------------------------- ST-8 the claim


def test_st8_r7_the_resume_claims_preparing_before_anything_is_awaited() -> None:
    kit = Kit()
    kit.stranded()
    marker = kit.machine.continuation.marker
    assert marker is not None
    effects = kit.give(SweepDue())
    assert effects == [phase(kit, Phase.IDLE, Phase.PREPARING), Next(ArmResume(marker, 1))]
    assert kit.machine.busy
    assert kit.give(ArmResume(marker, 1)) == [StartResume(marker, 1)]


# ---------------------------------------------------------------- ST-10 an attempt's outcomes


def test_st10_r4_r43_a_resume_failing_before_start_stays_owed_and_is_swept_again() -> None:
    kit = Kit()
    cut = kit.stranded()
    kit.sweep()
    kit.resume(fails=True)
    assert [(e.cut, e.attempt, e.outcome) for e in kit.of(ResumeAttempted)] == [(cut, 1, "failed")]
    assert (kit.machine.owes(), kit.machine.continuation.failed_attempts) == (True, 1)
    assert (kit.machine.phase, kit.sweep_due) == (Phase.IDLE, True)
    kit.sweep()
    assert [r.attempt for r in kit.resumes] == [2]


def test_st10_r21_the_cap_forfeits_instead_of_another_attempt() -> None:
    kit = Kit(cap=2)
    cut = kit.stranded()
    for _ in range(2):
        kit.sweep()
        kit.resume(fails=True)
    kit.sweep()
    assert (kit.resumes, kit.ended()) == ([], [(cut, "forfeited")])
    assert kit.state_of(cut) is CutState.FORFEITED


def test_st10_st6_an_admission_refusal_forfeits_with_no_retry() -> None:
    kit = Kit()
    cut = kit.stranded()
    kit.sweep()
    kit.resume()
    kit.refuse()
    assert [e.outcome for e in kit.of(ResumeAttempted)] == ["refused"]
    assert (kit.ended(), kit.state_of(cut)) == ([(cut, "forfeited")], CutState.FORFEITED)


def test_st10_a_withdrawn_attempt_is_the_end_of_it() -> None:
    kit = Kit()
    cut = kit.stranded()
    kit.sweep()
    kit.resume()
    kit.call(Stop())
    assert AbortResume() in kit.acted
    kit.withdrawn(AbortReason.SYSTEM)
    assert [e.outcome for e in kit.of(ResumeAttempted)] == ["withdrawn"]
    assert (kit.ended(), kit.state_of(cut)) == ([(cut, "withdrawn")], CutState.WITHDRAWN)
    assert kit.machine.continuation.failed_attempts == 0


def test_st11_r21_a_started_resume_resets_the_failed_attempt_count() -> None:
    kit = Kit(cap=2)
    kit.stranded()
    kit.sweep()
    kit.resume(fails=True)
    kit.sweep()
    kit.resume()
    kit.start()
    assert kit.machine.continuation.failed_attempts == 0
    assert [e.outcome for e in kit.of(ResumeAttempted)] == ["failed", "started"]


# ---------------------------------------------------------------- AS-1, AS-2 phases and the sweep


def test_as1_arriving_at_idle_expires_the_turns_thinking_holder() -> None:
    kit = Kit()
    kit.streaming()
    assert kit.machine.thinking is not None
    kit.end()
    assert kit.machine.phase is Phase.IDLE
    assert kit.machine.thinking is None


def test_as2_a_move_to_idle_schedules_the_sweep_once() -> None:
    kit = Kit()
    kit.queue(USER)
    effects = kit.give(ToIdleFrom((Phase.PREPARING,)))
    assert effects == [phase(kit, Phase.PREPARING, Phase.IDLE), ScheduleSweep()]
    assert kit.machine.sweep_scheduled
    assert kit.give(SweepWanted()) == []  # already scheduled: not twice


def test_as2_a_turn_that_ends_goes_completing_then_idle_and_sweeps() -> None:
    kit = Kit()
    kit.streaming()
    kit.forget()
    kit.end()
    assert kit.phases() == ["completing", "idle"]
    assert kit.acts(ScheduleSweep) == [ScheduleSweep()]


# ---------------------------------------------------------------- AS-13 the drain


def test_as13_the_drain_claims_preparing_at_the_dequeue() -> None:
    kit = Kit()
    entry = kit.add(USER)
    effects = kit.give(Queued())
    assert effects[:2] == [
        Emit(EntryDequeued(session=kit.session, entry=entry)),
        phase(kit, Phase.IDLE, Phase.PREPARING),
    ]
    (follow,) = effects[2:]
    assert isinstance(follow, Next)
    assert isinstance(follow.input, DispatchEntry)
    assert (follow.input.turn.entry_id, kit.machine.phase) == (entry, Phase.PREPARING)


def test_as13_a_withdrawn_head_is_canceled_then_the_next_entry_dispatches() -> None:
    kit = Kit()
    kit.streaming()
    first, second = kit.queue(USER), kit.queue(USER)
    kit.withdraw(first)
    kit.end()
    assert kit.accept() is None  # the withdrawn head cancels before acceptance
    assert [d.turn.entry_id for d in kit.dispatches] == [second]
    assert kit.machine.phase is Phase.PREPARING


def test_as13_an_idle_session_never_holds_a_queued_entry() -> None:
    kit = Kit()
    kit.streaming()
    waiting = kit.queue(USER)
    kit.call(Stop())  # a Stop that does not give the queue back
    kit.abort(AbortReason.USER)
    assert (kit.machine.phase, kit.dispatches, kit.sweep_due) == (Phase.IDLE, [], True)
    kit.sweep()
    assert [d.turn.entry_id for d in kit.dispatches] == [waiting]


# ---------------------------------------------------------------- AS-16 clear and remove


def test_as16_r23_a_hard_stop_clear_forfeits_before_the_callbacks_run() -> None:
    kit = Kit()
    cut = kit.stranded()
    kit.sweep()  # a resume is preparing: the session is busy, so an entry queues
    seen: list[bool] = []
    kit.queue(USER, on_canceled=lambda _: seen.append(kit.machine.owes()))
    kit.call(HardStop())
    assert seen == [False]
    assert (kit.ended(), kit.state_of(cut)) == ([(cut, "forfeited")], CutState.FORFEITED)
    assert AbortResume() in kit.acted


def test_as16_r32_removing_the_owed_turns_queued_wake_forfeits_first() -> None:
    kit = Kit()
    cut = kit.stranded(correlated=True)
    kit.sweep()
    seen: list[bool] = []
    kit.queue(WAKE, on_canceled=lambda _: seen.append(kit.machine.owes()))
    kit.call(Clear("cleared by the user", hard_stop=False))
    assert (seen, kit.ended()) == ([False], [(cut, "forfeited")])


def test_as16_r53_a_plain_clear_keeps_the_continuation_and_sweeps_after_the_callbacks() -> None:
    kit = Kit()
    kit.stranded(correlated=True)
    kit.sweep()
    kit.queue(USER)
    kit.forget()
    kit.call(Clear("cleared by the user", hard_stop=False))
    assert (kit.machine.owes(), kit.ended()) == (True, [])
    assert [type(a) for a in kit.acted] == [CancelRemoved, ScheduleSweep]


# ---------------------------------------------------------------- AS-18 send now


def test_as18_send_now_without_a_user_entry_changes_nothing() -> None:
    kit = Kit()
    kit.streaming()
    kit.queue(EntryKind.SYSTEM)
    kit.queue(WAKE)
    assert kit.give(SendNow()) == [Reply(False)]  # no stop, no abort, no withdrawal
    assert [e.kind for e in kit.machine.queue] == [EntryKind.SYSTEM, WAKE]  # order kept
    assert kit.machine.phase is Phase.STREAMING


def test_as18_send_now_interrupts_and_the_users_entry_goes_next() -> None:
    kit = Kit()
    kit.streaming()
    kit.queue(WAKE)
    user = kit.queue(USER)
    assert kit.call(SendNow()) is True
    assert kit.acts(StopStream) == [StopStream(AbortReason.USER)]
    kit.abort(AbortReason.USER)
    assert [d.turn.entry_id for d in kit.dispatches] == [user]


# ---------------------------------------------------------------- AS-27, AS-28 the soft stop


def test_as27_a_provider_result_soft_stops_for_a_queued_tool_end_entry_once() -> None:
    kit = Kit()
    kit.streaming()
    kit.queue(USER)
    assert kit.give(ToolEnded("call-1", provider=True)) == [StopStream(QUEUED, soft=True)]
    assert kit.give(ToolEnded("call-2", provider=True)) == []  # one soft stop per stream


def test_as27_no_soft_stop_for_a_turn_end_entry_or_with_a_client_call_running() -> None:
    kit = Kit()
    kit.streaming()
    kit.queue(USER, mode=DispatchMode.TURN_END)
    assert kit.give(ToolEnded("call-1", provider=True)) == []
    kit.queue(USER)
    kit.give(ToolStarted("client-call"))
    assert kit.give(ToolEnded("call-2", provider=True)) == []


def test_as28_st3_a_soft_stop_abort_owes_on_the_partial_and_dispatches_the_cutter() -> None:
    kit = Kit()
    stream = soft_stopped(kit)
    kit.abort(QUEUED, remaining=3)
    assert [(e.cut, e.remaining) for e in kit.of(ContinuationOwed)] == [(stream, 3)]
    assert kit.names().index("Persisted:cut") < kit.names().index("ContinuationOwed")
    assert kit.state_of(stream) is CutState.OWED
    assert [d.turn.kind for d in kit.dispatches] == [USER]


def test_as28_r22_a_hard_stop_landing_while_the_partial_is_written_owes_nothing() -> None:
    kit = Kit()
    stream = soft_stopped(kit)
    kit.during(lambda: kit.call(Stop()), part="rows")  # the flag is read again after the write
    kit.abort(QUEUED, remaining=3)
    assert (kit.machine.owes(), kit.of(ContinuationOwed), kit.dispatches) == (False, [], [])
    assert kit.state_of(stream) is CutState.VOIDED  # the record written for it is taken back


def test_as29_a_soft_stop_abort_after_a_user_stop_owes_and_dispatches_nothing() -> None:
    kit = Kit()
    soft_stopped(kit)
    kit.call(Stop())
    kit.abort(QUEUED, remaining=3)
    assert (kit.machine.owes(), kit.of(ContinuationOwed), kit.dispatches) == (False, [], [])


def test_as28_r46_a_satisfied_required_tool_owes_nothing() -> None:
    kit = Kit()
    stream = soft_stopped(kit)
    kit.abort(QUEUED, remaining=3, required_tool=True)
    assert (kit.machine.owes(), kit.of(ContinuationOwed)) == (False, [])
    assert [r.cut for r in kit.rows.values() if r.stream == stream] == [None]


def test_as28_r65_a_soft_stop_with_no_steps_left_owes_nothing() -> None:
    kit = Kit()
    stream = soft_stopped(kit)
    kit.abort(QUEUED, remaining=0)
    assert (kit.machine.owes(), kit.of(ContinuationOwed)) == (False, [])
    assert [r.cut for r in kit.rows.values() if r.stream == stream] == [None]


def test_as28_r29_an_unrelated_cutter_forfeits_a_correlated_continuation_first() -> None:
    kit = Kit()
    stream = soft_stopped(kit, correlated=True, cutter=USER)
    kit.forget()
    kit.abort(QUEUED, remaining=3)
    assert kit.ended() == [(stream, "forfeited")]
    assert kit.names()[1:] == [
        "Persisted:cut",
        "ContinuationOwed",
        "Persisted:cut-void",
        "ContinuationEnded",
        "EntryDequeued",
        "PhaseChanged",
    ]
    assert kit.state_of(stream) is CutState.FORFEITED


def test_as28_r56_a_wake_cutter_is_stamped_with_the_cut_streams_correlation() -> None:
    kit = Kit()
    soft_stopped(kit, correlated=True, cutter=WAKE)
    kit.abort(QUEUED, remaining=3)
    (dispatch,) = kit.dispatches
    assert (dispatch.turn.kind, dispatch.turn.correlation) == (WAKE, CORRELATION)
    assert kit.machine.owes()


# ---------------------------------------------------------------- AS-30 Stop


def test_as30_a_stop_withdraws_and_aborts_the_resume_before_it_stops_the_stream() -> None:
    kit = Kit()
    kit.stranded()
    kit.sweep()
    assert kit.give(Stop()) == [
        AbortResume(AbortReason.USER),  # the resume hears the user's reason too
        AbortPrepared(AbortReason.USER),
        StopStream(AbortReason.USER),
    ]
    assert not kit.machine.owes()


def test_as30_stop_then_restore_gives_the_users_text_back_and_cancels_the_rest() -> None:
    kit = Kit()
    kit.streaming()
    kit.queue(WAKE)
    kit.queue(USER)
    kit.call(Stop())
    assert kit.call(Restore()) == "entry 3"
    assert kit.machine.queue.is_empty
    assert len(kit.acts(CancelRemoved)) == 1


# ---------------------------------------------------------------- failed writes (PS-6, R60)


def test_ps6_a_withdrawal_whose_record_write_failed_is_told_only_once_the_sweep_wrote_it() -> None:
    kit = Kit()
    cut = kit.stranded()
    kit.call(Stop())
    kit.fail(part="cut_states")
    kit.call(Restore())
    assert (kit.failed, kit.ended(), kit.state_of(cut)) == (["cut record"], [], CutState.OWED)
    kit.sweep()  # failed record writes go first
    assert (kit.ended(), kit.state_of(cut)) == ([(cut, "withdrawn")], CutState.WITHDRAWN)
    assert kit.resumes == []


def test_r60_a_cut_whose_final_row_failed_owes_nothing_and_the_stream_fails() -> None:
    kit = Kit()
    kit.streaming()
    kit.queue(USER)
    kit.fail(what="final row")
    assert isinstance(kit.final(3, cut=True), WriteFailed)
    assert (kit.machine.owes(), kit.of(ContinuationOwed)) == (False, [])  # the cut never was
    kit.error(ErrorType.STORE_WRITE)
    assert (kit.ended(), kit.rows_of_kind(RowKind.ASSISTANT)) == ([], [])


def test_r60_a_soft_stop_cut_whose_partial_failed_owes_nothing_and_says_store_write() -> None:
    kit = Kit()
    soft_stopped(kit)
    kit.fail(part="rows")
    kit.abort(QUEUED, remaining=3)
    assert (kit.machine.owes(), kit.of(ContinuationOwed)) == (False, [])
    assert [e.type for e in kit.of(StreamFailed)] == ["store_write"]
    assert [d.turn.kind for d in kit.dispatches] == [USER]  # the queue goes on


def test_st4_r4_a_resume_whose_consumed_record_failed_is_still_owed() -> None:
    kit = Kit()
    cut = kit.stranded()
    kit.sweep()
    kit.resume()
    kit.fail(part="cut_states")
    assert isinstance(kit.start(), WriteFailed)  # no step of the stream may run
    assert (kit.machine.owes(), kit.state_of(cut), kit.ended()) == (True, CutState.OWED, [])
    assert [e.outcome for e in kit.of(ResumeAttempted)] == ["failed"]
