"""A stop whose receipt write fails (``docs/session.md``, "When a write fails").

A stream that is already stopping (a Stop, a hard stop) when one of its receipt writes fails
still ends by its abort; the host is told the failed write (a ``store_write`` stream error
after the ``stream-abort``, as for a failed partial), the running call is cancelled all the
same (OP-3), and a call whose termination nobody confirmed is held by the overlap guard in
the live process (OP-9), as a restart would hold it.
"""

from __future__ import annotations

from persistence import OpState
from stream_manager import OpCancelRequested, StreamAborted, StreamFailed
from tests.operations.support import OpRig, OpTool, call, op_id, op_rig, step, text


def _told(r: OpRig, stream: str) -> list[str]:
    """The stream's ending events, in order: ``abort`` and each stream error's type."""
    return [
        "abort" if isinstance(e, StreamAborted) else e.type
        for e in r.events
        if isinstance(e, StreamAborted | StreamFailed) and e.stream == stream
    ]


async def test_op3_a_hard_stop_whose_cancel_request_failed_still_cancels_and_tells() -> None:
    deploy = OpTool("deploy", duration_s=40.0, on_cancel="ignore")
    again = step(call("deploy", env="prod"))
    script = {"M": [again, again, text()]}
    async with op_rig(script, tools=[deploy]) as r:
        r.session().send("deploy it")
        await r.run_until(3.0)
        r.store._faults.arm("store_write", 1)  # the cancel request of the hard stop fails
        r.session().hard_stop()
        await r.run_until(5.0)

        assert _told(r, "s1/1") == ["abort", "store_write"]
        assert deploy.cancels == [3.0]  # cancelled although its request is not durable
        first = op_id(1, 1, 0)
        assert (await r.receipt(first)).state is OpState.RUNNING  # the store says running
        assert not [e for e in r.of(OpCancelRequested) if e.op == first]  # nothing of it told
        r.session().send("and again")  # the same process: the guard holds what nobody confirmed
        await r.settle()
        assert (await r.receipt(op_id(2, 1, 0))).blocked_by == first
        assert len(deploy.calls) == 1


async def test_op3_a_stopped_calls_terminal_receipt_that_failed_is_told() -> None:
    deploy = OpTool("deploy", duration_s=6.0, ack_delay_s=0.5)
    again = step(call("deploy", env="stage"))
    script = {"M": [again, again, text()]}
    async with op_rig(script, tools=[deploy]) as r:
        r.session().send("deploy it")
        await r.run_until(3.0)
        r.session().stop()
        r.store._faults.arm("store_write", 2)  # the cancel request's write, then the receipt's
        await r.settle()

        assert _told(r, "s1/1") == ["abort", "store_write"]
        first = op_id(1, 1, 0)
        assert (await r.receipt(first)).state is OpState.RUNNING
        r.session().send("and again")  # it acknowledged: nothing holds its target
        await r.settle()
        assert (await r.receipt(op_id(2, 1, 0))).state is OpState.COMPLETED
        assert len(deploy.calls) == 2
