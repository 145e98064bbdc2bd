"""The one virtual-time driver (``agent_session/harness/virtual_time.py``) on its own."""

from __future__ import annotations

import anyio
import pytest

from agent_session.harness.virtual_time import VirtualTime, all_blocked
from stream_manager import VirtualClock


class Calls:
    """A store with one call in flight until the driver waits for it."""

    def __init__(self) -> None:
        self.in_flight = 1
        self.waits = 0
        self._done = anyio.Event()

    async def settled(self) -> None:
        self.waits += 1
        self.in_flight = 0  # the database thread answers while the driver waits
        self._done.set()
        await self._done.wait()


async def test_advance_moves_to_each_deadline_and_runs_the_callers_own_at_theirs() -> None:
    clock = VirtualClock()
    woke: list[tuple[str, float]] = []
    timed = [2.0, 3.0]

    async def sleeper(at: float) -> None:
        await clock.sleep_until(at)
        woke.append(("sleeper", clock.now()))

    def run_due(now: float) -> None:
        while timed and timed[0] <= now:
            woke.append(("timed", timed.pop(0)))

    async with anyio.create_task_group() as group:
        group.start_soon(sleeper, 1.0)
        group.start_soon(sleeper, 3.0)
        stopped = await VirtualTime(clock).advance(
            due=lambda: timed[0] if timed else None, then=run_due
        )
    assert not stopped
    assert woke == [("sleeper", 1.0), ("timed", 2.0), ("timed", 3.0), ("sleeper", 3.0)]


async def test_advance_ends_when_stop_says_so_and_check_refuses_a_deadline() -> None:
    clock = VirtualClock()
    seen: list[float] = []

    def refuse_past_two(deadline: float) -> None:
        if deadline > 2:
            raise ValueError(f"past the limit: {deadline}")

    async with anyio.create_task_group() as group:
        for at in (1.0, 2.0, 5.0):
            group.start_soon(clock.sleep_until, at)
        assert await VirtualTime(clock).advance(stop=lambda: clock.now() >= 1, then=seen.append)
        assert seen == [1.0]
        with pytest.raises(ValueError, match=r"past the limit: 5\.0"):
            await VirtualTime(clock).advance(check=refuse_past_two)
        assert clock.now() == 2.0
        await VirtualTime(clock).run_until(6.0)
    assert clock.now() == 6.0


async def test_quiet_is_not_reached_while_a_store_call_is_in_flight() -> None:
    calls = Calls()
    await VirtualTime(VirtualClock(), store=calls).quiet()
    assert calls.waits == 1
    assert calls.in_flight == 0


async def test_all_blocked_waits_for_ready_tasks_without_anyios_sleeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps: list[int] = []

    async def busy() -> None:
        for step in range(50):
            steps.append(step)
            await anyio.lowlevel.checkpoint()
        await anyio.Event().wait()

    async def no_fallback() -> None:
        raise AssertionError("fell back to anyio's wait (0.1 s of real sleep per ready task)")

    monkeypatch.setattr(anyio, "wait_all_tasks_blocked", no_fallback)
    async with anyio.create_task_group() as group:
        group.start_soon(busy)
        await all_blocked()
        assert len(steps) == 50
        group.cancel_scope.cancel()


async def test_drive_reports_a_hang_instead_of_waiting_forever() -> None:
    async def hangs() -> None:
        await anyio.Event().wait()

    with pytest.raises(AssertionError, match="no sleeper left"):
        await VirtualTime(VirtualClock()).drive(hangs)
