"""The step budget of one logical turn, as a property (R37, R65, ST-12, SM-9, SM-16 to SM-18).

"For any sequence of cuts, hops, empty-output retries and continuations of one turn, the steps
taken never exceed the ceiling, no restart refills it, and nothing starts with zero left."

Two levels. The pure one drives ``initial_budget``, ``StepBudget``, ``plan_hop`` and
``decide_stop`` with generated event sequences, the way the loop and the session use them. The
shell one generates whole turns (streams of scripted tool calls, refusals down a configured
chain, empty steps, provider errors and text), runs them through ``StreamManager`` over
ScriptedModels, continues every cut (and every retryable failure) with what the outcome
left, and audits the ordered record of events and model requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from persistence import UsageError
from stream_manager import (
    Ended,
    Failed,
    FinishReason,
    Hop,
    LaunchRefused,
    ModelFallbackProgress,
    ModelRequest,
    NoHop,
    Refused,
    ScriptedModel,
    ScriptStep,
    StartCause,
    StepBudget,
    StepCompleted,
    StopWhy,
    StreamEvent,
    StreamManager,
    StreamOutcome,
    StreamRequest,
    StreamStarted,
    VirtualClock,
    decide_stop,
    initial_budget,
    plan_hop,
    start_progress,
)
from tests.stream_manager.support import EMPTY, REFUSE, T_, FakeTool, Host, X, rig, user_messages

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from stream_manager import Part

MAX_CEILING = 10

# ---------------------------------------------------------------------------------------------
# (a) pure: the decision functions, driven the way the loop and the session drive them

#: ``tool``: a tool step, no stop; ``cut``: a tool step with a queued tool-end entry;
#: ``text``: a text-only step (the loop ends naturally); ``refuse``: a refused step;
#: ``empty``: a completion with zero parts; ``error``: a retryable provider error (no step
#: completed); ``abort``: a queued-message soft stop cutting a step mid-flight (SM-9).
Event = Literal["tool", "cut", "text", "refuse", "empty", "error", "abort"]
EVENTS: tuple[Event, ...] = ("tool", "cut", "text", "refuse", "empty", "error", "abort")


@dataclass
class PureTurn:
    """One logical turn, simulated over the pure functions."""

    max_steps: int
    chains: dict[str, tuple[str, ...]]
    budget: StepBudget
    progress: ModelFallbackProgress
    model: str = "M"
    #: Completed steps across every stream of the turn.
    spent: int = 0
    #: The ceiling the current loop was started with, and its completed steps.
    loop_ceiling: int = 0
    in_loop: int = 0
    empty_retries: int = 0
    over: bool = False
    #: The ceiling of every stream the turn started, in order.
    ceilings: list[int] = field(default_factory=list)

    @classmethod
    def fresh(cls, max_steps: int, chain: tuple[str, ...]) -> PureTurn:
        chains = {"M": chain}
        turn = cls(
            max_steps=max_steps,
            chains=chains,
            budget=initial_budget(None, max_steps),
            progress=start_progress("M", chains),
        )
        turn.start_loop()
        turn.ceilings.append(turn.budget.ceiling)
        return turn

    def start_loop(self) -> None:
        """An in-stream restart (or a stream's first loop): it runs under the remainder."""
        assert self.budget.remaining >= 1, "a loop (re)started with nothing left"
        self.loop_ceiling = self.budget.remaining
        self.in_loop = 0

    def charge(self) -> None:
        self.budget = self.budget.charge()
        self.spent += 1
        self.in_loop += 1

    def continue_turn(self) -> None:
        """A cut's resume or a failure's auto-retry: a new stream under what is left."""
        remaining = self.budget.remaining
        successor = initial_budget(remaining, self.max_steps)
        assert successor.ceiling == remaining, "a continuation refilled the budget"
        assert successor.spent == 0
        if successor.exhausted:  # R65: nothing is registered, nothing starts
            assert remaining == 0
            self.over = True
            return
        carried = start_progress(self.model, self.chains, self.progress)
        assert carried is self.progress, "a continuation resolved a new chain (ST-13)"
        self.budget = successor
        self.empty_retries = 0
        self.ceilings.append(successor.ceiling)
        self.start_loop()

    def tool_boundary(self, *, queued: bool) -> None:
        self.charge()
        decision = decide_stop(
            budget_exhausted=self.budget.exhausted,
            queued_tool_end=queued,
            required_tool_satisfied=False,
        )
        if decision is None:
            return
        if decision.reports_queued_stop:
            assert self.budget.remaining >= 1, "a cut reported with nothing left (R65)"
            self.continue_turn()
            return
        assert decision.why is StopWhy.STEP_CAP
        assert self.budget.remaining == 0
        self.over = True

    def refusal(self) -> None:
        self.charge()  # a refused step is a completed step (SM-9)
        decision = plan_hop(
            self.progress,
            self.model,
            remaining=self.budget.remaining,
            stopping=False,
            incomplete_tool_call=False,
        )
        self.progress = decision.progress
        if isinstance(decision, Hop):
            assert self.budget.remaining > 0, "a spent budget bought a hop (R37)"
            self.model = decision.to
            self.start_loop()
        else:
            self.over = True  # model_refusal is terminal

    def empty(self) -> None:
        if self.empty_retries < 1 and self.budget.remaining > 0:
            self.empty_retries += 1
            self.start_loop()  # SM-17: once, under the remainder
        else:
            self.continue_turn()  # a retryable empty_output error, auto-retried (R36)

    def apply(self, event: Event) -> None:
        assert not self.over
        assert self.budget.remaining >= 1, "a step was asked for with nothing left"
        if event in ("tool", "cut"):
            self.tool_boundary(queued=event == "cut")
        elif event == "text":
            self.charge()
            self.over = True
        elif event == "refuse":
            self.refusal()
        elif event == "empty":
            self.empty()
        elif event == "error":
            self.continue_turn()
        else:  # "abort": the cut step counts (SM-9); R65 on the abort path too
            self.charge()
            self.continue_turn()

    def check(self) -> None:
        assert self.spent <= self.max_steps
        # Conservation: what the turn spent plus what its current stream has left is exactly
        # the turn's ceiling. A refill would make it larger; nothing may make it smaller.
        assert self.spent + self.budget.remaining == self.max_steps
        # The current loop can never reach past the turn's ceiling.
        assert self.loop_ceiling - self.in_loop == self.budget.remaining
        assert self.ceilings == sorted(self.ceilings, reverse=True)


@settings(max_examples=500)
@given(
    max_steps=st.integers(1, MAX_CEILING),
    chain=st.lists(st.sampled_from(["F1", "F2", "F3"]), unique=True, max_size=3).map(tuple),
    events=st.lists(st.sampled_from(EVENTS), max_size=40),
)
def test_r37_no_restart_refills_the_budget_property(
    max_steps: int, chain: tuple[str, ...], events: list[Event]
) -> None:
    turn = PureTurn.fresh(max_steps, chain)
    turn.check()
    for event in events:
        if turn.over:
            break
        turn.apply(event)
        turn.check()
    assert turn.spent <= max_steps
    if turn.budget.exhausted:
        with pytest.raises(UsageError):
            turn.budget.charge()


@settings(max_examples=300)
@given(
    chain=st.lists(st.sampled_from(["F1", "F2", "F3"]), unique=True, max_size=3).map(tuple),
    refused=st.lists(st.sampled_from(["M", "F1", "F2", "F3"]), max_size=4).map(tuple),
    refusing=st.sampled_from(["M", "F1", "F2", "F3"]),
    remaining=st.integers(-1, 5),
    stopping=st.booleans(),
    incomplete=st.booleans(),
)
def test_r37_a_spent_budget_buys_no_hop_property(
    chain: tuple[str, ...],
    refused: tuple[str, ...],
    refusing: str,
    remaining: int,
    stopping: bool,
    incomplete: bool,
) -> None:
    progress = ModelFallbackProgress(requested_model="M", refused_models=refused, chain=chain)
    decision = plan_hop(
        progress, refusing, remaining=remaining, stopping=stopping, incomplete_tool_call=incomplete
    )
    after = decision.progress
    assert after.refused_models == (*refused, refusing)
    assert (after.requested_model, after.chain) == ("M", chain)  # R39: the original chain
    if remaining <= 0 or stopping or incomplete:
        assert isinstance(decision, NoHop)
    if isinstance(decision, Hop):
        assert remaining > 0
        assert decision.to == chain[len(refused)]


@settings(max_examples=200)
@given(
    ceiling=st.integers(0, MAX_CEILING),
    spent=st.integers(0, MAX_CEILING),
    queued=st.booleans(),
    required=st.booleans(),
)
def test_r65_a_reported_cut_always_leaves_a_step_property(
    ceiling: int, spent: int, queued: bool, required: bool
) -> None:
    budget = StepBudget(ceiling=ceiling, spent=min(spent, ceiling))
    decision = decide_stop(
        budget_exhausted=budget.exhausted, queued_tool_end=queued, required_tool_satisfied=required
    )
    if decision is not None and decision.reports_queued_stop:
        assert budget.remaining >= 1
        assert not initial_budget(budget.remaining, MAX_CEILING).exhausted
    if budget.exhausted:
        assert decision is not None
        assert decision.why is StopWhy.STEP_CAP


# ---------------------------------------------------------------------------------------------
# (b) through the shell: generated turns run by StreamManager over ScriptedModels

Kind = Literal["tool", "refuse", "empty", "text", "error"]
#: Tool steps weighted up so that turns run long enough to meet their ceiling.
KINDS: tuple[Kind, ...] = ("tool", "tool", "tool", "tool", "refuse", "empty", "text", "error")
MODELS = ("M", "F1", "F2")


def _script_step(kind: Kind) -> ScriptStep:
    if kind == "tool":
        return T_("bash")
    if kind == "refuse":
        return REFUSE
    if kind == "empty":
        return EMPTY
    if kind == "text":
        return X("done")
    return ScriptStep(error="retryable")


@dataclass(frozen=True)
class ShellTurn:
    """A generated turn: the ceiling, M's chain, each model's script, the queued-entry reads."""

    max_steps: int
    chain: tuple[str, ...]
    scripts: dict[str, list[Kind]]
    #: The answers of successive ``has_queued_tool_end`` reads (then ``False``).
    queued: list[bool]


@st.composite
def shell_turns(draw: st.DrawFn) -> ShellTurn:
    return ShellTurn(
        max_steps=draw(st.integers(1, MAX_CEILING)),
        chain=draw(st.sampled_from([(), ("F1",), ("F1", "F2")])),
        scripts={m: draw(st.lists(st.sampled_from(KINDS), max_size=12)) for m in MODELS},
        queued=draw(st.lists(st.booleans(), max_size=16)),
    )


class Stamped:
    """A ScriptedModel whose requests also go, in order, onto the turn's shared timeline."""

    def __init__(self, inner: ScriptedModel, timeline: list[ModelRequest | StreamEvent]) -> None:
        self.inner = inner
        self._timeline = timeline

    @property
    def id(self) -> str:
        return self.inner.id

    def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        self._timeline.append(request)
        return self.inner.stream_step(request)


@dataclass
class Played:
    timeline: list[ModelRequest | StreamEvent]
    models: dict[str, ScriptedModel]
    outcomes: list[StreamOutcome]
    #: The outcome of starting the turn once more with nothing left, when it ended at zero.
    zero_start: StreamOutcome | None = None


#: Streams one generated turn may run (each consumes at least one scripted step).
STREAM_LIMIT = 3 * 12 + 3


async def play(turn: ShellTurn) -> Played:
    """Run ``turn`` as the session would: continue every cut and retryable failure."""
    clock = VirtualClock()
    timeline: list[ModelRequest | StreamEvent] = []
    scripted = {
        # The trailing text step ends the turn once a script's generated steps are spent.
        name: ScriptedModel(name, [*map(_script_step, kinds), X("end")], clock=clock)
        for name, kinds in turn.scripts.items()
    }
    manager = StreamManager(
        models={name: Stamped(model, timeline) for name, model in scripted.items()},
        tools={"bash": FakeTool("bash")},
        clock=clock,
        fallbacks={"M": turn.chain},
        max_stream_steps=turn.max_steps,
        observers=[timeline.append],
    )
    reads: Iterator[bool] = iter(turn.queued)

    def has_queued_tool_end() -> bool:
        return next(reads, False)

    host = Host(queued=has_queued_tool_end)

    played = Played(timeline, scripted, [])
    model, cause = "M", StartCause.SEND
    step_budget: int | None = None
    progress: ModelFallbackProgress | None = None
    for _ in range(STREAM_LIMIT):
        outcome = await manager.start_stream(
            StreamRequest(
                session="s1",
                model=model,
                messages=user_messages(),
                cause=cause,
                step_budget=step_budget,
                fallback_progress=progress,
                host=host,
            )
        )
        played.outcomes.append(outcome)
        if isinstance(outcome, Ended) and outcome.queued_stop is not None:
            cut = outcome.queued_stop
            assert (cut.steps_remaining, cut.model) == (outcome.remaining, outcome.model)
            assert cut.fallback_progress == outcome.progress
            cause = StartCause.RESUME
        elif isinstance(outcome, Failed) and outcome.retryable and outcome.remaining > 0:
            cause = StartCause.RETRY  # R36: the retry runs under the remainder
        else:
            break
        model, step_budget, progress = outcome.model, outcome.remaining, outcome.progress
    else:
        raise AssertionError(f"the turn ran more than {STREAM_LIMIT} streams")
    last = played.outcomes[-1]
    if isinstance(last, Ended | Failed) and last.remaining == 0:
        played.zero_start = await manager.start_stream(
            StreamRequest(
                session="s1",
                model=last.model,
                messages=user_messages(),
                cause=StartCause.RESUME,
                step_budget=0,
                fallback_progress=last.progress,
                host=host,
            )
        )
    return played


def audit(turn: ShellTurn, played: Played) -> int:
    """Walk the ordered record of the turn; return the steps it completed."""
    spent = 0
    in_loop = 0
    stream: str | None = None
    previous: ModelRequest | None = None
    for item in played.timeline:
        left = turn.max_steps - spent
        if isinstance(item, StreamStarted):
            assert item.budget >= 1, f"a stream started with {item.budget} left (R65)"
            assert item.budget == left, f"stream {item.stream} refilled the budget to {item}"
            stream, previous = item.stream, None
        elif isinstance(item, StepCompleted):
            spent += 1
            in_loop += 1
            assert spent <= turn.max_steps, "the turn took more steps than its ceiling"
        elif isinstance(item, ModelRequest):
            assert item.stream == stream
            assert left >= 1, f"{item.model} was asked for a step with nothing left"
            # A loop starts with its stream, after a hop (the model changes) and after an
            # empty-output retry (no step completed, so the step number repeats).
            if previous is None or previous.model != item.model or previous.step == item.step:
                in_loop = 0
                assert item.step_ceiling == left, f"a (re)started loop got ceiling {item}"
            # SM-18: a loop counts its own steps, so what it still allows is its ceiling less
            # what it has run; that must be exactly what the turn has left.
            assert item.step_ceiling - in_loop == left, item
            previous = item
        elif isinstance(item, LaunchRefused):
            assert played.zero_start is not None
    return spent


@settings(max_examples=300)
@given(turn=shell_turns())
def test_st12_budget_chain_never_exceeds_ceiling_property(turn: ShellTurn) -> None:
    played = anyio.run(play, turn)
    spent = audit(turn, played)

    assert spent <= turn.max_steps
    asked = [item for item in played.timeline if isinstance(item, ModelRequest)]
    recorded = [request for model in played.models.values() for request in model.requests]
    assert sorted(map(id, asked)) == sorted(map(id, recorded))
    for outcome in played.outcomes:
        assert isinstance(outcome, Ended | Failed), outcome
        if isinstance(outcome, Ended) and outcome.queued_stop is not None:
            assert outcome.why is StopWhy.QUEUED_MESSAGE
            assert outcome.queued_stop.steps_remaining >= 1  # R65
        if isinstance(outcome, Ended) and outcome.why is StopWhy.STEP_CAP:
            assert outcome.remaining == 0
            assert outcome.queued_stop is None
    last = played.outcomes[-1]
    assert isinstance(last, Ended | Failed)
    # R37/R36/ST-12: no restart refilled the turn, and nothing was lost either.
    assert spent + last.remaining == turn.max_steps
    if played.zero_start is not None:
        assert isinstance(played.zero_start, Refused)
        assert isinstance(played.timeline[-1], LaunchRefused)
        assert not isinstance(played.timeline[-2], StreamStarted)


# ---------------------------------------------------------------------------------------------
# R65 and ST-12, as plain examples


@pytest.mark.parametrize("progress", [None, ModelFallbackProgress(requested_model="M")])
async def test_r65_nothing_starts_with_zero_left(progress: ModelFallbackProgress | None) -> None:
    r = rig({"M": [T_("bash"), X("done")]}, fallbacks={"M": ["F"]})
    outcome = await r.manager.start_stream(
        r.request(step_budget=0, fallback_progress=progress, cause=StartCause.RESUME)
    )
    assert isinstance(outcome, Refused)
    assert r.recorder.names() == ["launch-refused"]
    assert r.recorder.of(StreamStarted) == []
    assert r.models["M"].requests == []
    assert r.manager.active_stream_id("s1") is None
    assert initial_budget(0, 8).exhausted
    with pytest.raises(UsageError):
        initial_budget(0, 8).charge()


async def test_st12_r65_the_budget_chain_example() -> None:
    """ST-12, by example: cut after 3 -> 5 left, cut after 2 -> 3 left, 3 more -> step cap."""
    r = rig({"M": [T_("bash")] * 8}, max_stream_steps=8)
    reads = iter([False, False, True, False, True, False, False, True])
    budgets: list[int | None] = [None]
    outcomes: list[Ended] = []
    progress: ModelFallbackProgress | None = None
    for _ in range(3):
        outcome = await r.manager.start_stream(
            r.request(
                step_budget=budgets[-1],
                fallback_progress=progress,
                host=Host(queued=lambda: next(reads)),
            )
        )
        assert isinstance(outcome, Ended), outcome
        outcomes.append(outcome)
        budgets.append(outcome.remaining)
        progress = outcome.progress
    assert [(o.steps, o.remaining, o.why) for o in outcomes] == [
        (3, 5, StopWhy.QUEUED_MESSAGE),
        (2, 3, StopWhy.QUEUED_MESSAGE),
        (3, 0, StopWhy.STEP_CAP),  # the entry is still queued, but a zero remainder owes nothing
    ]
    assert [o.queued_stop.steps_remaining if o.queued_stop else None for o in outcomes] == [
        5,
        3,
        None,
    ]
    assert outcomes[-1].finish is FinishReason.TOOL_CALLS
    assert [e.budget for e in r.recorder.of(StreamStarted)] == [8, 5, 3]
    assert [request.step_ceiling for request in r.models["M"].requests] == [8] * 3 + [5] * 2 + [
        3
    ] * 3
    assert next(reads, None) is None
    zero = await r.manager.start_stream(r.request(step_budget=0, fallback_progress=progress))
    assert isinstance(zero, Refused)
    assert len(r.recorder.of(StreamStarted)) == 3
