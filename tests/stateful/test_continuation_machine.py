"""Properties and examples of the owed-continuation bookkeeping (``agent_session._continuation``).

The pure functions the turn machine uses (``owe``, ``consume``, ``drop``, ``plan_sweep`` and
their friends), tested over generated states and snapshots: the sweep is deterministic and
idempotent, plans exactly by its preconditions (ST-7, R3, R21), and the examples below pin
the rules one at a time. The machine that uses them is driven as a whole, by hypothesis, in
``test_turn_machine.py``.
"""

from __future__ import annotations

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import given, settings

from agent_session._continuation import (
    CONSUMED_CUTS_BOUND,
    RESUME_FAILED_ATTEMPT_CAP,
    Continuation,
    ForfeitAtCap,
    Marker,
    Nothing,
    StartResume,
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
from agent_session._phases import Phase
from stream_manager import ModelFallbackProgress

CAP = RESUME_FAILED_ATTEMPT_CAP


def make_marker(cut: str, budget: int = 3) -> Marker:
    return Marker(
        cut=cut,
        model="model-a",
        step_budget=budget,
        progress=ModelFallbackProgress(requested_model="model-a"),
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
        claimed = msgspec.structs.replace(snapshot, phase=Phase.PREPARING)  # the shell's side
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
    idle = msgspec.structs.replace(preparing, phase=Phase.IDLE)
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
