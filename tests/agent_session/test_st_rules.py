"""ST-1 to ST-14: the stranded-turn continuation, driven through the session.

Also the helpers ``test_r_rules`` shares: a pre-stream gate and a store whose calls can be held
or failed at an exact point, a background monitor that queues wakes from a tool and withdraws
them, and one-shot hooks that act inside an event's emission. Hooks only record and act; the
assertions run after ``settle`` (the engine isolates observers, so a failing hook would be
swallowed, which ``Once`` guards against).
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel
import msgspec
import pytest

from agent_session import (
    AgentSession,
    Continuation,
    ContinuationEnded,
    ContinuationOwed,
    DeliveryState,
    EngineConfig,
    EngineEvent,
    EntryCanceled,
    EntryDequeued,
    EntryQueued,
    Marker,
    Persisted,
    Phase,
    PhaseChanged,
    PreStreamFailure,
    ResumeAttempted,
    SweepSnapshot,
    plan_sweep,
)
from agent_session._continuation import (
    ForfeitAtCap,
    Nothing,
    StartResume,
    apply_sweep,
    owe,
    resume_failed,
)
from message_queue import CancelToken, Correlation, EntryKind, SendOptions
from persistence import (
    Boundary,
    Committed,
    CutRecord,
    CutState,
    HistoryRow,
    MemoryStore,
    RowKind,
    SessionLoad,
    SessionRecord,
    StoreError,
    TurnEnvelope,
)
from stream_manager import (
    AbortReason,
    FellBack,
    LoopStopped,
    ModelFallbackProgress,
    ModelRequest,
    ScriptStep,
    ScriptToolCall,
    StepCompleted,
    StreamAborted,
    StreamEnded,
    StreamFailed,
    StreamStarted,
    ToolCallPart,
    ToolCallStarted,
)
from tests.agent_session.support import T_, HookTool, P, Rig, X, session_rig
from tests.store_kit import commit, owed

#: A delegated turn's correlation (``C``) and an unrelated one.
C = Correlation(handle_id="h1", owner_session="ow", turn_id="t1")
C2 = Correlation(handle_id="h2", owner_session="ow", turn_id="t2")

REFUSE = ScriptStep(refuse=True)
RESUME_LOG = "Resuming turn stranded by a withdrawn queued message"


# ---------------------------------------------------------------- helpers (shared)


async def reach(event: anyio.Event) -> None:
    """Wait until the engine gets to ``event`` (the bound only turns a broken test into a
    failure; nothing here waits for time to pass)."""
    with anyio.fail_after(10):
        await event.wait()


@dataclass
class Trap:
    """One armed call: it can hold until released, and fail."""

    hold: bool = False
    fail: bool = False
    reached: anyio.Event = field(default_factory=anyio.Event)
    released: anyio.Event = field(default_factory=anyio.Event)

    def release(self, *, fail: bool = False) -> None:
        self.fail = self.fail or fail
        self.released.set()

    async def spring(self) -> bool:
        """Hold if armed to; return whether the call must fail."""
        self.reached.set()
        if self.hold:
            await self.released.wait()
        return self.fail


class Gate:
    """A pre-stream gate (the pricing gate's port): the n-th check of a purpose can hold or fail.

    ``fail={"resume": (1, 2)}`` fails the first two resume checks.
    """

    def __init__(self, *, fail: Mapping[str, Collection[int]] | None = None) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self.checks: list[str] = []
        self._traps: dict[tuple[str, int], Trap] = {}
        for purpose, numbers in (fail or {}).items():
            for n in numbers:
                self._traps[(purpose, n)] = Trap(fail=True)

    def hold(self, purpose: str, n: int) -> Trap:
        trap = Trap(hold=True)
        self._traps[(purpose, n)] = trap
        return trap

    async def check(self, session: str, purpose: str) -> None:
        del session
        self.counts[purpose] += 1
        n = self.counts[purpose]
        self.checks.append(purpose)
        await anyio.lowlevel.checkpoint()
        trap = self._traps.pop((purpose, n), None)
        if trap is not None and await trap.spring():
            raise PreStreamFailure(f"gate refused {purpose} #{n}")


class TrapStore(MemoryStore):
    """A MemoryStore whose n-th ``history`` / ``append`` / ``put_envelope`` can hold or fail.

    The names count store calls by what they carry: ``history`` is a ``load``, ``append`` a
    commit with rows, ``put_envelope`` a commit with a turn envelope.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = defaultdict(int)
        self._traps: dict[tuple[str, int], Trap] = {}

    def arm(
        self,
        verb: str,
        at: int | None = None,
        *,
        hold: bool = False,
        fail: bool = False,
        trap: Trap | None = None,
    ) -> Trap:
        """Arm call number ``at`` of ``verb`` (default: its next call) with ``trap``."""
        n = self.calls[verb] + 1 if at is None else at
        armed = trap if trap is not None else Trap(hold=hold, fail=fail)
        self._traps[(verb, n)] = armed
        return armed

    async def _spring(self, verb: str) -> None:
        self.calls[verb] += 1
        n = self.calls[verb]
        trap = self._traps.pop((verb, n), None)
        if trap is not None and await trap.spring():
            raise StoreError(f"trapped {verb} #{n}")

    async def load(self, session: str, *, envelopes: bool = True) -> SessionLoad | None:
        await self._spring("history")
        return await super().load(session, envelopes=envelopes)

    async def commit(self, session: str, boundary: Boundary, *, owner: str | None) -> Committed:
        if boundary.rows:
            await self._spring("append")
        if boundary.envelope is not None:
            await self._spring("put_envelope")
        return await super().commit(session, boundary, owner=owner)


class Once:
    """Run ``do`` inside the emission of the first event ``when`` accepts."""

    def __init__(
        self, rig: Rig, when: Callable[[EngineEvent], bool], do: Callable[[], object]
    ) -> None:
        self.when = when
        self.do = do
        self.fired = False
        self.error: BaseException | None = None
        rig.on(self)

    def __call__(self, event: EngineEvent) -> None:
        if self.fired or not self.when(event):
            return
        self.fired = True
        try:
            self.do()
        except Exception as error:
            self.error = error
            raise

    def check(self) -> None:
        assert self.fired, "the hook's event never came"
        if self.error is not None:
            raise self.error


class Wakes:
    """A background monitor: each call of its tool queues a wake ``w1``, ``w2`` ...

    Unless ``keep`` names it, a wake is withdrawn when the stream that queued it ends (or
    aborts, with ``on=StreamAborted``): the reconciler saw the agent read the output itself.
    """

    def __init__(
        self,
        *,
        keep: Collection[int] | bool = (),
        on: type[StreamEnded] | type[StreamAborted] = StreamEnded,
    ) -> None:
        self.keep = keep
        self.on = on
        self.names: list[str] = []
        #: Each wake's cancel token: firing it is how its producer withdraws it once dequeued.
        self.tokens: dict[str, CancelToken] = {}
        self._pending: list[str] = []
        self._rig: Rig | None = None

    def attach(self, rig: Rig) -> Wakes:
        self._rig = rig
        rig.on(self._on_event)
        return self

    def queue(self, _call: ToolCallPart | None = None) -> None:
        assert self._rig is not None
        name = f"w{len(self.names) + 1}"
        self.tokens[name] = self._rig.session().enqueue(
            "monitor output", kind=EntryKind.WAKE, entry=name
        )
        self.names.append(name)
        kept = self.keep is True or (
            not isinstance(self.keep, bool) and len(self.names) in self.keep
        )
        if not kept:
            self._pending.append(name)

    def queue_on_provider_call(self, event: EngineEvent) -> None:
        if isinstance(event, ToolCallStarted) and event.provider:
            self.queue()

    def _on_event(self, event: EngineEvent) -> None:
        if isinstance(event, self.on) and self._pending:
            assert self._rig is not None
            for name in self._pending:
                self._rig.session().withdraw(name, "the model read the output itself")
            self._pending.clear()


def both(*actions: Callable[[ToolCallPart], object]) -> Callable[[ToolCallPart], None]:
    def run(call: ToolCallPart) -> None:
        for action in actions:
            action(call)

    return run


def incident(final: str = "final answer") -> dict[str, list[ScriptStep]]:
    """The incident's script (a withdrawn wake): the cut after step 2 leaves 6 of 8 steps."""
    return {"M": [T_("bash"), T_("task_await"), X(final)]}


@asynccontextmanager
async def at_the_held_resume(
    final: str = "final answer",
) -> AsyncIterator[tuple[Rig, Trap, Gate]]:
    """The incident run until its resume waits at the pre-stream gate.

    The withdrawn wake has cut the turn, the sweep has claimed PREPARING for the resume, and
    the gate holds it: what a test does now lands on an owed continuation whose resume is
    preparing. ``held.release()`` lets the resume go on.
    """
    gate = Gate()
    held = gate.hold("resume", 1)
    wakes = Wakes()
    async with session_rig(
        incident(final), tools=[HookTool("task_await", before=wakes.queue)], gate=gate
    ) as r:
        wakes.attach(r)
        r.session().send("start")
        await reach(held.reached)
        yield r, held, gate


def provider_pair(text: str = "partial text") -> ScriptStep:
    """A step with two provider-executed tools: a hook on the second call's start runs after
    the first one's result asked for the soft stop and before that stop lands."""
    return ScriptStep(
        tool_calls=(
            ScriptToolCall(tool="web", provider_executed=True, result={"ok": True}),
            ScriptToolCall(tool="fetch", provider_executed=True, result={"ok": True}),
        ),
        text=text,
    )


def starts(r: Rig) -> list[tuple[str, int]]:
    return [(s.cause.value, s.budget) for s in r.of(StreamStarted)]


def hows(r: Rig) -> list[str]:
    return [e.how.value for e in r.of(ContinuationEnded)]


def outcomes(r: Rig) -> list[str]:
    return [e.outcome for e in r.of(ResumeAttempted)]


def requests(r: Rig, stream: str) -> list[ModelRequest]:
    return [q for m in r.models.values() for q in m.requests if q.stream == stream]


def resume_stream(r: Rig) -> StreamStarted:
    (started,) = [s for s in r.of(StreamStarted) if s.cause.value == "resume"]
    return started


def marker_of(session: AgentSession) -> Marker:
    marker = session.continuation.marker
    assert marker is not None, "no continuation is owed"
    return marker


def text_of(row: HistoryRow) -> str:
    return str(msgspec.json.decode(row.body).get("text", ""))


def idle_while_owed(r: Rig) -> Callable[[EngineEvent], bool]:
    """The first transition to IDLE with a continuation owed, before the sweep it schedules."""
    return lambda e: isinstance(e, PhaseChanged) and e.to is Phase.IDLE and r.session().owes()


def resume_claimed(r: Rig) -> Callable[[EngineEvent], bool]:
    return lambda e: (
        isinstance(e, PhaseChanged)
        and e.to is Phase.PREPARING
        and r.session().continuation.resume_in_flight
    )


def is_stream_end(e: EngineEvent) -> bool:
    return isinstance(e, StreamEnded)


# ---------------------------------------------------------------- ST-1 the marker


async def test_st1_marker_records_the_cut() -> None:
    wakes = Wakes()
    seen: list[Marker] = []
    async with session_rig(incident(), tools=[HookTool("task_await", before=wakes.queue)]) as r:
        wakes.attach(r)
        hook = Once(r, is_stream_end, lambda: seen.append(marker_of(r.session())))
        r.session().send("start three monitored tasks and wait")
        await r.settle()
        hook.check()
    (marker,) = seen
    assert marker.cut == "s1/1"
    assert (marker.model, marker.step_budget) == ("M", 6)
    assert marker.progress == ModelFallbackProgress(requested_model="M")
    assert marker.correlation is None
    assert marker.agent_initiated is False
    (owed,) = r.of(ContinuationOwed)
    assert (owed.cut, owed.remaining, owed.model, owed.handle) == ("s1/1", 6, "M", None)


async def test_st1_marker_of_an_agent_initiated_turn_says_so() -> None:
    wakes = Wakes(keep=(1,))
    seen: list[Marker] = []
    async with session_rig(
        {"M": [T_("task_await"), T_("task_await"), X("done")]},
        tools=[HookTool("task_await", before=wakes.queue)],
    ) as r:
        wakes.attach(r)
        r.session().send("start")  # S1 is cut by the live w1; w1's own turn is cut by w2

        def second_cut(e: EngineEvent) -> bool:
            return isinstance(e, StreamEnded) and e.stream == "s1/2"

        hook = Once(r, second_cut, lambda: seen.append(marker_of(r.session())))
        await r.settle()
        hook.check()
    (marker,) = seen
    assert marker.cut == "s1/2"
    assert marker.agent_initiated is True


FULL_OPTIONS = SendOptions(
    model="M",
    thinking_level="medium",
    agent_id="exec",
    extra={
        "reasoning_mode": "deep",
        "tool_policy": {"deny": ["rm"]},
        "additional_system_instructions": "be brief",
        "max_output_tokens": 1000,
        "provider_options": {"temperature": 0},
        "experiments": ["exp-1"],
        "disable_workspace_agents": True,
        "allow_agent_set_goal": False,
        # per-dispatch fields: never replayed by a resume (R9)
        "acp_prompt_id": "prompt-7",
        "delegated_tool_names": ["task"],
        "edit_id": "edit-3",
        "file_parts": ["a.pdf"],
        "queue_mode": "tool-end",
    },
)


async def test_st1_r9_marker_options_are_the_retry_safe_whitelist() -> None:
    wakes = Wakes()
    async with session_rig(incident(), tools=[HookTool("task_await", before=wakes.queue)]) as r:
        wakes.attach(r)
        seen: list[Marker] = []
        hook = Once(r, is_stream_end, lambda: seen.append(marker_of(r.session())))
        r.session().send("start", options=FULL_OPTIONS)
        await r.settle()
        hook.check()
    options = seen[0].options
    assert (options.model, options.thinking_level, options.agent_id) == ("M", "medium", "exec")
    assert dict(options.extra) == {
        "reasoning_mode": "deep",
        "tool_policy": {"deny": ["rm"]},
        "additional_system_instructions": "be brief",
        "max_output_tokens": 1000,
        "provider_options": {"temperature": 0},
        "experiments": ["exp-1"],
        "disable_workspace_agents": True,
        "allow_agent_set_goal": False,
    }
    assert outcomes(r) == ["started"]


async def test_st1_r15_a_resume_continues_on_the_model_that_ran_the_cut() -> None:
    wakes = Wakes()
    async with session_rig(
        {"A": [REFUSE], "B": [T_("task_await"), X("B finishes")]},
        tools=[HookTool("task_await", before=wakes.queue)],
        fallbacks={"A": ["B"]},
        sessions=(("s1", "A"),),
    ) as r:
        wakes.attach(r)
        seen: list[Marker] = []
        hook = Once(r, is_stream_end, lambda: seen.append(marker_of(r.session())))
        r.session().send("start")
        await r.settle()
        hook.check()
    marker = seen[0]
    assert (marker.model, marker.step_budget) == ("B", 6)
    assert marker.progress == ModelFallbackProgress(
        requested_model="A", refused_models=("A",), chain=("B",)
    )
    resumed = resume_stream(r)
    assert (resumed.model, resumed.budget) == ("B", 6)
    assert [q.model for q in requests(r, resumed.stream)] == ["B"]
    assert len(r.models["A"].requests) == 1  # the refusing model is never asked again


async def test_st1_r15_the_markers_options_name_the_model_at_the_cut() -> None:
    """ST-1: ``options`` is the whitelist "with model = modelString (the model at the cut)"."""
    wakes = Wakes()
    async with session_rig(
        {"A": [REFUSE], "B": [T_("task_await"), X("B finishes")]},
        tools=[HookTool("task_await", before=wakes.queue)],
        fallbacks={"A": ["B"]},
        sessions=(("s1", "A"),),
    ) as r:
        wakes.attach(r)
        seen: list[Marker] = []
        hook = Once(r, is_stream_end, lambda: seen.append(marker_of(r.session())))
        r.session().send("start", options=SendOptions(model="A", agent_id="exec"))
        await r.settle()
        hook.check()
    (marker,) = seen
    assert (marker.model, marker.options.model, marker.options.agent_id) == ("B", "B", "exec")


async def test_st1_r20_a_pending_thinking_change_survives_the_cut() -> None:
    wakes = Wakes()

    def think_high(_: ToolCallPart) -> None:
        r.session().set_thinking("high")  # after the cut step was prepared: pending, not applied

    async with session_rig(
        incident(), tools=[HookTool("task_await", before=both(wakes.queue, think_high))]
    ) as r:
        wakes.attach(r)
        r.session().send("start")
        await r.settle()
    assert [q.thinking_level for q in requests(r, "s1/1")] == [None, None]
    assert (r.of(ContinuationOwed)[0].cut, outcomes(r)) == ("s1/1", ["started"])
    assert [q.thinking_level for q in requests(r, resume_stream(r).stream)] == ["high"]


async def test_st1_r26_the_scratchpad_is_snapshotted_at_the_cut() -> None:
    wakes = Wakes()

    def edit_scratchpad(_: ToolCallPart) -> None:
        r.session().set_scratchpad("scratch v2")  # the live text when the cut happens

    async with session_rig(
        incident(), tools=[HookTool("task_await", before=both(wakes.queue, edit_scratchpad))]
    ) as r:
        wakes.attach(r)
        r.session().set_scratchpad("scratch v1")
        seen: list[str | None] = []

        def after_the_cut() -> None:
            seen.append(marker_of(r.session()).extra_system_context)
            r.session().set_scratchpad("scratch v3")  # a later edit is not the cut's snapshot

        hook = Once(r, is_stream_end, after_the_cut)
        r.session().send("start")
        await r.settle()
        hook.check()
    assert seen == ["scratch v2"]
    assert [q.extra_system_context for q in requests(r, resume_stream(r).stream)] == ["scratch v2"]


# ---------------------------------------------------------------- ST-2 creation, normal cut


async def test_st2_r1_the_marker_is_recorded_synchronously_before_stream_end() -> None:
    wakes = Wakes()
    seen: list[tuple[bool, Phase, str]] = []
    async with session_rig(incident(), tools=[HookTool("task_await", before=wakes.queue)]) as r:
        wakes.attach(r)
        s = r.session()
        hook = Once(r, is_stream_end, lambda: seen.append((s.owes(), s.phase, marker_of(s).cut)))
        s.send("start")
        await r.settle()
        hook.check()
    assert seen == [(True, Phase.STREAMING, "s1/1")]
    names = [type(e).__name__ for e in r.events]
    assert names.index("ContinuationOwed") < names.index("StreamEnded")


async def test_st2_r65_a_queued_stop_at_the_step_cap_owes_nothing() -> None:
    wakes = Wakes(keep=True)
    async with session_rig(
        {"M": [T_("bash"), T_("task_await"), X("wake answered")]},
        tools=[HookTool("task_await", before=wakes.queue)],
        config=EngineConfig(max_stream_steps=2),
    ) as r:
        wakes.attach(r)
        r.session().send("start")
        await r.settle()
    assert [e.why.value for e in r.of(LoopStopped)] == ["step-cap", "finished"]
    assert r.of(ContinuationOwed) == []
    assert starts(r) == [("send", 2), ("queue", 2)]  # the live wake runs its own turn
    assert outcomes(r) == []


def test_st2_a_new_cut_replaces_the_previous_marker() -> None:
    progress = ModelFallbackProgress(requested_model="M")
    first = Marker(cut="s1/1", model="M", step_budget=6, progress=progress)
    second = Marker(cut="s1/2", model="M", step_budget=4, progress=progress)
    state, _ = owe(Continuation(), first)
    state = resume_failed(msgspec.structs.replace(state, resume_in_flight=True))
    state, previous = owe(state, second)
    assert previous == first
    assert (state.marker, state.failed_attempts) == (second, 0)
    with pytest.raises(ValueError, match="R65"):
        owe(state, msgspec.structs.replace(second, step_budget=0))


# ---------------------------------------------------------------- ST-3 creation, soft-stop cut


async def test_st3_soft_stop_cut_owes_a_continuation_and_resumes_from_the_partial() -> None:
    wakes = Wakes(on=StreamAborted)  # withdrawn before the abort handler drains it
    async with session_rig({"M": [T_("bash"), P("web"), X("resumed")]}) as r:
        wakes.attach(r)
        r.on(wakes.queue_on_provider_call)
        r.session().set_scratchpad("notes")
        seen: list[Marker] = []
        hook = Once(
            r,
            lambda e: isinstance(e, ContinuationOwed),
            lambda: seen.append(marker_of(r.session())),
        )
        r.session().send("search the web")
        await r.settle()
        hook.check()
        kinds = await r.kinds()
    (aborted,) = r.of(StreamAborted)
    assert (aborted.stream, aborted.reason.value, aborted.remaining) == (
        "s1/1",
        "queued-message",
        6,
    )
    names = [type(e).__name__ for e in r.events]
    assert names.index("StreamAborted") < names.index("ContinuationOwed")
    (marker,) = seen
    assert (marker.cut, marker.model, marker.step_budget) == ("s1/1", "M", 6)
    assert marker.extra_system_context == "notes"
    assert [e.entry for e in r.of(EntryCanceled)] == ["w1"]
    assert starts(r) == [("send", 8), ("resume", 6)]
    assert hows(r) == ["consumed"]
    assert kinds == [RowKind.USER, RowKind.PARTIAL, RowKind.ASSISTANT]  # no sentinel


# ---------------------------------------------------------------- ST-4 consumption


async def test_st4_consumed_only_on_streaming() -> None:
    wakes = Wakes()
    seen: list[tuple[str, bool]] = []
    async with session_rig(incident(), tools=[HookTool("task_await", before=wakes.queue)]) as r:
        wakes.attach(r)
        s = r.session()

        def record(e: EngineEvent) -> None:
            if isinstance(e, EntryDequeued | EntryCanceled):
                seen.append((type(e).__name__, s.owes()))
            elif isinstance(e, StreamStarted) and e.cause.value == "resume":
                seen.append(("StreamStarted", s.owes()))  # observers see it before the session
            elif isinstance(e, StepCompleted) and e.stream == "s1/2":
                seen.append(("StepCompleted", s.owes()))

        r.on(record)
        s.send("start")
        await r.settle()
        assert s.continuation.consumed == ("s1/1",)
        assert s.continuation.failed_attempts == 0
    assert seen == [
        ("EntryDequeued", True),
        ("EntryCanceled", True),
        ("StreamStarted", True),
        ("StepCompleted", False),
    ]
    assert hows(r) == ["consumed"]


async def test_st4_r64_a_wake_withdrawn_during_its_preflight_does_not_consume() -> None:
    gate = Gate()
    held = gate.hold("send", 2)  # the live wake's dispatch, after it claimed PREPARING
    wakes = Wakes(keep=True)
    async with session_rig(
        incident(), tools=[HookTool("task_await", before=wakes.queue)], gate=gate
    ) as r:
        wakes.attach(r)
        s = r.session()
        s.send("start")
        await reach(held.reached)
        assert (s.phase, s.owes()) == (Phase.PREPARING, True)
        wakes.tokens["w1"].cancel("already consumed")  # dequeued: its producer fires the token
        held.release()
        await r.settle()
        assert s.continuation.consumed == ("s1/1",)
        kinds = await r.kinds()
    assert [e.entry for e in r.of(EntryCanceled)] == ["w1"]
    assert starts(r) == [("send", 8), ("resume", 6)]
    assert hows(r) == ["consumed"]
    assert kinds == [RowKind.USER, RowKind.ASSISTANT, RowKind.SENTINEL, RowKind.ASSISTANT]


async def test_st4_a_live_wake_consumes_the_marker_and_nothing_resumes_after() -> None:
    wakes = Wakes(keep=True)
    async with session_rig(
        incident("seen"), tools=[HookTool("task_await", before=wakes.queue)]
    ) as r:
        wakes.attach(r)
        r.session().send("start")
        await r.settle()
        assert r.session().continuation.consumed == ("s1/1",)
        assert not r.session().owes()
        kinds = await r.kinds()
    assert starts(r) == [("send", 8), ("queue", 8)]
    assert hows(r) == ["consumed"]
    assert outcomes(r) == []
    assert kinds == [RowKind.USER, RowKind.ASSISTANT, RowKind.USER, RowKind.ASSISTANT]


# ---------------------------------------------------------------- ST-5 withdraw


async def test_st5_stop_while_owed_and_idle_withdraws() -> None:
    wakes = Wakes()
    async with session_rig(incident(), tools=[HookTool("task_await", before=wakes.queue)]) as r:
        wakes.attach(r)
        hook = Once(r, idle_while_owed(r), lambda: r.session().stop())
        r.session().send("start")
        await r.settle()
        hook.check()
        assert r.session().phase is Phase.IDLE
    assert hows(r) == ["withdrawn"]
    assert outcomes(r) == []
    assert starts(r) == [("send", 8)]


async def test_st5_an_edit_withdraws_and_aborts_the_resume() -> None:
    async with at_the_held_resume("edited answer") as (r, held, _gate):
        s = r.session()
        first = (await r.history())[0]
        hook = Once(
            r, lambda e: isinstance(e, ContinuationEnded), lambda: held.release()
        )  # the resume is let go only once the edit has withdrawn it
        await s.edit(first.row_id, "start, but differently")
        await r.settle()
        hook.check()
        rows = await r.history()
    assert hows(r) == ["withdrawn"]
    assert outcomes(r) == ["withdrawn"]
    assert starts(r) == [("send", 8), ("send", 8)]
    assert [row.kind for row in rows] == [RowKind.USER, RowKind.ASSISTANT]
    assert text_of(rows[0]) == "start, but differently"


# Each withdrawal path, with its ``why``, and the durable cut record following the marker: a
# record left ``owed`` would make a restart resume a turn the live engine had withdrawn.


async def assert_withdrawn_durably(r: Rig, why: str, cut: str = "s1/1") -> None:
    """ST-5, PS-6: exactly one ending, a withdrawal for ``why``; the record says withdrawn."""
    assert [(e.cut, e.how.value, e.why) for e in r.of(ContinuationEnded)] == [
        (cut, "withdrawn", why)
    ]
    assert await owed(r.store) == []
    (row,) = [row for row in await r.history() if row.cut is not None]
    assert row.stream == cut
    assert row.cut is not None
    assert row.cut.state is CutState.WITHDRAWN
    assert [e.id for e in r.of(Persisted) if e.what == "cut-void"] == [row.row_id]


async def test_st5_r6_a_user_stop_withdraws_and_the_cut_record_follows() -> None:
    async with at_the_held_resume() as (r, held, _gate):
        s = r.session()
        s.send("u", entry="u")  # busy: queued behind the resume, given back by the Stop
        assert s.stop() == "u"
        assert not s.owes()
        held.release()
        await r.settle()
        await assert_withdrawn_durably(r, "user stop")
    assert outcomes(r) == ["withdrawn"]
    assert starts(r) == [("send", 8)]


async def test_st5_r6_send_now_withdraws_and_the_cut_record_follows() -> None:
    async with at_the_held_resume("answer to u") as (r, held, _gate):
        s = r.session()
        s.send("u", entry="u")
        assert s.send_now()
        assert not s.owes()
        held.release()
        await r.settle()
        await assert_withdrawn_durably(r, "send now")
        rows = await r.history()
    assert outcomes(r) == ["withdrawn"]
    assert starts(r) == [("send", 8), ("queue", 8)]
    assert [(row.kind, text_of(row)) for row in rows] == [
        (RowKind.USER, "start"),
        (RowKind.ASSISTANT, ""),
        (RowKind.USER, "u"),
        (RowKind.ASSISTANT, "answer to u"),
    ]


@pytest.mark.parametrize(
    ("refused", "why"),
    [(False, "superseded by a send (R35)"), (True, "superseded by a refused send's row (R35)")],
)
async def test_st5_r35_a_superseding_send_withdraws_and_the_cut_record_follows(
    refused: bool, why: str
) -> None:
    gate = Gate(fail={"send": (2,)} if refused else None)  # the second send is u's
    async with session_rig(
        {"M": [T_("bash"), X("answer to u")]},
        tools=[HookTool("bash", before=lambda _: r.session().send("u", entry="u"))],
        gate=gate,
    ) as r:
        r.session().send("start")
        await r.settle()
        await assert_withdrawn_durably(r, why)
        rows = await r.history()
    assert [e.remaining for e in r.of(ContinuationOwed)] == [7]
    assert outcomes(r) == []  # nothing resumed the superseded turn
    assert starts(r) == ([("send", 8)] if refused else [("send", 8), ("queue", 8)])
    assert [e.type for e in r.of(StreamFailed)] == (["pre_stream_rejected"] if refused else [])
    assert [text_of(row) for row in rows if row.kind is RowKind.USER] == ["start", "u"]


async def test_st5_r25_a_stream_error_withdraws_and_the_cut_record_follows() -> None:
    """R25 through the store.

    Not reachable through the session's own flows today: every stream that can fail has
    reached STREAMING, which consumed any owed continuation first (ST-4). So the test owes one
    mid-stream the way startup recovery does (``adopt_owed`` on a durable owed record, a cut
    after a fallback hop), and the stream then fails: the error path must withdraw it, void
    its record, and nothing may resume it.
    """
    progress = ModelFallbackProgress(requested_model="M", refused_models=("M",), chain=("B",))
    record = CutRecord(
        remaining=3, model="B", requested_model="M", refused_models=("M",), chain=("B",)
    )
    store = MemoryStore()
    async with store:  # what an earlier process left: a cut owed on s1:r2
        await commit(
            store,
            "s1",
            create=SessionRecord(id="s1", model="M"),
            rows=[
                HistoryRow(
                    session="s1",
                    seq=1,
                    row_id="s1:r1",
                    kind=RowKind.USER,
                    body=b'{"text":"earlier"}',
                ),
                HistoryRow(
                    session="s1",
                    seq=2,
                    row_id="s1:r2",
                    kind=RowKind.ASSISTANT,
                    body=b'{"text":"cut"}',
                    stream="s1/1",
                    cut=record,
                ),
            ],
            envelope=TurnEnvelope(session="s1", stream="s1/1", model="M", budget=8, cause="send"),
        )
    marker = Marker(cut="s1/1", model="B", step_budget=3, progress=progress)

    def owe_mid_stream(_: ToolCallPart) -> None:
        r.session().adopt_owed(marker, "s1:r2")

    async with session_rig(
        {"M": [T_("bash"), ScriptStep(error="terminal")], "B": [X("never resumed")]},
        tools=[HookTool("bash", before=owe_mid_stream)],
        store=store,
        config=EngineConfig(max_stream_steps=8, recover_at_start=False),
    ) as r:
        r.session().send("go")
        await r.settle()
        await assert_withdrawn_durably(r, "the stream failed; the error path owns it (R25)")
        assert not r.session().owes()
    assert [(e.stream, e.type) for e in r.of(StreamFailed)] == [("s1/2", "provider_rejected")]
    assert starts(r) == [("send", 8)]
    assert outcomes(r) == []
    assert r.models["B"].requests == []


async def test_st5_an_edit_withdraws_and_the_cut_record_follows() -> None:
    # The edited row comes after the cut row (the live wake's, durable, its launch held at
    # the envelope), so the cut row survives the truncation and its record can be read.
    store = TrapStore()
    held = store.arm("put_envelope", at=2, hold=True)
    wakes = Wakes(keep=True)
    async with session_rig(
        incident("answer to the edit"),
        tools=[HookTool("task_await", before=wakes.queue)],
        store=store,
    ) as r:
        wakes.attach(r)
        s = r.session()
        # the edit's interrupt (a synthetic abort: the wake's stream is not processing yet)
        # lets the held launch go on, to find itself withdrawn
        hook = Once(r, lambda e: isinstance(e, StreamAborted) and not e.stream, held.release)
        s.send("start")
        await reach(held.reached)
        wake_row = (await r.history())[2]
        assert (wake_row.kind, s.phase, s.owes()) == (RowKind.USER, Phase.PREPARING, True)
        await s.edit(wake_row.row_id, "summarise instead")
        await r.settle()
        hook.check()
        await assert_withdrawn_durably(r, "history edited")
        rows = await r.history()
    assert [(row.kind, text_of(row)) for row in rows] == [
        (RowKind.USER, "start"),
        (RowKind.ASSISTANT, ""),
        (RowKind.USER, "summarise instead"),
        (RowKind.ASSISTANT, "answer to the edit"),
    ]
    assert starts(r) == [("send", 8), ("send", 8)]  # the wake's launch never started
    assert outcomes(r) == []


@pytest.mark.parametrize("reason", [AbortReason.SYSTEM, AbortReason.STARTUP, AbortReason.USER])
async def test_st5_r19_a_stop_reaching_a_preparing_resume_withdraws_and_the_record_follows(
    reason: AbortReason,
) -> None:
    async with at_the_held_resume() as (r, held, _gate):
        s = r.session()
        r.engine.manager.request_stop_nowait("s1", reason=reason)  # an interrupt cascade
        assert not s.owes()
        held.release()
        await r.settle()
        await assert_withdrawn_durably(r, f"{reason.value} stop before the resume started")
    assert outcomes(r) == ["withdrawn"]
    assert starts(r) == [("send", 8)]


# ---------------------------------------------------------------- ST-6 forfeit


async def test_st6_r21_three_failed_attempts_forfeit_instead_of_a_fourth() -> None:
    gate = Gate(fail={"resume": (1, 2, 3, 4)})
    wakes = Wakes()
    async with session_rig(
        incident(), tools=[HookTool("task_await", before=wakes.queue)], gate=gate
    ) as r:
        wakes.attach(r)
        r.session().send("start")
        await r.settle()
        s = r.session()
        assert (s.phase, s.owes()) == (Phase.IDLE, False)
        kinds = await r.kinds()
    assert outcomes(r) == ["failed", "failed", "failed"]
    assert gate.counts["resume"] == 3
    assert hows(r) == ["forfeited"]
    assert starts(r) == [("send", 8)]
    assert RowKind.SENTINEL not in kinds


async def test_st6_r27_discarding_the_history_forfeits() -> None:
    wakes = Wakes()
    async with session_rig(incident(), tools=[HookTool("task_await", before=wakes.queue)]) as r:
        wakes.attach(r)
        hook = Once(r, idle_while_owed(r), lambda: r.session().discard_context())
        r.session().send("start")
        await r.settle()
        hook.check()
        assert await r.history() == []
    assert hows(r) == ["forfeited"]
    assert outcomes(r) == []
    assert starts(r) == [("send", 8)]


async def test_st6_r18_r27_disposal_during_a_held_resume_forfeits_and_registers_nothing() -> None:
    store = TrapStore()
    held = store.arm("put_envelope", at=2, hold=True)  # past the history path's own checks
    wakes = Wakes()
    async with session_rig(
        incident(), tools=[HookTool("task_await", before=wakes.queue)], store=store
    ) as r:
        wakes.attach(r)
        s = r.session()
        s.send("start")
        await reach(held.reached)
        assert RowKind.SENTINEL in await r.kinds()
        await s.dispose()
        held.release()
        await r.settle()
        assert s.phase is Phase.DISPOSED
        assert RowKind.SENTINEL not in await r.kinds()
    assert hows(r) == ["forfeited"]
    assert outcomes(r) == ["withdrawn"]
    assert starts(r) == [("send", 8)]


async def test_st6_r23_a_hard_stop_clear_forfeits_the_owed_continuation() -> None:
    wakes = Wakes()
    async with session_rig(incident(), tools=[HookTool("task_await", before=wakes.queue)]) as r:
        wakes.attach(r)
        hook = Once(r, idle_while_owed(r), lambda: r.session().hard_stop())
        r.session().send("start")
        await r.settle()
        hook.check()
    assert hows(r) == ["forfeited"]
    assert outcomes(r) == []
    assert starts(r) == [("send", 8)]


@pytest.mark.parametrize("removal", ["clear", "dedupe"])
@pytest.mark.parametrize("kind", [EntryKind.REPORT, EntryKind.WAKE])
async def test_st6_r32_removing_the_owed_turns_queued_continuation_forfeits_first(
    removal: str, kind: EntryKind
) -> None:
    seen: list[bool] = []

    def queue_continuation(_: ToolCallPart) -> None:
        r.session().enqueue(
            "same-turn follow-up",
            kind=kind,
            entry="next",
            dedupe_key="turn:h1",
            correlation=C if kind is EntryKind.REPORT else None,
        )

    def remove() -> None:
        s = r.session()
        if removal == "clear":
            s.clear_queue("user cleared the queue")  # a plain clear (R53 keeps others)
        else:
            s.remove_dedupe("turn:")

    async with session_rig(
        {"M": [T_("bash"), X("never")]},
        tools=[HookTool("bash", before=queue_continuation)],
    ) as r:
        r.on(
            lambda e: (
                seen.append(r.session().owes())
                if isinstance(e, EntryCanceled) and e.entry == "next"
                else None
            )
        )
        hook = Once(r, is_stream_end, remove)
        r.session().enqueue("delegated task", kind=EntryKind.SYSTEM, correlation=C)
        await r.settle()
        hook.check()
    assert r.of(ContinuationOwed)[0].handle == "h1"
    assert seen == [False]  # forfeited before the entry's cancellation ran
    assert hows(r) == ["forfeited"]
    assert outcomes(r) == []
    assert len(r.of(StreamStarted)) == 1


async def test_st6_r29_unrelated_input_after_a_correlated_soft_stop_forfeits() -> None:
    async with session_rig({"M": [P("web"), X("answer to the user")]}) as r:
        r.on(
            lambda e: (
                r.session().send("what about this?", entry="u")
                if isinstance(e, ToolCallStarted) and e.provider
                else None
            )
        )
        r.session().enqueue("delegated task", kind=EntryKind.SYSTEM, correlation=C)
        await r.settle()
    assert r.of(ContinuationOwed)[0].handle == "h1"
    (ended,) = r.of(ContinuationEnded)
    assert ended.how.value == "forfeited"  # not a silent withdraw at u's point of no return
    assert r.events.index(ended) < r.events.index(
        next(e for e in r.of(EntryDequeued) if e.entry == "u")
    )
    assert [s.handle for s in r.of(StreamStarted)] == ["h1", None]
    assert outcomes(r) == []


# ---------------------------------------------------------------- ST-7 the sweep


def _owed() -> Continuation:
    marker = Marker(
        cut="s1/1", model="M", step_budget=6, progress=ModelFallbackProgress(requested_model="M")
    )
    return Continuation(marker=marker)


@pytest.mark.parametrize(
    ("state", "snapshot"),
    [
        (Continuation(), SweepSnapshot(disposed=False, phase=Phase.IDLE, queue_empty=True)),
        (_owed(), SweepSnapshot(disposed=True, phase=Phase.IDLE, queue_empty=True)),
        (_owed(), SweepSnapshot(disposed=False, phase=Phase.PREPARING, queue_empty=True)),
        (_owed(), SweepSnapshot(disposed=False, phase=Phase.STREAMING, queue_empty=True)),
        (_owed(), SweepSnapshot(disposed=False, phase=Phase.COMPLETING, queue_empty=True)),
        (_owed(), SweepSnapshot(disposed=False, phase=Phase.IDLE, queue_empty=False)),
        (
            _owed(),
            SweepSnapshot(
                disposed=False, phase=Phase.IDLE, queue_empty=True, manual_in_preflight=1
            ),
        ),
        (
            _owed(),
            SweepSnapshot(
                disposed=False, phase=Phase.IDLE, queue_empty=True, external_follow_ups=1
            ),
        ),
        (
            msgspec.structs.replace(_owed(), resume_in_flight=True),
            SweepSnapshot(disposed=False, phase=Phase.IDLE, queue_empty=True),
        ),
    ],
    ids=[
        "nothing-owed",
        "disposed",
        "preparing",
        "streaming",
        "completing",
        "queue-not-empty",
        "manual-preflight",
        "external-follow-up",
        "resume-in-flight",
    ],
)
def test_st7_the_sweep_does_nothing_unless_every_precondition_holds(
    state: Continuation, snapshot: SweepSnapshot
) -> None:
    assert isinstance(plan_sweep(state, snapshot, 3), Nothing)


def test_st7_the_sweep_starts_one_resume_and_is_idempotent() -> None:
    idle = SweepSnapshot(disposed=False, phase=Phase.IDLE, queue_empty=True)
    state = _owed()
    action = plan_sweep(state, idle, 3)
    assert isinstance(action, StartResume)
    assert action.attempt == 1
    state = apply_sweep(state, action)
    assert isinstance(plan_sweep(state, idle, 3), Nothing)
    at_cap = msgspec.structs.replace(_owed(), failed_attempts=3)
    assert isinstance(plan_sweep(at_cap, idle, 3), ForfeitAtCap)


async def test_st7_r3_the_sweep_yields_to_a_manual_send_in_preflight() -> None:
    gate = Gate()
    held = gate.hold("send", 2)
    wakes = Wakes()
    async with session_rig(
        incident("answer to the user"),
        tools=[HookTool("task_await", before=wakes.queue)],
        gate=gate,
    ) as r:
        wakes.attach(r)
        s = r.session()
        hook = Once(r, idle_while_owed(r), lambda: s.send("actually, do this instead"))
        s.send("start")
        await reach(held.reached)
        await anyio.wait_all_tasks_blocked()  # the sweep the idle transition scheduled ran
        assert (s.phase, s.owes(), gate.counts["resume"]) == (Phase.IDLE, True, 0)
        held.release()
        await r.settle()
        hook.check()
        kinds = await r.kinds()
    assert outcomes(r) == []
    assert hows(r) == ["withdrawn"]  # the user's row crossed the point of no return (R35)
    assert starts(r) == [("send", 8), ("send", 8)]
    assert RowKind.SENTINEL not in kinds


async def test_st7_r3_a_failed_preflight_send_sweeps_again() -> None:
    gate = Gate()
    held = gate.hold("send", 2)
    wakes = Wakes()
    async with session_rig(
        incident(), tools=[HookTool("task_await", before=wakes.queue)], gate=gate
    ) as r:
        wakes.attach(r)
        s = r.session()
        bad = SendOptions(model="no-such-model")  # fails validation, before any row is written
        hook = Once(r, idle_while_owed(r), lambda: s.send("typo", options=bad))
        s.send("start")
        await reach(held.reached)
        await anyio.wait_all_tasks_blocked()
        assert (s.owes(), outcomes(r)) == (True, [])
        held.release()
        await r.settle()
        hook.check()
        kinds = await r.kinds()
    assert outcomes(r) == ["started"]
    assert starts(r) == [("send", 8), ("resume", 6)]
    assert kinds == [RowKind.USER, RowKind.ASSISTANT, RowKind.SENTINEL, RowKind.ASSISTANT]


# ---------------------------------------------------------------- ST-8 the claim


async def test_st8_r7_the_resume_claims_preparing_before_its_gates() -> None:
    gate = Gate()
    held = gate.hold("resume", 1)
    wakes = Wakes()
    async with session_rig(
        {"M": [T_("bash"), T_("task_await"), X("resumed"), X("answer to u")]},
        tools=[HookTool("task_await", before=wakes.queue)],
        gate=gate,
    ) as r:
        wakes.attach(r)
        s = r.session()
        claimed: list[tuple[Phase, bool, int]] = []
        hook = Once(
            r,
            resume_claimed(r),
            lambda: claimed.append((s.phase, s.owes(), gate.counts["resume"])),
        )
        s.send("start")
        await reach(held.reached)
        assert (s.phase, s.busy) == (Phase.PREPARING, True)
        delivery = await s.send("u", entry="u")  # the idle window is closed: u queues
        assert delivery.state is DeliveryState.QUEUED  # behind the resume, durably
        assert [e.entry for e in r.of(EntryQueued)][-1] == "u"
        assert [e.what for e in r.of(Persisted)].count("user-row") == 1  # only "start"'s
        held.release()
        await r.settle()
        hook.check()
    assert claimed == [(Phase.PREPARING, True, 0)]  # claimed in the sweep, before any gate
    assert starts(r) == [("send", 8), ("resume", 6), ("queue", 8)]


# ---------------------------------------------------------------- ST-9 launch checkpoints


async def test_st9_r34_a_resume_withdrawn_after_the_sentinel_deletes_it() -> None:
    store = TrapStore()
    held = store.arm("put_envelope", at=2, hold=True)
    wakes = Wakes()
    async with session_rig(
        incident("the next answer"),
        tools=[HookTool("task_await", before=wakes.queue)],
        store=store,
    ) as r:
        wakes.attach(r)
        s = r.session()
        s.send("start")
        await reach(held.reached)
        assert await r.kinds() == [RowKind.USER, RowKind.ASSISTANT, RowKind.SENTINEL]
        s.stop()
        held.release()
        await r.settle()
        assert await r.kinds() == [RowKind.USER, RowKind.ASSISTANT]
        s.send("next question")
        await r.settle()
    assert outcomes(r) == ["withdrawn"]
    assert starts(r) == [("send", 8), ("send", 8)]
    last = r.models["M"].requests[-1]
    assert "[CONTINUE]" not in [m.text for m in last.messages]


async def test_st9_r34_a_failed_envelope_write_leaves_no_sentinel() -> None:
    store = TrapStore()
    for n in (2, 3, 4):  # every resume's envelope write fails
        store.arm("put_envelope", at=n, fail=True)
    wakes = Wakes()
    async with session_rig(
        incident("the next answer"),
        tools=[HookTool("task_await", before=wakes.queue)],
        store=store,
    ) as r:
        wakes.attach(r)
        r.session().send("start")
        await r.settle()
        assert (outcomes(r), hows(r)) == (["failed", "failed", "failed"], ["forfeited"])
        kinds_after = await r.kinds()
        r.session().send("next question")
        await r.settle()
    assert kinds_after == [RowKind.USER, RowKind.ASSISTANT]
    last = r.models["M"].requests[-1]
    assert "[CONTINUE]" not in [m.text for m in last.messages]


# ---------------------------------------------------------------- ST-10 outcomes


async def test_st10_r4_r43_a_resume_failing_before_start_stays_owed_and_is_swept_again() -> None:
    gate = Gate(fail={"resume": (1,)})
    wakes = Wakes()
    seen: list[tuple[bool, int, Phase]] = []
    async with session_rig(
        incident(), tools=[HookTool("task_await", before=wakes.queue)], gate=gate
    ) as r:
        wakes.attach(r)
        s = r.session()
        hook = Once(
            r,
            lambda e: isinstance(e, ResumeAttempted) and e.outcome == "failed",
            lambda: seen.append((s.owes(), s.continuation.failed_attempts, s.phase)),
        )
        s.send("start")
        await r.settle()
        hook.check()
        assert s.continuation.failed_attempts == 0  # reset by the start
    assert seen == [(True, 1, Phase.PREPARING)]
    assert outcomes(r) == ["failed", "started"]
    assert gate.checks == ["send", "resume", "resume"]  # no outside event between the attempts
    assert starts(r) == [("send", 8), ("resume", 6)]  # the budget is unchanged
    assert hows(r) == ["consumed"]


async def test_st10_a_withdrawn_attempt_is_the_end_of_it() -> None:
    async with at_the_held_resume() as (r, held, gate):
        s = r.session()
        s.stop()
        held.release()
        await r.settle()
        assert (s.phase, s.owes(), s.continuation.failed_attempts) == (Phase.IDLE, False, 0)
    assert outcomes(r) == ["withdrawn"]
    assert gate.counts["resume"] == 1
    assert starts(r) == [("send", 8)]


# ---------------------------------------------------------------- ST-11 the cap's semantics


async def test_st11_r21_a_started_resume_resets_the_failed_attempt_count() -> None:
    gate = Gate(fail={"resume": (1, 2, 4, 5)})
    wakes = Wakes()
    async with session_rig(
        {"M": [T_("bash"), T_("task_await"), T_("task_await"), X("all done")]},
        tools=[HookTool("task_await", before=wakes.queue)],
        gate=gate,
    ) as r:
        wakes.attach(r)
        r.session().send("start")
        await r.settle()
    assert outcomes(r) == ["failed", "failed", "started", "failed", "failed", "started"]
    assert hows(r) == ["consumed", "consumed"]
    assert starts(r) == [("send", 8), ("resume", 6), ("resume", 5)]


async def test_st11_r21_four_legitimate_strandings_all_resume() -> None:
    wakes = Wakes()
    async with session_rig(
        {"M": [T_("bash"), *[T_("task_await")] * 4, X("all four passed")]},
        tools=[HookTool("task_await", before=wakes.queue)],
    ) as r:
        wakes.attach(r)
        r.session().send("start four monitored tasks and wait")
        await r.settle()
        rows = await r.history()
    assert outcomes(r) == ["started"] * 4
    assert starts(r) == [("send", 8), ("resume", 6), ("resume", 5), ("resume", 4), ("resume", 3)]
    assert hows(r) == ["consumed"] * 4
    assert text_of(rows[-1]) == "all four passed"


# ---------------------------------------------------------------- ST-12 the budget chain


async def test_st12_the_budget_chain_runs_8_5_3_then_the_cap_holds() -> None:
    wakes = Wakes()
    script = [T_("bash"), T_("bash"), T_("task_await")]  # cut after 3: 5 left
    script += [T_("bash"), T_("task_await")]  # cut after 2 more: 3 left
    script += [T_("bash"), T_("bash"), T_("task_await")]  # 3 more: the cap holds
    async with session_rig({"M": script}, tools=[HookTool("task_await", before=wakes.queue)]) as r:
        wakes.attach(r)
        r.session().send("start")
        await r.settle()
        assert not r.session().owes()
        rows = await r.history()
    assert starts(r) == [("send", 8), ("resume", 5), ("resume", 3)]
    assert [e.remaining for e in r.of(ContinuationOwed)] == [5, 3]
    assert [e.why.value for e in r.of(LoopStopped)] == [
        "queued-message",
        "queued-message",
        "step-cap",
    ]
    assert [e.remaining for e in r.of(StreamEnded)] == [5, 3, 0]
    assert {s: {q.step_ceiling for q in requests(r, s)} for s in ("s1/1", "s1/2", "s1/3")} == {
        "s1/1": {8},
        "s1/2": {5},
        "s1/3": {3},
    }
    assert r.models["M"].steps_played == 8
    assert outcomes(r) == ["started", "started"]
    assert [e.entry for e in r.of(EntryCanceled)] == ["w1", "w2", "w3"]
    assert msgspec.json.decode(rows[-1].body)["finish"] == "tool-calls"  # ends unanswered


# ---------------------------------------------------------------- ST-13 fallback continuity


async def test_st13_a_resume_keeps_walking_the_original_fallback_chain() -> None:
    wakes = Wakes()
    async with session_rig(
        {"A": [REFUSE], "B": [T_("task_await"), REFUSE], "C": [X("C finishes")]},
        tools=[HookTool("task_await", before=wakes.queue)],
        fallbacks={"A": ["B", "C"]},
        sessions=(("s1", "A"),),
    ) as r:
        wakes.attach(r)
        r.session().send("start")
        await r.settle()
        rows = await r.history()
    resumed = resume_stream(r)
    assert (resumed.model, resumed.budget) == ("B", 6)
    assert [(e.stream, e.from_, e.to, e.refused) for e in r.of(FellBack)] == [
        ("s1/1", "A", "B", ("A",)),
        (resumed.stream, "B", "C", ("A", "B")),
    ]
    assert [(q.stream, q.step_ceiling) for q in r.models["C"].requests] == [(resumed.stream, 5)]
    assert text_of(rows[-1]) == "C finishes"


# ---------------------------------------------------------------- ST-14 forensics


async def test_st14_r45_each_resume_logs_a_forensic_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="turnkeeper.session")
    wakes = Wakes()
    async with session_rig(
        incident(), tools=[HookTool("task_await", before=wakes.queue)], handles=((C, "s1"),)
    ) as r:
        wakes.attach(r)
        r.session().enqueue("delegated task", kind=EntryKind.SYSTEM, correlation=C)
        await r.settle()
    lines = [rec.getMessage() for rec in caplog.records if RESUME_LOG in rec.getMessage()]
    assert len(lines) == 1
    (line,) = lines
    assert "s1/1" in line
    assert "h1" in line  # the correlation
    assert re.search(r"\bM\b", line)  # the model
    assert re.search(r"\b6\b", line)  # the budget
    assert outcomes(r) == ["started"]
