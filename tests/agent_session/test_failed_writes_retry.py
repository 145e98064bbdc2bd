"""A cut record's end whose write failed while the session was idle is retried by the idle sweep.

A withdrawal or forfeit stands once decided (the marker is gone), and its record's change
waits to be written. When the decision was made while the session is idle, no stream start or
abort flushes it on the way: the next idle sweep is what writes it. Left unwritten, the store
still says owed, and a restart would resume a turn that had ended.
"""

from __future__ import annotations

from agent_session import ContinuationEnded, ContinuationOwed, EngineEvent, Phase, ResumeAttempted
from agent_session.harness.fakes import Faults, FaultyStore
from persistence import CutState, MemoryStore
from stream_manager import StreamFailed
from tests.agent_session.support import session_rig
from tests.agent_session.test_as_send_rules import (
    CUT_SCRIPT,
    wake_tool,
    withdraw_at_first_stream_end,
)

#: The resume attempt cap (R21): the forfeit comes with the sweep after the last failed one.
CAP = 3


async def test_ps6_r21_a_forfeit_whose_write_failed_while_idle_is_written_by_the_next_sweep() -> (
    None
):
    """Every resume attempt fails at the gate (R21); the forfeit at the cap fails to write.

    The session is idle, owing nothing. A send refused by the gate makes it idle again with no
    stream started: that idle sweep writes the forfeit, so the store no longer says owed.
    """
    faults = Faults()
    store = FaultyStore(MemoryStore(), faults)
    async with session_rig(
        {"M": CUT_SCRIPT}, tools=[wake_tool(lambda: r)], gate=faults, store=store
    ) as r:
        session = r.session()
        withdraw_at_first_stream_end(lambda: r)

        def fail_the_forfeit(event: EngineEvent) -> None:
            if isinstance(event, ContinuationOwed):
                faults.arm("pre_stream", CAP + 1)  # the resumes, then the send below
            elif isinstance(event, ResumeAttempted) and event.attempt == CAP:
                faults.arm("store_write", 1)  # the forfeit's record change, at the next sweep

        r.on(fail_the_forfeit)
        session.send("start")
        await r.settle()
        assert [(e.attempt, e.outcome) for e in r.of(ResumeAttempted)] == [
            (n, "failed") for n in range(1, CAP + 1)
        ]
        assert r.of(ContinuationEnded) == []  # decided, not durable: untold
        assert session.phase is Phase.IDLE
        assert not session.owes()

        session.send("are you there?")  # refused by the gate: no stream starts
        await r.settle()
        assert [e.type for e in r.of(StreamFailed)] == ["pre_stream_rejected"]
        (ended,) = r.of(ContinuationEnded)
        assert ended.how == "forfeited"
        rows = await r.history()
    (carrying,) = [row for row in rows if row.cut is not None]
    assert carrying.cut is not None
    assert carrying.cut.state is CutState.FORFEITED
