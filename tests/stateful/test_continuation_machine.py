"""A hypothesis state machine over the owed-continuation bookkeeping (the ST rules).

The machine drives the pure functions of ``agent_session._continuation`` the way the session
machine (``_machine``) does, beside a small model of the session: its phase (moved through
``next_phase``, so every move respects the phase table), who holds PREPARING (a manual send, a
dequeued entry or a resume), the queue's length, manual sends in preflight, external follow-ups,
disposal, and a log of every cut and how it ended. The model decides what *should* be owed; the
invariants compare it with what the bookkeeping says and with what ``plan_sweep`` plans:

1. a cut is consumed only by a stream that reached STREAMING while it was owed (ST-4, R64);
2. the sweep is idempotent and deterministic (ST-7, STYLE.md 9);
3. at most one resume is in flight, and no resume is planned while one is (ST-7, R7);
4. an idle session never loses an unanswered cut (ST-2, R4);
5. failed attempts stay within the cap, forfeit exactly at it, reset on consumption (R21, ST-11);
6. consumed cuts are bounded and keep the newest (R33);
7. no resume while the queue, a manual send, the phase or disposal says no (ST-7, R3).

Focused example and property tests for the same rules follow the machine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from agent_session._continuation import (
    CONSUMED_CUTS_BOUND,
    RESUME_FAILED_ATTEMPT_CAP,
    Continuation,
    ForfeitAtCap,
    Marker,
    Nothing,
    StartResume,
    SweepAction,
    SweepSnapshot,
    apply_sweep,
    begin_resume,
    consume,
    drop,
    owe,
    plan_sweep,
    resume_failed,
    resume_settled,
)
from agent_session._phases import Phase, next_phase
from stream_manager import ModelFallbackProgress

CAP = RESUME_FAILED_ATTEMPT_CAP


def make_marker(cut: str, budget: int = 3) -> Marker:
    return Marker(
        cut=cut,
        model="model-a",
        step_budget=budget,
        progress=ModelFallbackProgress(requested_model="model-a"),
    )


class Holder(StrEnum):
    """Who claimed PREPARING."""

    SEND = "manual send"
    DEQUEUED = "dequeued entry"
    RESUME = "resume"


class Fate(StrEnum):
    """What happened to a cut, as the model expects it."""

    OWED = "owed"
    NO_MARKER = "no marker (zero remainder, R65)"
    CONSUMED = "consumed"
    WITHDRAWN = "withdrawn"
    FORFEITED = "forfeited"
    VOIDED = "voided"
    FORFEITED_AT_CAP = "forfeited at the cap"


@dataclass
class Cut:
    id: str
    remainder: int
    fate: Fate


class ContinuationMachine(RuleBasedStateMachine):
    """The session shell's use of the continuation bookkeeping, against a model."""

    def __init__(self) -> None:
        super().__init__()
        self.cont = Continuation()
        # the session model
        self.phase = Phase.IDLE
        self.holder: Holder | None = None
        self.disposed = False
        self.queue_len = 0
        self.preflight = 0
        self.external = 0
        self.stream_cut = False  # SM-8: a stream reports at most one cut
        # the expected bookkeeping
        self.cuts: dict[str, Cut] = {}
        self.markers: dict[str, Marker] = {}
        self.owed: str | None = None
        self.failed = 0
        self.attempts = 0
        self.consumed_order: list[str] = []
        self.streamed_while_owed: set[str] = set()
        self.counter = 0

    @initialize(earlier=st.integers(0, CONSUMED_CUTS_BOUND), remainder=st.integers(0, 8))
    def earlier_turns(self, earlier: int, remainder: int) -> None:
        """Start from a history: ``earlier`` cuts already resumed (so R33's bound is within
        reach), then a turn cut with ``remainder`` left whose queued entry canceled before
        acceptance (R64), leaving the session IDLE and, for a remainder >= 1, owing.
        """
        for n in range(earlier):
            cut = f"old{n}"
            self.cont, _ = owe(self.cont, make_marker(cut))
            self.cont, _ = consume(self.cont)
            self.cuts[cut] = Cut(cut, 3, Fate.CONSUMED)
            self.markers[cut] = make_marker(cut)
            self.streamed_while_owed.add(cut)
            self.consumed_order.append(cut)
        self.queue_entry()
        self.drain_entry()
        self.stream_reaches_streaming()
        self.cut_at_tool_boundary(remainder, soft=False)
        self.drain_entry()
        self.dequeued_entry_cancels_before_acceptance()

    # ------------------------------------------------------------ helpers

    def _move(self, to: Phase) -> None:
        self.phase = next_phase("machine", self.phase, to)  # raises on a move the table forbids

    def _snapshot(self) -> SweepSnapshot:
        return SweepSnapshot(
            disposed=self.disposed,
            phase=self.phase,
            queue_empty=self.queue_len == 0,
            manual_in_preflight=self.preflight,
            external_follow_ups=self.external,
        )

    def _describe(self) -> str:
        return (
            f"phase={self.phase} holder={self.holder} disposed={self.disposed} "
            f"queue={self.queue_len} preflight={self.preflight} external={self.external} "
            f"model(owed={self.owed} failed={self.failed} attempts={self.attempts}) "
            f"bookkeeping={self.cont!r}"
        )

    @property
    def resume_in_flight(self) -> bool:
        return self.holder is Holder.RESUME

    def _blockers(self) -> list[str]:
        """ST-7, R3: what stops the sweep from starting a resume, besides the bookkeeping."""
        found = []
        if self.disposed:
            found.append("disposed")
        if self.phase is not Phase.IDLE:
            found.append(f"phase {self.phase}")
        if self.queue_len:
            found.append(f"{self.queue_len} queued")
        if self.preflight:
            found.append("manual send in preflight")
        if self.external:
            found.append("external follow-up")
        return found

    def _expected_plan(self) -> SweepAction:
        """The sweep's answer, computed from the model alone."""
        if self.owed is None:
            return Nothing("nothing owed")
        if self._blockers():
            return Nothing("blocked")
        if self.resume_in_flight:
            return Nothing("a resume is in flight")
        marker = self.markers[self.owed]
        if self.failed >= CAP:
            return ForfeitAtCap(marker, self.failed)
        return StartResume(marker, self.attempts + 1)

    def _end_owed(self, fate: Fate, ended: Marker | None) -> None:
        """The shell withdrew, forfeited or voided: ``drop`` returned ``ended``."""
        expected = self.markers[self.owed] if self.owed is not None else None
        assert ended == expected, f"drop returned {ended!r}, the model owed {expected!r}"
        if self.owed is not None:
            self.cuts[self.owed].fate = fate
        self.owed = None
        self.failed = self.attempts = 0

    def _drop(self, fate: Fate) -> None:
        self.cont, ended = drop(self.cont)
        self._end_owed(fate, ended)

    # ------------------------------------------------------------ cuts and streams

    @precondition(lambda self: self.phase is Phase.STREAMING and not self.stream_cut)
    @rule(remainder=st.integers(0, 8), soft=st.booleans())
    def cut_at_tool_boundary(self, remainder: int, soft: bool) -> None:
        """ST-2 (the stop report, still STREAMING) or ST-3 (the abort handler, COMPLETING).

        A cut is made for a live queued entry; if none is queued yet, it arrives now.
        """
        self.counter += 1
        cut = f"cut{self.counter}"
        self.stream_cut = True
        self.queue_len = max(self.queue_len, 1)
        if soft:
            self._move(Phase.COMPLETING)
        marker = make_marker(cut, remainder)
        if remainder <= 0:
            # R65: the shell owes nothing, and the bookkeeping refuses a zero-budget marker.
            with pytest.raises(ValueError, match="R65"):
                owe(self.cont, marker)
            self.cuts[cut] = Cut(cut, remainder, Fate.NO_MARKER)
        else:
            before = self.cont
            self.cont, previous = owe(self.cont, marker)
            expected = self.markers[self.owed] if self.owed is not None else None
            assert previous == expected, f"owe replaced {previous!r}, the model owed {expected!r}"
            assert self.cont.consumed == before.consumed, "owe must not touch consumed cuts"
            self.cuts[cut] = Cut(cut, remainder, Fate.OWED)
            self.markers[cut] = marker
            self.owed = cut
            self.failed = self.attempts = 0
        if not soft:
            self._move(Phase.COMPLETING)  # the cut stream ends

    @precondition(lambda self: self.phase is Phase.PREPARING)
    @rule()
    def stream_reaches_streaming(self) -> None:
        """ST-4: any stream that reaches STREAMING consumes, whoever started it."""
        if self.owed is not None:
            self.streamed_while_owed.add(self.owed)
        self._move(Phase.STREAMING)
        self.cont, ended = consume(self.cont)
        expected = self.markers[self.owed] if self.owed is not None else None
        assert ended == expected, f"consume returned {ended!r}, the model owed {expected!r}"
        if self.owed is not None:
            self.cuts[self.owed].fate = Fate.CONSUMED
            self.consumed_order.append(self.owed)
        self.owed = None
        self.failed = self.attempts = 0
        self.holder = None  # a started resume is settled by its consumption
        self.stream_cut = False

    @precondition(lambda self: self.phase is Phase.STREAMING)
    @rule()
    def stream_ends(self) -> None:
        self._move(Phase.COMPLETING)

    @precondition(lambda self: self.phase is Phase.COMPLETING)
    @rule()
    def completing_goes_idle(self) -> None:
        self._move(Phase.IDLE)

    @precondition(
        lambda self: (
            self.queue_len > 0
            and (
                self.phase is Phase.COMPLETING or (self.phase is Phase.IDLE and self.preflight == 0)
            )
        )
    )
    @rule()
    def drain_entry(self) -> None:
        """AS-13: the drain dequeues the head and claims PREPARING for it."""
        self.queue_len -= 1
        self._move(Phase.PREPARING)
        self.holder = Holder.DEQUEUED

    @precondition(lambda self: self.phase is Phase.PREPARING and self.holder is Holder.DEQUEUED)
    @rule()
    def dequeued_entry_cancels_before_acceptance(self) -> None:
        """R64: no stream started, so nothing is consumed: the bookkeeping is not called."""
        self.holder = None
        self._move(Phase.IDLE)

    @precondition(
        lambda self: self.phase is Phase.PREPARING and self.holder in (Holder.SEND, Holder.DEQUEUED)
    )
    @rule()
    def send_refused_before_stream(self) -> None:
        """AS-10: a send or dequeued entry refused before its stream; the marker stays."""
        self.holder = None
        self._move(Phase.IDLE)

    # ------------------------------------------------------------ ending the marker

    # One rule for the three endings keeps them from crowding out the paths to a resume.
    @precondition(lambda self: not self.disposed)
    @rule(
        how=st.sampled_from(
            [
                "withdraw",  # ST-5: Stop, an edit, a non-continuation send, a stream error
                "forfeit: history discarded",  # ST-6, R27
                "forfeit: hard-stop clear",  # ST-6, R23
                "forfeit: continuation removed",  # ST-6, R32
                "void",  # ST-15: the owner's binding "no" for exactly the owed cut
            ]
        )
    )
    def withdraw_forfeit_or_void(self, how: str) -> None:
        if how == "void":
            if self.owed is None:
                return  # a "no" for a cut that is not owed drops nothing
            self._drop(Fate.VOIDED)
        elif how == "withdraw":
            self._drop(Fate.WITHDRAWN)
        else:
            self._drop(Fate.FORFEITED)
        if how == "forfeit: hard-stop clear":
            self.queue_len = 0
        elif how == "forfeit: continuation removed" and self.queue_len:
            self.queue_len -= 1

    @precondition(lambda self: not self.disposed and self.counter >= 2)
    @rule()
    def dispose(self) -> None:
        """AS-31, R27: forfeit, clear the queue, DISPOSED; an in-flight resume settles later.

        Only after two cuts: disposal ends a run, so it waits for a history worth checking.
        """
        self._drop(Fate.FORFEITED)
        self.queue_len = 0
        self._move(Phase.DISPOSED)
        self.disposed = True

    # ------------------------------------------------------------ the sweep and resumes

    @rule()
    def sweep(self) -> None:
        """ST-7: the sweep may run at any moment; it must plan only what its inputs allow."""
        snapshot = self._snapshot()
        action = plan_sweep(self.cont, snapshot, CAP)
        expected = self._expected_plan()
        assert type(action) is type(expected), (
            f"planned {action!r}, expected {expected!r}; {self._describe()}"
        )
        if isinstance(action, StartResume):
            assert action == expected, f"planned {action!r}, expected {expected!r}"
            assert not self.resume_in_flight, "a second resume while one is in flight"
            self.cont = apply_sweep(self.cont, action)
            self._move(Phase.PREPARING)  # R7: claimed before any await
            self.holder = Holder.RESUME
            self.attempts += 1
        elif isinstance(action, ForfeitAtCap):
            assert action == expected, f"planned {action!r}, expected {expected!r}"
            after = apply_sweep(self.cont, action)
            self.cont, ended = drop(self.cont)  # what the turn machine's _end does
            assert after == self.cont, "apply_sweep(ForfeitAtCap) must equal drop"
            self._end_owed(Fate.FORFEITED_AT_CAP, ended)
        else:
            assert apply_sweep(self.cont, action) == self.cont, "Nothing must change nothing"

    def _fail_resume(self) -> None:
        self.cont = resume_failed(self.cont)
        self.holder = None
        if self.owed is not None:
            self.failed += 1
        if not self.disposed:
            self._move(Phase.IDLE)

    @precondition(lambda self: self.holder is Holder.RESUME)
    @rule(repeats=st.integers(0, CAP))
    def resume_fails_before_start(self, repeats: int) -> None:
        """ST-10, R4, R21: owed still, counted; back to IDLE and swept again (R43).

        The shell schedules that sweep at once; ``repeats`` times it runs before anything
        else happens and its resume fails the same way, which walks a marker up to the cap.
        """
        self._fail_resume()
        for _ in range(repeats):
            self.sweep()
            if self.holder is not Holder.RESUME:
                break
            self._fail_resume()

    @precondition(lambda self: self.holder is Holder.RESUME)
    @rule()
    def resume_refused(self) -> None:
        """ST-10: admission refused: settled, then forfeited (ST-6), not retried."""
        self.cont = resume_settled(self.cont)
        self.holder = None
        self._drop(Fate.FORFEITED)
        if not self.disposed:
            self._move(Phase.IDLE)

    @precondition(lambda self: self.holder is Holder.RESUME)
    @rule()
    def resume_withdrawn(self) -> None:
        """ST-10: withdrawn or aborted before start; the withdrawer owns the marker."""
        self.cont = resume_settled(self.cont)
        self.holder = None
        if not self.disposed:
            self._move(Phase.IDLE)

    # ------------------------------------------------------------ the queue and manual sends

    @precondition(lambda self: not self.disposed and self.queue_len < 2)
    @rule()
    def queue_entry(self) -> None:
        self.queue_len += 1

    @precondition(lambda self: not self.disposed and self.queue_len > 0)
    @rule()
    def remove_entry(self) -> None:
        """AS-16: a removal by dedupe key or restore; the sweep runs after it."""
        self.queue_len -= 1

    @precondition(lambda self: self.phase is Phase.IDLE and self.preflight == 0)
    @rule()
    def manual_send_enters_preflight(self) -> None:
        self.preflight += 1

    @precondition(lambda self: self.phase is Phase.IDLE and self.preflight > 0)
    @rule()
    def manual_send_claims(self) -> None:
        self.preflight -= 1
        self._move(Phase.PREPARING)
        self.holder = Holder.SEND

    @precondition(lambda self: self.preflight > 0)
    @rule()
    def manual_send_fails_in_preflight(self) -> None:
        self.preflight -= 1  # R3: the sweep runs again

    @precondition(lambda self: not self.disposed or self.external > 0)
    @rule()
    def external_follow_up_toggles(self) -> None:
        """R3: a registered external manual follow-up holds the sweep off like a preflight."""
        self.external = 0 if self.external else 1

    # ------------------------------------------------------------ invariants

    @invariant()
    def bookkeeping_matches_the_model(self) -> None:
        expected = self.markers[self.owed] if self.owed is not None else None
        assert self.cont.marker == expected, (
            f"marker {self.cont.marker!r}, the model owes {expected!r}; {self._describe()}"
        )
        assert self.cont.attempts == self.attempts, f"attempts drifted; {self._describe()}"
        assert self.preflight == 0 or self.disposed or self.phase is Phase.IDLE

    @invariant()
    def inv1_consumed_only_by_a_stream_that_reached_streaming(self) -> None:
        for cut in self.cont.consumed:
            assert cut in self.streamed_while_owed, (
                f"{cut} is in consumed, but no stream reached STREAMING while it was owed "
                f"(it was {self.cuts.get(cut)}) (ST-4, R64); {self._describe()}"
            )
            assert self.cuts[cut].fate is Fate.CONSUMED, f"{cut} consumed and {self.cuts[cut]}"

    @invariant()
    def inv2_sweep_is_idempotent(self) -> None:
        snapshot = self._snapshot()
        first = plan_sweep(self.cont, snapshot, CAP)
        assert plan_sweep(self.cont, snapshot, CAP) == first, "plan_sweep is not deterministic"
        after = apply_sweep(self.cont, first)
        claimed = snapshot
        if isinstance(first, StartResume):
            claimed = dataclasses.replace(snapshot, phase=Phase.PREPARING)
        again = plan_sweep(after, claimed, CAP)
        assert isinstance(again, Nothing), (
            f"sweeping after {first!r} planned {again!r} (ST-7); {self._describe()}"
        )
        again_same_phase = plan_sweep(after, snapshot, CAP)
        assert isinstance(again_same_phase, Nothing), (
            f"after {first!r} the bookkeeping alone must block a second start (R7), "
            f"planned {again_same_phase!r}"
        )

    @invariant()
    def inv3_at_most_one_resume_in_flight(self) -> None:
        assert self.cont.resume_in_flight == self.resume_in_flight, (
            f"resume_in_flight={self.cont.resume_in_flight}, the model has "
            f"{self.holder} holding the turn; {self._describe()}"
        )
        if self.cont.resume_in_flight:
            planned = plan_sweep(self.cont, self._snapshot(), CAP)
            assert not isinstance(planned, StartResume), "a resume planned while one is in flight"

    @invariant()
    def inv4_idle_session_never_loses_an_unanswered_cut(self) -> None:
        unanswered = [c.id for c in self.cuts.values() if c.fate is Fate.OWED]
        assert len(unanswered) <= 1, f"several cuts owed at once: {unanswered}"
        if self.phase is not Phase.IDLE or self.disposed:
            return
        for cut in unanswered:
            marker = self.cont.marker
            assert (marker is not None and marker.cut == cut) or self.cont.resume_in_flight, (
                f"{cut} is unanswered in an idle session but neither owed nor resuming "
                f"(ST-2, R4); {self._describe()}"
            )

    @invariant()
    def inv5_failed_attempts_within_the_cap(self) -> None:
        state = self.cont
        assert state.failed_attempts <= CAP, f"{state.failed_attempts} > cap {CAP} (R21)"
        assert state.failed_attempts == self.failed, (
            f"failed_attempts={state.failed_attempts}, the model counted {self.failed} "
            f"(R21: only pre-start failures count, any started stream resets); {self._describe()}"
        )
        planned = plan_sweep(state, self._snapshot(), CAP)
        at_cap = (
            state.marker is not None
            and not self._blockers()
            and not state.resume_in_flight
            and state.failed_attempts >= CAP
        )
        assert isinstance(planned, ForfeitAtCap) == at_cap, (
            f"planned {planned!r}; the cap {'is' if at_cap else 'is not'} due (R21); "
            f"{self._describe()}"
        )

    @invariant()
    def inv6_consumed_cuts_bounded_newest_kept(self) -> None:
        consumed = self.cont.consumed
        assert len(consumed) <= CONSUMED_CUTS_BOUND, f"{len(consumed)} consumed cuts kept (R33)"
        newest = tuple(self.consumed_order[-CONSUMED_CUTS_BOUND:])
        assert consumed == newest, f"consumed {consumed}, expected the newest {newest} (R33)"

    @invariant()
    def inv7_no_resume_while_blocked(self) -> None:
        planned = plan_sweep(self.cont, self._snapshot(), CAP)
        blockers = self._blockers()
        if blockers:
            assert isinstance(planned, Nothing), (
                f"planned {planned!r} although {blockers} (ST-7, R3); {self._describe()}"
            )
        expected = self._expected_plan()
        assert type(planned) is type(expected), f"planned {planned!r}, expected {expected!r}"


def test_st7_st4_st10_r21_r64_continuation_bookkeeping_machine() -> None:
    run_state_machine_as_test(
        ContinuationMachine, settings=settings(max_examples=500, stateful_step_count=50)
    )


# ---------------------------------------------------------------- strategies

cut_ids = st.sampled_from([f"c{n}" for n in range(24)])
markers = st.builds(
    Marker,
    cut=cut_ids,
    model=st.sampled_from(["model-a", "model-b"]),
    step_budget=st.integers(1, 8),
    progress=st.builds(ModelFallbackProgress, requested_model=st.sampled_from(["model-a"])),
)
continuations = st.builds(
    Continuation,
    marker=st.none() | markers,
    failed_attempts=st.integers(0, CAP + 1),
    attempts=st.integers(0, CAP + 2),
    consumed=st.lists(cut_ids, max_size=CONSUMED_CUTS_BOUND, unique=True).map(tuple),
    resume_in_flight=st.booleans(),
)
snapshots = st.builds(
    SweepSnapshot,
    disposed=st.booleans(),
    phase=st.sampled_from(list(Phase)),
    queue_empty=st.booleans(),
    manual_in_preflight=st.integers(0, 2),
    external_follow_ups=st.integers(0, 2),
)


def _clear(snapshot: SweepSnapshot) -> bool:
    return (
        not snapshot.disposed
        and snapshot.phase is Phase.IDLE
        and snapshot.queue_empty
        and not snapshot.manual_in_preflight
        and not snapshot.external_follow_ups
    )


# ---------------------------------------------------------------- focused tests


@settings(max_examples=1_000)
@given(state=continuations, snapshot=snapshots, cap=st.integers(1, 4))
def test_st7_sweep_is_idempotent_property(
    state: Continuation, snapshot: SweepSnapshot, cap: int
) -> None:
    first = plan_sweep(state, snapshot, cap)
    assert plan_sweep(state, snapshot, cap) == first
    after = apply_sweep(state, first)
    claimed = snapshot
    if isinstance(first, StartResume):
        claimed = dataclasses.replace(snapshot, phase=Phase.PREPARING)  # the shell's side
    assert isinstance(plan_sweep(after, claimed, cap), Nothing), f"{first!r} then again"
    # R7: the claim is in the bookkeeping too, so even before the phase moves nothing repeats.
    assert isinstance(plan_sweep(after, snapshot, cap), Nothing)


@settings(max_examples=1_000)
@given(state=continuations, snapshot=snapshots, cap=st.integers(1, 4))
def test_st7_r3_r21_sweep_plans_exactly_by_its_preconditions(
    state: Continuation, snapshot: SweepSnapshot, cap: int
) -> None:
    planned = plan_sweep(state, snapshot, cap)
    marker = state.marker
    if marker is None or not _clear(snapshot) or state.resume_in_flight:
        assert isinstance(planned, Nothing), f"{planned!r} while not due (ST-7, R3)"
    elif state.failed_attempts >= cap:
        assert planned == ForfeitAtCap(marker, state.failed_attempts)
    else:
        assert planned == StartResume(marker, state.attempts + 1)


def test_st4_consumption_resets_failed_attempts() -> None:
    state, _ = owe(Continuation(), make_marker("c1"))
    idle = SweepSnapshot(disposed=False, phase=Phase.IDLE, queue_empty=True)
    for _ in range(CAP - 1):
        action = plan_sweep(state, idle, CAP)
        assert isinstance(action, StartResume)
        state = resume_failed(apply_sweep(state, action))
    assert state.failed_attempts == CAP - 1
    assert state.attempts == CAP - 1
    state, consumed = consume(state)  # an unrelated stream reached STREAMING (ST-4)
    assert consumed == make_marker("c1")
    assert state == Continuation(consumed=("c1",))
    state, _ = owe(state, make_marker("c2"))
    assert plan_sweep(state, idle, CAP) == StartResume(make_marker("c2"), 1)


def test_r21_st11_every_legitimate_stranding_resumes() -> None:
    """R21: four strandings of one turn, each with failures below the cap, all resume."""
    idle = SweepSnapshot(disposed=False, phase=Phase.IDLE, queue_empty=True)
    state = Continuation()
    for n in range(4):
        state, _ = owe(state, make_marker(f"c{n}"))
        for _ in range(CAP - 1):
            action = plan_sweep(state, idle, CAP)
            assert isinstance(action, StartResume)
            state = resume_failed(apply_sweep(state, action))
        action = plan_sweep(state, idle, CAP)
        assert isinstance(action, StartResume), f"stranding {n}: {action!r}"
        state, _ = consume(apply_sweep(state, action))
        assert state.failed_attempts == 0
        assert not state.resume_in_flight
    assert state.consumed == ("c0", "c1", "c2", "c3")


def test_r4_r43_r21_r10_failed_resumes_stay_owed_until_the_cap() -> None:
    idle = SweepSnapshot(disposed=False, phase=Phase.IDLE, queue_empty=True)
    state, _ = owe(Continuation(), make_marker("c1"))
    for attempt in range(1, CAP + 1):
        action = plan_sweep(state, idle, CAP)  # R43: swept again right away, no other poke
        assert action == StartResume(make_marker("c1"), attempt)
        state = resume_failed(apply_sweep(state, action))
        assert state.marker == make_marker("c1"), "R4: still owed after a pre-start failure"
        assert not state.resume_in_flight
    action = plan_sweep(state, idle, CAP)
    assert action == ForfeitAtCap(make_marker("c1"), CAP)
    state = apply_sweep(state, action)
    assert state.marker is None
    assert "c1" not in state.consumed, "R10: a forfeited cut never answers a claim"
    assert plan_sweep(state, idle, CAP) == Nothing("nothing owed")


def test_r7_st8_claimed_resume_blocks_a_second_start_before_the_phase_moves() -> None:
    idle = SweepSnapshot(disposed=False, phase=Phase.IDLE, queue_empty=True)
    state, _ = owe(Continuation(), make_marker("c1"))
    action = plan_sweep(state, idle, CAP)
    assert isinstance(action, StartResume)
    state = apply_sweep(state, action)
    assert state == begin_resume(owe(Continuation(), make_marker("c1"))[0])
    assert plan_sweep(state, idle, CAP) == Nothing("a resume is in flight")
    state = resume_settled(state)  # withdrawn before start: the marker stays with its owner
    assert plan_sweep(state, idle, CAP) == StartResume(make_marker("c1"), 2)


def test_r64_a_dequeue_that_cancels_leaves_the_marker_for_the_sweep() -> None:
    state, _ = owe(Continuation(), make_marker("c1"))
    preparing = SweepSnapshot(disposed=False, phase=Phase.PREPARING, queue_empty=True)
    assert isinstance(plan_sweep(state, preparing, CAP), Nothing)
    # the dequeued entry cancels before acceptance: no stream, so no consume() call
    idle = dataclasses.replace(preparing, phase=Phase.IDLE)
    assert plan_sweep(state, idle, CAP) == StartResume(make_marker("c1"), 1)


def test_st2_a_new_cut_replaces_the_owed_one_with_fresh_counters() -> None:
    state, _ = owe(Continuation(consumed=("c0",)), make_marker("c1"))
    state = resume_failed(begin_resume(state))
    state = begin_resume(state)
    assert (state.failed_attempts, state.attempts) == (1, 2)
    state, replaced = owe(state, make_marker("c2"))
    assert replaced == make_marker("c1")
    assert state == Continuation(marker=make_marker("c2"), consumed=("c0",), resume_in_flight=True)


@pytest.mark.parametrize("budget", [0, -1])
def test_r65_zero_remainder_owes_nothing(budget: int) -> None:
    previous, _ = owe(Continuation(), make_marker("c1"))
    with pytest.raises(ValueError, match="R65"):
        owe(previous, make_marker("c2", budget))
    assert previous.marker == make_marker("c1"), "a refused cut leaves the owed one alone"
    state, replaced = owe(previous, make_marker("c2", 1))
    assert replaced == make_marker("c1")
    assert state.marker == make_marker("c2", 1)


def test_r33_consumed_cuts_are_bounded_fifo() -> None:
    state = Continuation()
    total = CONSUMED_CUTS_BOUND + 5
    for n in range(total):
        state, _ = owe(state, make_marker(f"c{n}"))
        state, _ = consume(state)
        state, nothing = consume(state)  # a stream with nothing owed adds nothing
        assert nothing is None
    assert CONSUMED_CUTS_BOUND >= 4
    assert state.consumed == tuple(f"c{n}" for n in range(5, total))
    state, _ = drop(owe(state, make_marker("gone"))[0])
    assert "gone" not in state.consumed, "only consumption makes a cut claimable (R33)"
