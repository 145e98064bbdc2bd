from __future__ import annotations

from stream_manager import Ended, FinishReason, StopWhy
from tests.stream_manager.support import T_, X, rig


async def test_smoke_two_tool_steps_then_text() -> None:
    r = rig({"M": [T_("bash"), T_("bash"), X("done")]})
    outcome = await r.manager.start_stream(r.request())
    assert isinstance(outcome, Ended), outcome
    assert outcome.finish is FinishReason.STOP
    assert outcome.why is StopWhy.FINISHED
    assert outcome.steps == 3
    assert outcome.remaining == 5
    print(r.recorder.names())
