"""Every call of an aborted stream is answered in its partial row (``stream_manager._op_answers``).

A Stop that lands while the model is still streaming a step leaves that step's calls unmade:
the partial says so; a call that reached the runner is answered from its receipt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from agent_session._rows import decode_body
from persistence import OperationRecord, OpState, RowKind
from stream_manager import ModelRequest, Part, TextPart, ToolCallPart
from stream_manager._op_answers import receipt_answer, unanswered_calls
from tests.agent_session.support import session_rig
from tests.persistence.helpers import client

CALL = ToolCallPart(call_id="s1/1/1/c0", name="write_file", args={"path": "a.txt"})


def _record(state: OpState, *, acknowledged: bool) -> OperationRecord:
    return OperationRecord(
        op_id="s1/1/1/0",
        session="s1",
        stream="s1/1",
        call_id=CALL.call_id,
        capability=client("write_file"),
        target="client:write_file#77",
        started_at=12.0,
        state=state,
        termination_acknowledged=acknowledged,
        outcome_code="cancelled",
        explanation="cancellation requested, acknowledged",
    )


@pytest.mark.parametrize(
    ("state", "acknowledged", "known"),
    [
        (OpState.CANCELLED, True, "that it stopped was confirmed"),
        (OpState.INDETERMINATE, False, "do not assume it ran or that it did not run"),
        (OpState.RUNNING, False, "do not assume it ran or that it did not run"),
        (OpState.REQUESTED, False, "stopped before it ran"),
    ],
)
def test_op3_a_stopped_call_is_answered_from_its_receipt(
    state: OpState, acknowledged: bool, known: str
) -> None:
    answer = receipt_answer(CALL, _record(state, acknowledged=acknowledged))
    assert (answer.call_id, answer.name, answer.is_error) == (CALL.call_id, "write_file", True)
    output = answer.output
    assert isinstance(output, dict)
    assert output["op"] == "s1/1/1/0"
    assert output["receipt"] == state.value
    assert output["acknowledged"] is acknowledged
    assert known in output["what_is_known"]
    assert output["explanation"] == "cancellation requested, acknowledged"


def test_unanswered_calls_skips_answered_and_provider_calls() -> None:
    provider = ToolCallPart(call_id="p", name="web", args={}, provider_executed=True)
    answered = ToolCallPart(call_id="x", name="read", args={})
    parts: list[Part] = [provider, answered, receipt_answer(answered, None), CALL]
    assert unanswered_calls(parts) == [CALL]


class _CallsThenHangs:
    """A model whose step streams a client call and then never finishes the step."""

    id = "M"

    async def _parts(self) -> AsyncIterator[Part]:
        yield TextPart(text="writing it")
        yield CALL
        await anyio.sleep_forever()

    def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        return self._parts()


async def test_op4_a_call_of_the_step_a_stop_cut_is_answered_as_never_made() -> None:
    async with session_rig({}, models=[_CallsThenHangs()]) as r:
        session = r.session()
        session.send("write a.txt")
        await anyio.wait_all_tasks_blocked()
        session.stop()
        await r.settle()
        (partial,) = [row for row in await r.history() if row.kind is RowKind.PARTIAL]
    body = decode_body(partial)
    assert [c.call_id for c in body.tool_calls] == [CALL.call_id]
    (answer,) = body.tool_results
    assert answer.call_id == CALL.call_id
    assert answer.output == {
        "error": "no_result",
        "what_is_known": "the stream was stopped before this call was made; it did not run",
    }
