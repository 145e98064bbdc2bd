"""In-stream restarts and errors: SM-16 to SM-20, R37 to R39, the refusal fallback chain."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from stream_manager import (
    AbortReason,
    Ended,
    ErrorKind,
    ErrorType,
    Failed,
    FellBack,
    FunctionModel,
    ModelError,
    ModelFallbackProgress,
    ScriptStep,
    ScriptToolCall,
    StreamFailed,
    TextPart,
    plan_hop,
)
from stream_manager.errors import NON_RETRYABLE, is_retryable
from tests.stream_manager.support import EMPTY, REFUSE, T_, X, rig

if TYPE_CHECKING:
    from stream_manager import ModelRequest

CHAIN = {"A": ["B", "C"]}


# ---------------------------------------------------------------- SM-16 / R37


async def test_sm16_zero_output_refusal_hops_to_the_first_fallback() -> None:
    """Zero-output refusal: no error; B's ceiling is the remainder (7); the hop is recorded."""
    r = rig({"A": [REFUSE], "B": [X("ok")], "C": []}, fallbacks=CHAIN)
    outcome = await r.manager.start_stream(r.request(model="A"))
    assert isinstance(outcome, Ended)
    assert outcome.model == "B"
    assert outcome.progress == ModelFallbackProgress(
        requested_model="A", refused_models=("A",), chain=("B", "C")
    )
    assert [q.step_ceiling for q in r.models["B"].requests] == [7]
    assert r.recorder.of(StreamFailed) == []
    (hop,) = r.recorder.of(FellBack)
    assert (hop.from_, hop.to, hop.refused) == ("A", "B", ("A",))


async def test_sm16_multi_hop_walks_the_chain_in_order() -> None:
    """A refuses, B refuses, C answers: the hops go in chain order; C's ceiling is 6."""
    r = rig({"A": [REFUSE], "B": [REFUSE], "C": [X()]}, fallbacks=CHAIN)
    outcome = await r.manager.start_stream(r.request(model="A"))
    assert isinstance(outcome, Ended)
    assert [(h.from_, h.to) for h in r.recorder.of(FellBack)] == [("A", "B"), ("B", "C")]
    assert [q.step_ceiling for q in r.models["C"].requests] == [6]
    assert outcome.progress.refused_models == ("A", "B")


async def test_sm16_chain_exhaustion_is_a_terminal_refusal() -> None:
    """Every model of the chain refuses: a terminal refusal, never retryable."""
    r = rig({"A": [REFUSE], "B": [REFUSE], "C": [REFUSE]}, fallbacks=CHAIN)
    outcome = await r.manager.start_stream(r.request(model="A"))
    assert isinstance(outcome, Failed)
    assert outcome.type is ErrorType.MODEL_REFUSAL
    assert outcome.kind is ErrorKind.TERMINAL
    assert outcome.message == "chain exhausted; refused A, B, C"
    assert not outcome.retryable


async def test_sm16_no_chain_means_a_terminal_refusal() -> None:
    r = rig({"A": [REFUSE]})
    outcome = await r.manager.start_stream(r.request(model="A"))
    assert isinstance(outcome, Failed)
    assert outcome.type is ErrorType.MODEL_REFUSAL
    assert "no fallback chain" in outcome.message


async def test_sm16_refusal_with_an_incomplete_tool_call_does_not_hop() -> None:
    """A tool call without its result, then a refusal: no hop; B is never asked."""
    step = ScriptStep(tool_calls=(ScriptToolCall(tool="bash"),), refuse=True)
    r = rig({"A": [step], "B": [X()]}, fallbacks={"A": ["B"]})
    outcome = await r.manager.start_stream(r.request(model="A"))
    assert isinstance(outcome, Failed)
    assert outcome.type is ErrorType.MODEL_REFUSAL
    assert "incomplete tool call" in outcome.message
    assert r.models["B"].requests == []


async def test_sm16_a_fallback_that_cannot_start_is_terminal() -> None:
    """The next model cannot be prepared (it is not registered)."""
    r = rig({"A": [REFUSE]}, fallbacks={"A": ["ghost"]})
    outcome = await r.manager.start_stream(r.request(model="A"))
    assert isinstance(outcome, Failed)
    assert outcome.type is ErrorType.MODEL_REFUSAL
    assert outcome.message == "fallback model 'ghost' could not be started"
    assert not outcome.retryable


async def test_sm16_refused_output_is_kept_as_the_streams_partial() -> None:
    r = rig(
        {"A": [ScriptStep(text="I'd rather not", refuse=True)], "B": [X("ok")]}, fallbacks=CHAIN
    )
    outcome = await r.manager.start_stream(r.request(model="A"))
    assert isinstance(outcome, Ended)
    texts = [p.text for p in outcome.parts if isinstance(p, TextPart)]
    assert texts == ["I'd rather not", "ok"]


async def test_r37_a_hop_runs_under_the_remainder() -> None:
    """A hop keeps the turn's budget: alpha spends 2 (tool step + refusal), beta ends at 3 of 8."""
    r = rig(
        {"alpha": [T_("bash"), REFUSE], "beta": [X("Done on beta.")], "gamma": []},
        fallbacks={"alpha": ["beta", "gamma"]},
    )
    outcome = await r.manager.start_stream(r.request(model="alpha"))
    assert isinstance(outcome, Ended)
    assert (outcome.steps, outcome.remaining) == (3, 5)
    assert [q.step_ceiling for q in r.models["beta"].requests] == [6]


async def test_r37_a_spent_budget_buys_no_hop() -> None:
    r = rig({"A": [T_("bash"), REFUSE], "B": [X()]}, fallbacks={"A": ["B"]})
    outcome = await r.manager.start_stream(r.request(model="A", step_budget=2))
    assert isinstance(outcome, Failed)
    assert outcome.type is ErrorType.MODEL_REFUSAL
    assert "budget is spent" in outcome.message
    assert outcome.remaining == 0
    assert r.models["B"].requests == []


def test_r37_plan_hop_order_of_checks() -> None:
    progress = ModelFallbackProgress(requested_model="A", chain=("B",))
    stopping = plan_hop(progress, "A", remaining=3, stopping=True, incomplete_tool_call=False)
    assert getattr(stopping, "note", "") == "refused while stopping"
    spent = plan_hop(progress, "A", remaining=0, stopping=False, incomplete_tool_call=False)
    assert "budget is spent" in getattr(spent, "note", "")
    hop = plan_hop(progress, "A", remaining=1, stopping=False, incomplete_tool_call=False)
    assert getattr(hop, "to", None) == "B"
    assert hop.progress.refused_models == ("A",)


async def test_r39_a_resumed_stream_continues_down_the_original_chain() -> None:
    """ST-13: resumed on B with A already refused; B's refusal goes to C, not B's own chain."""
    carried = ModelFallbackProgress(requested_model="A", refused_models=("A",), chain=("B", "C"))
    r = rig(
        {"A": [], "B": [REFUSE], "C": [X()], "Z": []},
        fallbacks={"B": ["Z"]},  # B's own chain must not be used
    )
    outcome = await r.manager.start_stream(
        r.request(model="B", fallback_progress=carried, step_budget=5)
    )
    assert isinstance(outcome, Ended)
    assert outcome.model == "C"
    assert outcome.progress.refused_models == ("A", "B")
    assert r.models["Z"].requests == []
    assert [q.step_ceiling for q in r.models["C"].requests] == [4]


# ---------------------------------------------------------------- SM-17


async def test_sm17_empty_output_is_retried_once_under_the_remainder() -> None:
    r = rig({"M": [T_("bash"), EMPTY, X("ok")]})
    outcome = await r.manager.start_stream(r.request())
    assert isinstance(outcome, Ended)
    assert (outcome.steps, outcome.remaining) == (2, 6)
    assert [q.step_ceiling for q in r.models["M"].requests] == [8, 8, 7]


async def test_sm17_a_second_empty_output_is_a_retryable_error() -> None:
    r = rig({"M": [EMPTY, EMPTY, X()]})
    outcome = await r.manager.start_stream(r.request())
    assert isinstance(outcome, Failed)
    assert outcome.type is ErrorType.EMPTY_OUTPUT
    assert outcome.retryable
    assert r.models["M"].steps_left == 1


async def test_sm17_an_empty_step_is_not_retried_while_a_soft_stop_is_pending() -> None:
    """The soft stop asked for during the step has no boundary to land at: no restart."""

    def empty_after_a_soft_stop(request: ModelRequest) -> ScriptStep:
        r.manager.request_stop_nowait("s1", soft=True, reason=AbortReason.QUEUED_MESSAGE)
        return EMPTY

    model = FunctionModel("S", empty_after_a_soft_stop)
    r = rig({}, extra_models={"S": model})
    outcome = await r.manager.start_stream(r.request(model="S", step_budget=5))
    assert isinstance(outcome, Failed)
    assert outcome.type is ErrorType.EMPTY_OUTPUT
    assert len(model.requests) == 1


# ---------------------------------------------------------------- SM-18


async def test_sm18_previous_response_retry_happens_once_under_the_remainder() -> None:
    def stale(request: ModelRequest) -> ScriptStep:
        """Fails its first two calls with "previous response not found", then answers."""
        if len(model.requests) <= 2:
            raise ModelError(ErrorType.PREVIOUS_RESPONSE_NOT_FOUND, "previous response gone")
        return ScriptStep(text="ok")

    model = FunctionModel("S", stale)
    r = rig({}, extra_models={"S": model})
    outcome = await r.manager.start_stream(r.request(model="S", step_budget=4))
    assert isinstance(outcome, Failed)  # the second failure is not retried again
    assert outcome.type is ErrorType.PREVIOUS_RESPONSE_NOT_FOUND
    assert [q.step_ceiling for q in model.requests] == [4, 4]


# ---------------------------------------------------------------- SM-19 / SM-20 / R38


@pytest.mark.parametrize(
    ("scripted", "error_type", "kind"),
    [
        ("retryable", ErrorType.PROVIDER_ERROR, ErrorKind.RETRYABLE),
        ("terminal", ErrorType.PROVIDER_REJECTED, ErrorKind.TERMINAL),
        ("context_exceeded", ErrorType.CONTEXT_EXCEEDED, ErrorKind.CONTEXT_EXCEEDED),
    ],
)
async def test_sm19_errors_are_categorised(
    scripted: str, error_type: ErrorType, kind: ErrorKind
) -> None:
    r = rig({"M": [ScriptStep(error=scripted)]})  # type: ignore[arg-type]
    outcome = await r.manager.start_stream(r.request())
    assert isinstance(outcome, Failed)
    assert (outcome.type, outcome.kind) == (error_type, kind)
    (event,) = r.recorder.of(StreamFailed)
    assert (event.kind, event.type) == (kind, error_type.value)


def test_sm19_non_retryable_types_match_the_spec() -> None:
    spec = {
        "authentication",
        "quota",
        "model_not_found",
        "context_exceeded",
        "aborted",
        "runtime_not_ready",
        "model_refusal",
    }
    assert spec <= {t.value for t in NON_RETRYABLE}
    for retryable in ("unknown", "runtime_start_failed", "stream_truncated", "empty_output"):
        assert is_retryable(ErrorType(retryable))


async def test_sm20_a_failed_attempt_reports_what_it_left() -> None:
    r = rig({"M": [T_("bash"), T_("bash"), ScriptStep(error="retryable")]})
    outcome = await r.manager.start_stream(r.request(step_budget=5))
    assert isinstance(outcome, Failed)
    assert outcome.remaining == 3
    (event,) = r.recorder.of(StreamFailed)
    assert event.remaining == 3


async def test_r38_a_failed_attempt_hands_on_the_model_and_progress_it_reached() -> None:
    r = rig({"A": [REFUSE], "B": [ScriptStep(error="retryable")]}, fallbacks={"A": ["B", "C"]})
    outcome = await r.manager.start_stream(r.request(model="A"))
    assert isinstance(outcome, Failed)
    assert outcome.model == "B"
    assert outcome.progress.refused_models == ("A",)
    assert outcome.remaining == 7


async def test_sm15_truncated_step_is_a_retryable_error() -> None:
    truncating = FunctionModel("T", lambda request: [TextPart(text="half a thought")])
    r = rig({}, extra_models={"T": truncating})
    outcome = await r.manager.start_stream(r.request(model="T"))
    assert isinstance(outcome, Failed)
    assert outcome.type is ErrorType.STREAM_TRUNCATED
    assert outcome.retryable
    assert outcome.remaining == 8
