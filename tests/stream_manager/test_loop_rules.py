"""The step loop's rules: SM-5 to SM-9, SM-15 and the stream-side R5, R15, R46, R60, R65.

Shell tests: the real StreamManager with ScriptedModels and fake tools we own. A "queued
tool-end entry" is a flag the test flips from inside a tool or an observer, exactly where the
session's queue would change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import pytest

from stream_manager import (
    Aborted,
    AbortReason,
    Completed,
    Constructed,
    Ended,
    Finish,
    FinishReason,
    FunctionModel,
    LoopStopped,
    Milestone,
    ModelRequest,
    NullHost,
    Part,
    QueuedStopReport,
    RequiredTools,
    ScriptedModel,
    ScriptStep,
    ScriptToolCall,
    Started,
    StepCompleted,
    StopWhy,
    StreamEnded,
    StreamInfo,
    StreamManager,
    StreamRequest,
    StreamState,
    TextPart,
    ToolCallEnded,
    ToolCallPart,
    ToolResultPart,
    VirtualClock,
    decide_stop,
    is_success,
)
from tests.stream_manager.support import T_, FakeTool, Host, P, X, rig

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@dataclass
class Queue:
    """Stands in for the session's live reader ``has_queued("tool-end")``."""

    tool_end: bool = False
    reports: list[QueuedStopReport] = field(default_factory=list)

    def has(self) -> bool:
        return self.tool_end

    def queue(self, _: object = None) -> None:
        self.tool_end = True


def call(tool: str, output: object) -> ScriptStep:
    return ScriptStep(tool_calls=(ScriptToolCall(tool=tool, args={"output": output}),))


# ---------------------------------------------------------------- SM-5 / SM-6


async def test_sm5_stop_waits_for_every_sibling_result() -> None:
    """Siblings: an entry queued after a's result does not cut b; the stop comes after the step."""
    q = Queue()
    a = FakeTool("a", before=q.queue)
    b = FakeTool("b")
    r = rig({"M": [T_("a", "b"), X()]}, tools=[a, b])
    outcome = await r.manager.start_stream(r.request(host=Host(queued=q.has)))
    assert isinstance(outcome, Ended)
    assert len(b.calls) == 1
    results = [p for p in outcome.parts if isinstance(p, ToolResultPart)]
    assert [p.name for p in results] == ["a", "b"]
    assert outcome.why is StopWhy.QUEUED_MESSAGE
    assert outcome.steps == 1
    assert outcome.remaining == 7
    assert not r.recorder.of(Aborted)


async def test_sm6_sibling_tools_run_one_at_a_time() -> None:
    gate = anyio.Event()
    running: list[str] = []
    overlap: list[tuple[str, ...]] = []

    def enter(part: ToolCallPart) -> None:
        running.append(part.name)
        overlap.append(tuple(running))

    a = FakeTool("a", before=enter, gate=gate)
    b = FakeTool("b", before=enter)
    r = rig({"M": [T_("a", "b"), X()]}, tools=[a, b])

    async def release_when_blocked() -> None:
        await anyio.wait_all_tasks_blocked()
        assert b.calls == []  # b has not started while a is still running
        running.remove("a")
        gate.set()

    async with anyio.create_task_group() as group:
        group.start_soon(release_when_blocked)
        outcome = await r.manager.start_stream(r.request())
    assert isinstance(outcome, Ended)
    assert overlap == [("a",), ("b",)]


# ---------------------------------------------------------------- SM-7


async def test_sm7_step_cap_stops_the_loop_at_the_ceiling() -> None:
    r = rig({"M": [T_("bash")] * 9}, max_stream_steps=8)
    outcome = await r.manager.start_stream(r.request())
    assert isinstance(outcome, Ended)
    assert outcome.steps == 8
    assert outcome.why is StopWhy.STEP_CAP
    assert outcome.finish is FinishReason.TOOL_CALLS
    assert r.models["M"].steps_left == 1


async def test_sm7_a_live_queued_tool_end_entry_stops_after_the_step() -> None:
    q = Queue()
    r = rig({"M": [T_("bash"), T_("bash"), X()]}, tools=[FakeTool("bash", before=q.queue)])
    outcome = await r.manager.start_stream(r.request(host=Host(queued=q.has)))
    assert isinstance(outcome, Ended)
    assert outcome.steps == 1
    assert outcome.why is StopWhy.QUEUED_MESSAGE


async def test_sm7_required_tool_success_ends_the_turn() -> None:
    """A successful required tool ends the turn, even with an entry queued."""
    q = Queue()
    report = FakeTool("agent_report", before=q.queue)
    r = rig(
        {"M": [T_("bash"), call("agent_report", {"success": True}), T_("bash")]},
        tools=[report],
    )
    reports: list[QueuedStopReport] = []
    outcome = await r.manager.start_stream(
        r.request(
            host=Host(queued=q.has, on_queued_stop=reports.append),
            required_tools=("agent_report",),
        )
    )
    assert isinstance(outcome, Ended)
    assert outcome.steps == 2
    assert outcome.why is StopWhy.REQUIRED_TOOL
    assert outcome.queued_stop is None
    assert reports == []


async def test_sm7_failed_required_tool_does_not_end_the_turn() -> None:
    """``success: false`` does not end the turn; a queued entry then cuts it, with a report."""
    q = Queue()
    report = FakeTool("agent_report", before=q.queue)
    r = rig(
        {"M": [T_("bash"), call("agent_report", {"success": False}), X()]},
        tools=[report],
    )
    reports: list[QueuedStopReport] = []
    outcome = await r.manager.start_stream(
        r.request(
            host=Host(queued=q.has, on_queued_stop=reports.append),
            required_tools=("agent_report",),
        )
    )
    assert isinstance(outcome, Ended)
    assert outcome.why is StopWhy.QUEUED_MESSAGE
    assert [x.steps_remaining for x in reports] == [6]


async def test_sm7_completion_kind_tools_are_required() -> None:
    from stream_manager import ToolKind

    done = FakeTool("finish_task", kind=ToolKind.COMPLETION, output={"ok": True})
    r = rig({"M": [call("finish_task", {"ok": True}), T_("bash")]}, tools=[done])
    outcome = await r.manager.start_stream(r.request())
    assert isinstance(outcome, Ended)
    assert outcome.why is StopWhy.REQUIRED_TOOL
    assert outcome.steps == 1


@pytest.mark.parametrize(
    ("name", "output", "stops"),
    [
        ("agent_report", {"success": True}, True),
        ("agent_report", {"ok": True}, True),
        ("chrome_shot", {"content": ["png"]}, True),
        ("chrome_shot", {"error": "x"}, False),
        ("chrome_shot", {"isError": True}, False),
        ("agent_reporter", {"success": True}, False),
        ("agent_report", "string", False),
        ("agent_report", {"success": False, "ok": True}, False),
        ("agent_report", {"success": 1}, False),
    ],
)
def test_sm7_required_tool_matching_rules(name: str, output: object, stops: bool) -> None:
    """Required tools match anchored full names (``^``/``$`` tolerated); the success rules."""
    required = RequiredTools(["^agent_report$", "chrome_shot"])
    result = ToolResultPart(call_id="c", name=name, output=output)
    assert required.satisfied_by([result]) is stops


def test_sm7_decision_precedence() -> None:
    assert (
        decide_stop(budget_exhausted=False, queued_tool_end=False, required_tool_satisfied=False)
        is None
    )
    cap = decide_stop(budget_exhausted=True, queued_tool_end=True, required_tool_satisfied=True)
    assert cap is not None
    assert cap.why is StopWhy.STEP_CAP
    required = decide_stop(
        budget_exhausted=False, queued_tool_end=True, required_tool_satisfied=True
    )
    assert required is not None
    assert required.why is StopWhy.REQUIRED_TOOL
    assert not required.reports_queued_stop
    queued = decide_stop(
        budget_exhausted=False, queued_tool_end=True, required_tool_satisfied=False
    )
    assert queued is not None
    assert queued.reports_queued_stop
    assert is_success({}) is True
    assert is_success([]) is False


# ---------------------------------------------------------------- SM-8 / R1 / R5 / R15 / R65


async def test_sm8_queued_stop_reported_before_stream_end() -> None:
    """A queued cut is reported once, synchronously, with model and remainder, before stream-end."""
    q = Queue()
    order: list[str] = []
    steps = 0

    def bash_hook(_: ToolCallPart) -> None:
        nonlocal steps
        steps += 1
        if steps == 2:
            q.queue()

    def on_stop(report: QueuedStopReport) -> None:
        order.append(f"report:{report.steps_remaining}")
        assert r.recorder.of(StreamEnded) == []

    r = rig({"M": [T_("bash")] * 3 + [X()]}, tools=[FakeTool("bash", before=bash_hook)])
    r.manager.add_observer(lambda e: order.append(type(e).__name__))
    outcome = await r.manager.start_stream(
        r.request(host=Host(queued=q.has, on_queued_stop=on_stop))
    )
    assert isinstance(outcome, Ended)
    assert outcome.steps == 2
    assert outcome.queued_stop == QueuedStopReport(
        stream=outcome.stream, model="M", steps_remaining=6, fallback_progress=outcome.progress
    )
    tail = order[order.index("LoopStopped") :]
    assert tail == ["LoopStopped", "report:6", "StreamEnded"]


@pytest.mark.parametrize("ending", ["step-cap", "required", "natural"])
async def test_sm8_no_report_for_cap_required_or_natural_ends(ending: str) -> None:
    q = Queue(tool_end=True)  # an entry is queued from the start
    reports: list[QueuedStopReport] = []
    required: tuple[str, ...] = ()
    if ending == "step-cap":
        script = [T_("bash")]
        budget: int | None = 1
    elif ending == "required":
        script = [call("agent_report", {"success": True})]
        required, budget = ("agent_report",), None
    else:
        script, budget = [X("hello")], None
    r = rig({"M": script}, tools=[FakeTool("agent_report")])
    outcome = await r.manager.start_stream(
        r.request(
            host=Host(queued=q.has, on_queued_stop=reports.append),
            required_tools=required,
            step_budget=budget,
        )
    )
    assert isinstance(outcome, Ended)
    assert outcome.queued_stop is None
    assert reports == []


async def test_r5_step_cap_coinciding_with_a_queued_entry_is_not_reported() -> None:
    """A step cap that coincides with a queued entry: the cap wins; resuming would run past
    the ceiling (as in ``docs/scenarios/step-cap-is-not-a-cut.toml``)."""
    q = Queue()
    count = 0

    def on_bash(_: ToolCallPart) -> None:
        nonlocal count
        count += 1
        if count == 8:
            q.queue()

    reports: list[QueuedStopReport] = []
    r = rig({"M": [T_("bash")] * 9}, tools=[FakeTool("bash", before=on_bash)])
    outcome = await r.manager.start_stream(
        r.request(host=Host(queued=q.has, on_queued_stop=reports.append))
    )
    assert isinstance(outcome, Ended)
    assert outcome.steps == 8
    assert outcome.remaining == 0
    assert outcome.why is StopWhy.STEP_CAP
    assert reports == []
    assert [e.why for e in r.recorder.of(LoopStopped)] == [StopWhy.STEP_CAP]


async def test_r65_a_cut_that_spends_the_last_step_owes_nothing() -> None:
    q = Queue(tool_end=True)
    reports: list[QueuedStopReport] = []
    r = rig({"M": [T_("bash"), T_("bash"), T_("bash")]})
    outcome = await r.manager.start_stream(
        r.request(host=Host(queued=q.has, on_queued_stop=reports.append), step_budget=1)
    )
    assert isinstance(outcome, Ended)
    assert outcome.remaining == 0
    assert reports == []


async def test_r15_report_carries_the_model_that_ran_the_cut_step() -> None:
    q = Queue()
    r = rig(
        {"A": [ScriptStep(refuse=True)], "B": [T_("bash"), X()]},
        tools=[FakeTool("bash", before=q.queue)],
        fallbacks={"A": ["B"]},
    )
    reports: list[QueuedStopReport] = []
    outcome = await r.manager.start_stream(
        r.request(model="A", host=Host(queued=q.has, on_queued_stop=reports.append))
    )
    assert isinstance(outcome, Ended)
    (report,) = reports
    assert report.model == "B"
    assert report.steps_remaining == 6  # the refused step counts
    assert report.fallback_progress.refused_models == ("A",)


# ---------------------------------------------------------------- SM-9 / SM-10 / R46 / R59


async def test_sm9_a_step_cut_mid_flight_counts_as_spent() -> None:
    """A provider-tool soft stop lands at text-end inside step 2; both steps count."""
    r = rig({"M": [T_("bash"), P("web_search"), X()]})

    def soft_stop_on_provider_result(event: object) -> None:
        if isinstance(event, ToolCallEnded) and event.provider:
            r.manager.request_stop_nowait("s1", soft=True, reason=AbortReason.QUEUED_MESSAGE)

    r.manager.add_observer(soft_stop_on_provider_result)
    outcome = await r.manager.start_stream(r.request())
    assert isinstance(outcome, Aborted)
    assert outcome.reason is AbortReason.QUEUED_MESSAGE
    assert outcome.metadata.steps_remaining == 6
    assert outcome.metadata.model == "M"
    assert outcome.metadata.required_tool_satisfied is False
    assert [e.n for e in r.recorder.of(StepCompleted)] == [1]  # step 2 never finished


async def test_sm10_soft_stop_lands_at_the_next_text_end() -> None:
    stop_requested = False

    def stop_during_tool(_: ToolCallPart) -> None:
        nonlocal stop_requested
        stop_requested = True
        r.manager.request_stop_nowait("s1", soft=True, reason=AbortReason.QUEUED_MESSAGE)

    r = rig(
        {"M": [T_("bash"), ScriptStep(text="partial", hang=True)]},
        tools=[FakeTool("bash", before=stop_during_tool)],
    )
    outcome = await r.manager.start_stream(r.request())
    assert stop_requested
    assert isinstance(outcome, Aborted)
    assert outcome.reason is AbortReason.QUEUED_MESSAGE
    assert outcome.metadata.steps_remaining == 6
    texts = [getattr(p, "text", None) for p in outcome.parts]
    assert "partial" in texts


async def test_r46_abort_reports_a_required_tool_satisfied_in_the_cut_step() -> None:
    r = rig({"M": [P("agent_report", result={"success": True}), X()]})

    def soft_stop(event: object) -> None:
        if isinstance(event, ToolCallEnded) and event.provider:
            r.manager.request_stop_nowait("s1", soft=True, reason=AbortReason.QUEUED_MESSAGE)

    r.manager.add_observer(soft_stop)
    outcome = await r.manager.start_stream(r.request(required_tools=("agent_report",)))
    assert isinstance(outcome, Aborted)
    assert outcome.metadata.required_tool_satisfied is True


async def test_r59_abort_metadata_names_the_effective_model() -> None:
    """Usage under the effective model: after a hop to B, a soft-stop abort is accounted under B."""
    r = rig(
        {"A": [ScriptStep(refuse=True)], "B": [T_("bash"), P("web"), X()]},
        fallbacks={"A": ["B"]},
    )

    def soft_stop(event: object) -> None:
        if isinstance(event, ToolCallEnded) and event.provider:
            r.manager.request_stop_nowait("s1", soft=True, reason=AbortReason.QUEUED_MESSAGE)

    r.manager.add_observer(soft_stop)
    outcome = await r.manager.start_stream(r.request(model="A"))
    assert isinstance(outcome, Aborted)
    assert outcome.metadata.model == "B"
    assert outcome.metadata.fallback_progress.refused_models == ("A",)
    assert outcome.metadata.steps_remaining == 5


# ---------------------------------------------------------------- SM-15 / R60


async def test_sm15_completion_order_and_the_durable_cut_record() -> None:
    q = Queue()
    r = rig({"M": [T_("bash"), X()]}, tools=[FakeTool("bash", before=q.queue)])
    states: list[tuple[str, object]] = []

    def watch(event: object) -> None:
        if isinstance(event, LoopStopped | StreamEnded):
            states.append((type(event).__name__, r.manager.stream_state("s1")))

    r.manager.add_observer(watch)
    outcome = await r.manager.start_stream(r.request(host=Host(queued=q.has)))
    assert isinstance(outcome, Ended)
    assert [name for name, _ in states] == ["LoopStopped", "StreamEnded"]
    assert str(states[1][1]) == "completed"  # COMPLETED is set before stream-end is emitted
    assert outcome.queued_stop is not None  # R60: the cut record rides on the final message
    assert r.manager.active_stream_id("s1") is None


async def test_r60_cut_record_carries_remainder_and_progress() -> None:
    q = Queue()
    r = rig(
        {"A": [ScriptStep(refuse=True)], "B": [T_("bash")]},
        tools=[FakeTool("bash", before=q.queue)],
        fallbacks={"A": ["B", "C"]},
    )
    outcome = await r.manager.start_stream(r.request(model="A", host=Host(queued=q.has)))
    assert isinstance(outcome, Ended)
    assert outcome.queued_stop is not None
    assert outcome.queued_stop.steps_remaining == 6
    assert outcome.queued_stop.fallback_progress.chain == ("B", "C")
    assert outcome.queued_stop.fallback_progress.refused_models == ("A",)
    assert outcome.finish is FinishReason.TOOL_CALLS


# ---------------------------------------------------------------- the host (SM-3, SM-8, SM-15)


async def test_sm3_sm8_sm15_the_host_hears_the_stream_in_order() -> None:
    """Milestones and the cut report arrive in the stream's order, between its trace events."""
    q = Queue()
    order: list[str] = []
    at_completed: list[object] = []

    class Ordered(Host):
        def queued_stop(self, report: QueuedStopReport) -> None:
            order.append("queued_stop")
            super().queued_stop(report)

        async def reached(self, milestone: Milestone) -> None:
            order.append(type(milestone).__name__)
            if isinstance(milestone, Completed):
                at_completed.append(r.manager.stream_state("s1"))
            await super().reached(milestone)

    r = rig({"M": [T_("bash"), X()]}, tools=[FakeTool("bash", before=q.queue)])
    r.manager.add_observer(lambda e: order.append(type(e).__name__))
    host = Ordered(queued=q.has)
    outcome = await r.manager.start_stream(r.request(host=host))
    assert isinstance(outcome, Ended)
    shown = {"Constructed", "StreamStarted", "Started", "LoopStopped", "queued_stop"}
    shown |= {"Completed", "StreamEnded"}
    assert [name for name in order if name in shown] == [
        "Constructed",
        "StreamStarted",
        "Started",
        "LoopStopped",
        "queued_stop",
        "Completed",
        "StreamEnded",
    ]
    assert order.index("Started") < order.index("ToolCallStarted")  # before the first step
    assert at_completed == [StreamState.COMPLETED]
    constructed, started, completed = host.milestones
    info = StreamInfo(session="s1", stream=outcome.stream, model="M", budget=8)
    assert constructed == Constructed(info)
    assert started == Started(info)
    assert completed == Completed(outcome)


async def test_the_host_is_asked_for_the_thinking_level_before_every_step() -> None:
    """A mid-turn change reaches the next step's request."""
    levels = iter(["low", "high"])
    r = rig({"M": [T_("bash"), X()]})
    outcome = await r.manager.start_stream(r.request(host=Host(thinking=lambda: next(levels))))
    assert isinstance(outcome, Ended)
    assert [m.thinking_level for m in r.models["M"].requests] == ["low", "high"]


async def test_a_request_without_a_host_has_the_null_host() -> None:
    """No thinking level, never a queued entry or a refusal; the stream runs to its end."""
    r = rig({"M": [T_("bash"), X()]})
    request = r.request()
    assert isinstance(request.host, NullHost)
    outcome = await r.manager.start_stream(request)
    assert isinstance(outcome, Ended)
    assert (outcome.steps, outcome.why, outcome.queued_stop) == (2, StopWhy.FINISHED, None)
    assert [m.thinking_level for m in r.models["M"].requests] == [None, None]


async def test_a_scripted_model_without_recording_keeps_no_request() -> None:
    """The benchmarks' double: it plays the same script and holds no request."""
    clock = VirtualClock()
    model = ScriptedModel("M", [X("one")], clock=clock, record=False)
    manager = StreamManager(models={"M": model}, clock=clock)
    outcome = await manager.start_stream(StreamRequest(session="s", model="M", messages=()))
    assert isinstance(outcome, Ended)
    assert model.steps_played == 1
    assert model.requests == []


async def _parts(stream: AsyncIterator[Part]) -> list[Part]:
    return [part async for part in stream]


async def test_a_function_model_plays_a_step_as_the_scripted_model_does() -> None:
    """The same step gives the same parts; a call's overrides go to the registry, not the call."""
    step = ScriptStep(
        reasoning="hm",
        text="t",
        tool_calls=(
            ScriptToolCall(tool="a", behaviour={"hang": True}),
            ScriptToolCall(tool="web", provider_executed=True, result="r"),
        ),
    )
    request = ModelRequest(model="M", stream="s1/1", step=1, step_ceiling=8, messages=())
    scripted = ScriptedModel("M", [step])
    function = FunctionModel("M", lambda _: step)
    parts = await _parts(function.stream_step(request))
    assert parts == await _parts(scripted.stream_step(request))
    assert [type(p).__name__ for p in parts] == [
        "ReasoningPart",
        "ToolCallPart",
        "ToolResultPart",
        "TextPart",
        "ToolCallPart",
        "Finish",
    ]
    assert function.behaviours.of("s1/1/1/c0") == {"hang": True}
    assert function.behaviours.of("s1/1/1/c1") == {}
    assert function.requests == [request]


async def test_a_function_model_decides_each_step_from_the_request() -> None:
    """Call a tool, then answer with what the tool returned (the last tool result it was sent)."""

    def decide(request: ModelRequest) -> ScriptStep | list[Part]:
        if request.step == 1:
            return call("bash", "42")
        (result,) = request.messages[-1].tool_results
        return [TextPart(text=f"it said {result.output}"), Finish(reason=FinishReason.STOP)]

    r = rig({}, extra_models={"F": FunctionModel("F", decide)})
    outcome = await r.manager.start_stream(r.request(model="F"))
    assert isinstance(outcome, Ended)
    assert [type(p).__name__ for p in outcome.parts][-2:] == ["TextPart", "Finish"]
    assert TextPart(text="it said 42") in outcome.parts
