"""The two clocks: the system's, and a virtual one for the harness and tests.

This module is the one place in turnkeeper that may read real time.

``VirtualClock`` never moves on its own: ``advance`` moves it and wakes due sleepers in
deadline order. ``run_until_idle``-style drivers (the scenario harness) advance it to the next
sleeper's deadline whenever every task is blocked, so virtual runs are instant and the same
scenario always gives the same trace.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol

import anyio


class Timer(Protocol):
    """A callback scheduled on a clock; ``cancel`` stops it from running."""

    def cancel(self) -> None:
        """Do not run the callback (no effect once it ran)."""
        ...


class SystemClock:
    """Wall-clock time: ``now`` is epoch seconds, so persisted deadlines survive a restart."""

    def now(self) -> float:
        """Epoch seconds."""
        return time.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` on the event loop once the wall clock reaches ``when``."""
        return asyncio.get_running_loop().call_later(max(0.0, when - time.time()), callback)

    async def sleep_until(self, deadline_at: float) -> None:
        """Sleep until the wall clock reaches ``deadline_at``."""
        delay = deadline_at - time.time()
        if delay > 0:
            await anyio.sleep(delay)
        else:
            await anyio.lowlevel.checkpoint()


class _Sleeper:
    __slots__ = ("callback", "deadline_at", "event", "gone")

    def __init__(self, deadline_at: float, callback: Callable[[], None] | None = None) -> None:
        self.deadline_at = deadline_at
        # a timer needs no event (anyio.Event is not free: a few µs per call)
        self.event: anyio.Event | None = anyio.Event() if callback is None else None
        self.callback = callback
        self.gone = False  # woken, or cancelled while it waited

    def cancel(self) -> None:
        self.gone = True


class VirtualClock:
    """A clock that only moves when told to.

    Each sleeper waits on its own ``anyio.Event``; ``advance``/``advance_to`` wake every sleeper
    whose deadline has come, earliest first (ties in arrival order). A sleeper cancelled while
    it waits is forgotten, so it never makes a driver advance time for nobody.
    """

    __slots__ = ("_now", "_order", "_sleepers")

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, _Sleeper]] = []
        self._order = itertools.count()

    def now(self) -> float:
        """The virtual time in seconds."""
        return self._now

    async def sleep_until(self, deadline_at: float) -> None:
        """Wait until the clock is advanced to ``deadline_at`` (a checkpoint if it is past)."""
        if deadline_at <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        sleeper = _Sleeper(deadline_at)
        heapq.heappush(self._sleepers, (deadline_at, next(self._order), sleeper))
        assert sleeper.event is not None
        try:
            await sleeper.event.wait()
        finally:
            sleeper.gone = True

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` when the clock is advanced to ``when`` (in deadline order)."""
        sleeper = _Sleeper(when, callback)
        heapq.heappush(self._sleepers, (when, next(self._order), sleeper))
        return sleeper

    def _drop_gone(self) -> None:
        while self._sleepers and self._sleepers[0][2].gone:
            heapq.heappop(self._sleepers)

    def next_deadline(self) -> float | None:
        """The earliest deadline a live sleeper waits for, or ``None``."""
        self._drop_gone()
        return self._sleepers[0][0] if self._sleepers else None

    def advance(self, seconds: float) -> None:
        """Move forward by ``seconds`` and wake the sleepers now due."""
        self.advance_to(self._now + seconds)

    def advance_to(self, when: float) -> None:
        """Move to ``when`` (never backwards) and wake the sleepers now due, in order."""
        self._now = max(self._now, when)
        self._drop_gone()
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, sleeper = heapq.heappop(self._sleepers)
            sleeper.gone = True
            if sleeper.callback is not None:
                sleeper.callback()
            elif sleeper.event is not None:
                sleeper.event.set()
            self._drop_gone()
