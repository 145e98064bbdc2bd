"""Stream registration, launch and stops: SM-1 to SM-4 and SM-10 to SM-14, R16.

Synchronisation is by gates (``anyio.Event``) and ``wait_all_tasks_blocked``, never by sleeping.
"""

from __future__ import annotations

import anyio
import pytest

from stream_manager import (
    Aborted,
    AbortMetadata,
    AbortReason,
    AbortSignal,
    Ended,
    LaunchRefused,
    ModelFallbackProgress,
    Refused,
    ScriptStep,
    ScriptToolCall,
    StreamAborted,
    StreamInfo,
    StreamStarted,
    StreamState,
    ToolCallEnded,
    ToolCallPart,
    Withdrawn,
)
from tests.stream_manager.support import REFUSE, T_, FakeTool, Host, P, Rig, X, rig

HANG = ScriptStep(text="thinking", hang=True)


# ---------------------------------------------------------------- SM-1


async def test_sm1_a_new_start_stops_the_running_stream_first() -> None:
    r = rig({"M": [HANG, X("second")]})
    outcomes: list[object] = []

    async def first() -> None:
        outcomes.append(await r.manager.start_stream(r.request()))

    async with anyio.create_task_group() as group:
        group.start_soon(first)
        await anyio.wait_all_tasks_blocked()
        assert r.manager.stream_state("s1") is StreamState.STREAMING
        outcomes.append(await r.manager.start_stream(r.request()))

    aborted, ended = outcomes
    assert isinstance(aborted, Aborted)
    assert aborted.reason is AbortReason.SYSTEM
    assert isinstance(ended, Ended)
    names = r.recorder.names()
    # the first stream's abort comes before the second's start: they never overlap
    assert names.index("stream-abort") < [i for i, n in enumerate(names) if n == "stream-start"][1]


async def test_sm1_start_calls_are_serialized() -> None:
    gate = anyio.Event()
    entered: list[str] = []

    async def envelope(info: StreamInfo) -> None:
        entered.append(info.stream)
        await gate.wait()

    r = rig({"M": [X("one"), X("two")]})
    results: list[object] = []

    async def start(stream_id: str) -> None:
        results.append(
            await r.manager.start_stream(
                r.request(stream_id=stream_id, host=Host(envelope=envelope))
            )
        )

    async with anyio.create_task_group() as group:
        group.start_soon(start, "first")
        await anyio.wait_all_tasks_blocked()
        group.start_soon(start, "second")
        await anyio.wait_all_tasks_blocked()
        # the second launch replaced the first's registration only after the first registered
        assert entered == ["first", "second"]
        gate.set()
    withdrawn = [o for o in results if isinstance(o, Withdrawn)]
    ended = [o for o in results if isinstance(o, Ended)]
    assert len(withdrawn) == 1  # the first lost its slot while its envelope was awaited
    assert withdrawn[0].reason is AbortReason.SYSTEM  # the replacing launch stopped it
    assert [e.stream for e in ended] == ["second"]
    assert len(r.recorder.of(StreamStarted)) == 1


async def test_sm1_the_serializing_lock_lives_only_while_a_start_holds_or_waits_for_it() -> None:
    r = rig({"M": [X("one"), X("two")]})
    await r.manager.start_stream(r.request())
    assert r.manager._locks == {}  # an idle session keeps no lock
    await r.manager.start_stream(r.request())  # and a later start makes a fresh one
    assert r.manager._locks == {}
    assert len(r.recorder.of(StreamStarted)) == 2


# ---------------------------------------------------------------- SM-2 / SM-3 / SM-4


async def test_sm2_abort_before_registration_starts_nothing() -> None:
    token = AbortSignal()
    token.fire(AbortReason.USER)
    r = rig({"M": [X()]})
    outcome = await r.manager.start_stream(r.request(abort=token))
    assert isinstance(outcome, Withdrawn)
    assert outcome.reason is AbortReason.USER
    assert r.recorder.of(StreamStarted) == []
    assert r.manager.active_stream_id("s1") is None
    assert r.models["M"].requests == []


def test_sm2_the_abort_signal_fires_once_with_a_typed_reason() -> None:
    signal = AbortSignal()
    heard: list[AbortReason] = []
    signal.add_listener(heard.append)
    assert (signal.fired, signal.reason) == (False, None)
    assert signal.fire(AbortReason.QUEUED_MESSAGE) is True
    assert signal.fire(AbortReason.USER) is False  # the first fire wins
    assert (signal.fired, signal.reason) == (True, AbortReason.QUEUED_MESSAGE)
    signal.add_listener(heard.append)  # already fired: called at once
    assert heard == [AbortReason.QUEUED_MESSAGE, AbortReason.QUEUED_MESSAGE]
    removed = AbortSignal()
    removed.add_listener(heard.append)
    removed.remove_listener(heard.append)
    removed.fire(AbortReason.STARTUP)
    assert len(heard) == 2


async def test_sm2_abort_during_the_envelope_write_starts_nothing() -> None:
    """Aborted while the envelope is awaited, before registration: no stream-start, deregistered."""
    token = AbortSignal()

    async def envelope(info: StreamInfo) -> None:
        assert r.manager.stream_state("s1") is StreamState.STARTING
        token.fire(AbortReason.USER)
        await anyio.lowlevel.checkpoint()

    r = rig({"M": [X()]})
    outcome = await r.manager.start_stream(r.request(abort=token, host=Host(envelope=envelope)))
    assert isinstance(outcome, Withdrawn)
    assert outcome.reason is AbortReason.USER
    assert r.recorder.of(StreamStarted) == []
    assert r.manager.active_stream_id("s1") is None


async def test_sm3_envelope_is_awaited_after_registration_and_before_stream_start() -> None:
    seen: list[object] = []

    async def envelope(info: StreamInfo) -> None:
        seen.append(r.manager.stream_state("s1"))
        seen.append(len(r.recorder.of(StreamStarted)))
        await anyio.lowlevel.checkpoint()

    r = rig({"M": [X()]})
    outcome = await r.manager.start_stream(r.request(host=Host(envelope=envelope)))
    assert isinstance(outcome, Ended)
    assert seen == [StreamState.STARTING, 0]
    assert len(r.recorder.of(StreamStarted)) == 1


async def test_sm3_a_failing_envelope_write_deregisters_and_propagates() -> None:
    async def envelope(info: StreamInfo) -> None:
        raise OSError("disk full")

    r = rig({"M": [X()]})
    with pytest.raises(OSError, match="disk full"):
        await r.manager.start_stream(r.request(host=Host(envelope=envelope)))
    assert r.manager.active_stream_id("s1") is None
    assert r.recorder.of(StreamStarted) == []


async def test_sm3_the_start_write_lands_before_the_first_step_even_when_cancelled() -> None:
    """``Started`` is awaited after ``stream-start``, shielded: a cancelled caller waits for it."""
    gate = anyio.Event()
    seen: list[object] = []

    async def started() -> None:
        seen.append((len(r.recorder.of(StreamStarted)), len(r.models["M"].requests)))
        await gate.wait()
        seen.append("written")

    r = rig({"M": [X()]})
    caller = anyio.CancelScope()

    async def launch() -> None:
        with caller:
            await r.manager.start_stream(r.request(host=Host(started=started)))

    async with anyio.create_task_group() as group:
        group.start_soon(launch)
        await anyio.wait_all_tasks_blocked()
        caller.cancel()
        await anyio.wait_all_tasks_blocked()
        assert seen == [(1, 0)]  # stream-start is out, no step asked, the write still pending
        gate.set()
    assert seen == [(1, 0), "written"]


async def test_sm4_probe_refuses_before_registration() -> None:
    envelope_calls: list[str] = []

    async def envelope(info: StreamInfo) -> None:
        envelope_calls.append(info.stream)

    r = rig({"M": [X()]})
    outcome = await r.manager.start_stream(
        r.request(host=Host(refuse=lambda: "goal paused", envelope=envelope))
    )
    assert outcome == Refused("goal paused")
    assert envelope_calls == []
    assert [e.why for e in r.recorder.of(LaunchRefused)] == ["goal paused"]
    assert r.recorder.of(StreamStarted) == []


async def test_sm4_probe_is_consulted_again_after_the_envelope_write() -> None:
    """SM-4, ST-9: a pause during the durable envelope write refuses the launch."""
    paused = False

    async def envelope(info: StreamInfo) -> None:
        nonlocal paused
        paused = True
        await anyio.lowlevel.checkpoint()

    r = rig({"M": [X()]})
    outcome = await r.manager.start_stream(
        r.request(
            host=Host(refuse=lambda: "goal paused" if paused else None, envelope=envelope),
        )
    )
    assert outcome == Refused("goal paused")
    assert r.recorder.of(StreamStarted) == []
    assert r.manager.active_stream_id("s1") is None
    assert r.models["M"].requests == []


# ---------------------------------------------------------------- SM-11 / SM-12 / SM-13


async def test_sm11_hard_stop_emits_exactly_one_abort() -> None:
    r = rig({"M": [T_("bash"), HANG]})
    outcomes: list[object] = []

    async def run() -> None:
        outcomes.append(await r.manager.start_stream(r.request()))

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await anyio.wait_all_tasks_blocked()
        await r.manager.stop_stream("s1", reason=AbortReason.USER)
        assert outcomes, "stop_stream returns after the stream's processing finished"
        await r.manager.stop_stream("s1", reason=AbortReason.USER)  # nothing registered now
    (outcome,) = outcomes
    assert isinstance(outcome, Aborted)
    assert outcome.reason is AbortReason.USER
    aborts = r.recorder.of(StreamAborted)
    assert [(a.stream != "", a.reason) for a in aborts] == [
        (True, AbortReason.USER),
        (False, AbortReason.USER),  # the second stop found nothing: a synthetic abort
    ]


async def test_sm11_hard_stop_of_a_completed_stream_emits_nothing() -> None:
    """Hard stop on a completed stream (stream-end emitted): the stop waits and emits nothing."""
    r = rig({"M": [X()]})
    stop_results: list[object] = []

    def stop_at_end(event: object) -> None:
        if type(event).__name__ == "StreamEnded":
            assert r.manager.stream_state("s1") is StreamState.COMPLETED
            r.manager.request_stop_nowait("s1", reason=AbortReason.SYSTEM)
            stop_results.append(r.manager.stream_state("s1"))

    r.manager.add_observer(stop_at_end)
    outcome = await r.manager.start_stream(r.request())
    assert isinstance(outcome, Ended)
    assert stop_results == [StreamState.COMPLETED]
    assert r.recorder.of(StreamAborted) == []


async def test_sm12_stop_with_nothing_registered_is_a_synthetic_abort() -> None:
    """A stop with nothing registered: empty stream id, default reason ``startup``."""
    r = rig({"M": []})
    await r.manager.stop_stream("s1")
    await r.manager.stop_stream("s1", reason=AbortReason.SYSTEM)
    aborts = r.recorder.of(StreamAborted)
    assert [(a.stream, a.reason, a.session) for a in aborts] == [
        ("", AbortReason.STARTUP, "s1"),
        ("", AbortReason.SYSTEM, "s1"),
    ]


async def test_sm12_registered_stream_default_reason_is_system() -> None:
    r = rig({"M": [HANG]})
    outcomes: list[object] = []

    async def run() -> None:
        outcomes.append(await r.manager.start_stream(r.request()))

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await anyio.wait_all_tasks_blocked()
        await r.manager.stop_stream("s1")
    (outcome,) = outcomes
    assert isinstance(outcome, Aborted)
    assert outcome.reason is AbortReason.SYSTEM


async def test_sm13_hard_stop_during_a_pending_soft_stop_is_hard() -> None:
    """Hard stop during a pending soft stop (R16): the hard stop's reason, never queued-message."""
    r = rig({"M": [T_("bash"), ScriptStep(text="x", hang=True)]})
    outcomes: list[object] = []

    def soft_then_wait(_: ToolCallPart) -> None:
        r.manager.request_stop_nowait("s1", soft=True, reason=AbortReason.QUEUED_MESSAGE)

    r.tools["bash"].before = soft_then_wait
    r.tools["bash"].gate = anyio.Event()

    async def run() -> None:
        outcomes.append(await r.manager.start_stream(r.request()))

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await anyio.wait_all_tasks_blocked()  # soft stop pending, tool still running
        await r.manager.stop_stream("s1", reason=AbortReason.SYSTEM)
    (outcome,) = outcomes
    assert isinstance(outcome, Aborted)
    assert outcome.reason is AbortReason.SYSTEM
    assert [a.reason for a in r.recorder.of(StreamAborted)] == [AbortReason.SYSTEM]


async def test_r16_only_the_soft_stop_reason_is_queued_message() -> None:
    r = rig({"M": [P("web"), X()]})

    def soft(event: object) -> None:
        if isinstance(event, ToolCallEnded) and event.provider:
            r.manager.request_stop_nowait("s1", soft=True, reason=AbortReason.QUEUED_MESSAGE)

    r.manager.add_observer(soft)
    outcome = await r.manager.start_stream(r.request())
    assert isinstance(outcome, Aborted)
    assert outcome.reason is AbortReason.QUEUED_MESSAGE


async def test_sm14_abort_cleanup_reports_model_remainder_progress() -> None:
    r = rig({"A": [ScriptStep(refuse=True)], "B": [T_("bash"), HANG]}, fallbacks={"A": ["B"]})
    outcomes: list[object] = []

    async def run() -> None:
        outcomes.append(await r.manager.start_stream(r.request(model="A")))

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await anyio.wait_all_tasks_blocked()
        await r.manager.stop_stream("s1", reason=AbortReason.USER)
    (outcome,) = outcomes
    assert isinstance(outcome, Aborted)
    meta = outcome.metadata
    assert meta.model == "B"
    assert meta.fallback_progress.refused_models == ("A",)
    assert meta.steps_remaining == 8 - 3  # refused step, tool step, and the step cut mid-flight
    assert r.manager.active_stream_id("s1") is None


class SoftStopAtProvider:
    """An observer that asks for the ``queued-message`` soft stop when the ``n``-th
    provider-executed result arrives (where the session asks for it, AS-26)."""

    def __init__(self, r: Rig, n: int = 1) -> None:
        self.r = r
        self.n = n
        self.seen = 0

    def __call__(self, event: object) -> None:
        if isinstance(event, ToolCallEnded) and event.provider:
            self.seen += 1
            if self.seen == self.n:
                self.r.manager.request_stop_nowait(
                    "s1", soft=True, reason=AbortReason.QUEUED_MESSAGE
                )


def provider_step(tool: str, result: object, *, refuse: bool = False) -> ScriptStep:
    """A step whose provider-executed ``tool`` answers ``result``, then text (the soft stop
    lands at that text, with the step still open)."""
    call = ScriptToolCall(tool=tool, provider_executed=True, result=result)
    return ScriptStep(tool_calls=(call,), text="partial", refuse=refuse)


async def test_sm14_a_soft_stop_abort_after_two_hops_reports_model_steps_and_progress() -> None:
    # A refuses, B refuses, C runs a tool step, then is soft-stopped inside its next step.
    r = rig(
        {"A": [REFUSE], "B": [REFUSE], "C": [T_("bash"), provider_step("web", {"ok": True})]},
        fallbacks={"A": ["B", "C"]},
    )
    r.manager.add_observer(SoftStopAtProvider(r))
    outcome = await r.manager.start_stream(r.request(model="A", step_budget=7))
    assert isinstance(outcome, Aborted)
    assert outcome.reason is AbortReason.QUEUED_MESSAGE
    assert outcome.metadata == AbortMetadata(
        model="C",  # the effective model, not the requested one
        steps_remaining=7 - 4,  # two refusals, the tool step, and the step cut mid-flight
        fallback_progress=ModelFallbackProgress(
            requested_model="A", refused_models=("A", "B"), chain=("B", "C")
        ),
        required_tool_satisfied=False,
    )
    (aborted,) = r.recorder.of(StreamAborted)
    assert (aborted.reason, aborted.remaining) == (AbortReason.QUEUED_MESSAGE, 3)


async def test_sm14_a_soft_stop_abort_reports_a_required_tool_success_in_the_cut_step() -> None:
    r = rig(
        {"A": [REFUSE], "B": [T_("bash"), provider_step("agent_report", {"success": True})]},
        fallbacks={"A": ["B"]},
    )
    r.manager.add_observer(SoftStopAtProvider(r))
    outcome = await r.manager.start_stream(
        r.request(model="A", step_budget=6, required_tools=("^agent_report$",))
    )
    assert isinstance(outcome, Aborted)
    assert outcome.reason is AbortReason.QUEUED_MESSAGE
    assert outcome.metadata == AbortMetadata(
        model="B",
        steps_remaining=6 - 3,
        fallback_progress=ModelFallbackProgress(
            requested_model="A", refused_models=("A",), chain=("B",)
        ),
        required_tool_satisfied=True,
    )


async def test_sm14_the_required_tool_flag_belongs_to_the_cut_step_alone() -> None:
    # A's refused step ran the required tool successfully; B's cut step ran it and it failed.
    # Only the step being cut counts: the abort must say "not satisfied".
    r = rig(
        {
            "A": [provider_step("agent_report", {"success": True}, refuse=True)],
            "B": [provider_step("agent_report", {"success": False})],
        },
        fallbacks={"A": ["B"]},
    )
    r.manager.add_observer(SoftStopAtProvider(r, n=2))  # B's result, not A's
    outcome = await r.manager.start_stream(
        r.request(model="A", step_budget=5, required_tools=("agent_report",))
    )
    assert isinstance(outcome, Aborted)
    assert outcome.reason is AbortReason.QUEUED_MESSAGE
    assert outcome.metadata == AbortMetadata(
        model="B",
        steps_remaining=5 - 2,
        fallback_progress=ModelFallbackProgress(
            requested_model="A", refused_models=("A",), chain=("B",)
        ),
        required_tool_satisfied=False,
    )


async def test_sm2_caller_abort_during_processing_is_a_hard_stop() -> None:
    token = AbortSignal()
    gate = anyio.Event()
    r = rig({"M": [T_("bash"), X()]}, tools=[FakeTool("bash", gate=gate)])
    outcomes: list[object] = []

    async def run() -> None:
        outcomes.append(await r.manager.start_stream(r.request(abort=token)))

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await anyio.wait_all_tasks_blocked()
        token.fire(AbortReason.USER)
    (outcome,) = outcomes
    assert isinstance(outcome, Aborted)
    assert outcome.reason is AbortReason.USER
