"""CleanupBounds: one timer per owner, armed only for a cleanup still open a loop turn later.

The bound itself is tested at every site in ``test_bounded_cleanup.py``; these tests pin the
timer's life on a virtual clock: nothing is scheduled for a cleanup that never yields, the
deadline counts from the cleanup's start, overlapping cleanups share one timer and the earliest
deadline wins, and nothing is left on the clock once every cleanup ended (a driver would
otherwise advance virtual time to a deadline nobody waits for).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

from stream_manager import CleanupBounds, VirtualClock

BOUND_S = 7.0  # the tests' bound (the default is CLEANUP_S)
START_S = 100.0  # the virtual clock's start, so a deadline is never the bound itself


async def _turns(n: int = 3) -> None:
    """Let the event loop run a few turns (the bounds look at their cleanups on the next)."""
    for _ in range(n):
        await anyio.lowlevel.checkpoint()


@asynccontextmanager
async def _tasks(*also: anyio.Event) -> AsyncIterator[tuple[anyio.abc.TaskGroup, anyio.Event]]:
    """A task group and what its hanging cleanups wait for, set (with ``also``) on the way out.

    A cleanup is shielded: a test that fails while one hangs must still end, so the hang is
    released when the test's block ends, whatever the bounds did.
    """
    stuck = anyio.Event()
    async with anyio.create_task_group() as group:
        try:
            yield group, stuck
        finally:
            for event in (stuck, *also):
                event.set()


async def test_a_cleanup_that_never_yields_schedules_no_timer() -> None:
    clock = VirtualClock(START_S)
    bounds = CleanupBounds(clock, BOUND_S)

    with bounds.bound("a quick write") as cleanup:
        assert clock.next_deadline() is None
    await _turns()

    assert clock.next_deadline() is None
    assert not bounds.scheduled
    assert not cleanup.fired


async def test_a_cleanup_that_waits_is_cut_at_its_start_plus_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock(START_S)
    bounds = CleanupBounds(clock, BOUND_S)
    entered, seen = anyio.Event(), []

    async def hang(stuck: anyio.Event) -> None:
        with bounds.bound("a write that hangs") as cleanup:
            entered.set()
            await stuck.wait()
        seen.append(cleanup.fired)

    async with _tasks() as (group, stuck):
        group.start_soon(hang, stuck)
        await entered.wait()
        await _turns()
        assert clock.next_deadline() == START_S + BOUND_S
        clock.advance(BOUND_S - 1)
        await _turns()
        assert seen == []  # not yet
        clock.advance(1)

    assert seen == [True]
    assert clock.next_deadline() is None
    assert [r.getMessage() for r in caplog.records if r.name == "turnkeeper.cleanup"] == [
        f"cleanup bound: a write that hangs did not finish within {BOUND_S:g} s; cut short"
    ]


async def test_overlapping_cleanups_share_one_timer_and_each_is_cut_at_its_own_deadline() -> None:
    clock = VirtualClock(START_S)
    bounds = CleanupBounds(clock, BOUND_S)
    release_first, cut = anyio.Event(), []

    async def first() -> None:
        with bounds.bound("the first"):
            await release_first.wait()

    async def second(stuck: anyio.Event) -> None:
        with bounds.bound("the second") as cleanup:
            await stuck.wait()
        cut.append((cleanup.what, clock.now()))

    async with _tasks(release_first) as (group, stuck):
        group.start_soon(first)
        await _turns()
        clock.advance(2)
        group.start_soon(second, stuck)
        await _turns()
        assert clock.next_deadline() == START_S + BOUND_S  # the first's, for both
        release_first.set()
        await _turns()
        clock.advance_to(START_S + BOUND_S)  # the first's deadline: the second is not due
        await _turns()
        assert cut == []
        assert clock.next_deadline() == START_S + 2 + BOUND_S
        clock.advance_to(START_S + 2 + BOUND_S)

    assert cut == [("the second", START_S + 2 + BOUND_S)]
    assert not bounds.scheduled


async def test_a_later_cleanup_with_an_earlier_deadline_moves_the_timer_earlier() -> None:
    clock = VirtualClock(START_S)
    bounds = CleanupBounds(clock, BOUND_S)
    cut: list[str] = []
    beyond_s = 20.0

    async def wait(what: str, extra_s: float, stuck: anyio.Event) -> None:
        with bounds.bound(what, beyond_s=extra_s) as cleanup:
            await stuck.wait()
        cut.append(f"{cleanup.what}@{clock.now():g}")

    async with _tasks() as (group, stuck):
        group.start_soon(wait, "long", beyond_s, stuck)
        await _turns()
        assert clock.next_deadline() == START_S + BOUND_S + beyond_s
        clock.advance(1)
        group.start_soon(wait, "short", 0.0, stuck)
        await _turns()
        assert clock.next_deadline() == START_S + 1 + BOUND_S
        clock.advance_to(START_S + 1 + BOUND_S)
        await _turns()
        assert cut == [f"short@{START_S + 1 + BOUND_S:g}"]
        assert clock.next_deadline() == START_S + BOUND_S + beyond_s
        clock.advance_to(START_S + BOUND_S + beyond_s)

    assert cut == [f"short@{START_S + 1 + BOUND_S:g}", f"long@{START_S + BOUND_S + beyond_s:g}"]


async def test_the_last_cleanup_to_end_takes_the_timer_off_the_clock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock(START_S)
    bounds = CleanupBounds(clock, BOUND_S)
    release = anyio.Event()

    async def wait() -> None:
        with bounds.bound("a slow write"):
            await release.wait()

    with caplog.at_level(logging.WARNING, logger="turnkeeper.cleanup"):
        async with _tasks(release) as (group, _):
            group.start_soon(wait)
            await _turns()
            assert clock.next_deadline() == START_S + BOUND_S
            release.set()

    assert clock.next_deadline() is None
    assert not bounds.scheduled
    assert caplog.records == []
