"""Bounded cleanup: a shielded await of host or store code ends within ``CLEANUP_S``.

A stop, a failed write or the engine's exit runs cleanup that the cancellation which caused it
must not cut short (it is shielded); but a host store or a host milestone that never returns
must not hold the engine for ever either (``Engine.__aexit__`` would hang). So every such
shield is bounded, on the engine's clock: when the bound fires, the await is cancelled (the
scope's cancel carries the reason), one warning names the site and the bound, and the site
treats the work as not done: a write cut short is a failed write, and nothing of it is told.

The bounds of one owner share one timer (:class:`CleanupBounds`), armed for the earliest
open deadline, and only for a cleanup still open at the next turn of the event loop: one that
finishes without yielding could not have been cut short anyway (a timer runs only when the
loop does), so the hot path (a start or final write to an in-memory store) schedules no timer
at all. The deadline is still taken when the cleanup begins, so the bound is the same.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Final, Self

import anyio

from stream_manager.clock import Timer
from stream_manager.ports import Clock

log = logging.getLogger("turnkeeper.cleanup")

#: How long one shielded cleanup may take, in seconds of the engine's clock (the default of
#: ``EngineConfig.cleanup_s``): a safety net for a host that hangs, not a deadline to wait out.
CLEANUP_S: Final = 10.0


class BoundedCleanup:
    """``with bounds.bound(what) as cleanup:``: shielded, cut off after the bound.

    :attr:`fired` says afterwards whether the bound cut the work short.
    """

    __slots__ = ("_bounds", "_scope", "cut", "deadline", "seconds", "what")

    def __init__(self, bounds: CleanupBounds, what: str, seconds: float) -> None:
        self.what = what
        self.seconds = seconds
        #: When the bound fires, on the owner's clock (set as the cleanup begins).
        self.deadline = 0.0
        self._bounds = bounds
        self._scope = anyio.CancelScope(shield=True)
        #: Whether the bound fired (the work was cancelled; see :attr:`fired`).
        self.cut = False

    def __enter__(self) -> Self:
        self._bounds.opened(self)
        self._scope.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._bounds.closed(self)
        suppressed = self._scope.__exit__(exc_type, exc, tb)
        if self.fired:
            log.warning(
                "cleanup bound: %s did not finish within %g s; cut short", self.what, self.seconds
            )
        return bool(suppressed)

    @property
    def fired(self) -> bool:
        """Whether the bound cut the work short (it did not finish)."""
        return self._scope.cancelled_caught

    def cut_short(self) -> None:
        """The bound fired: cancel the work, with the reason."""
        self.cut = True
        self._scope.cancel(f"cleanup bound: {self.what} did not finish within {self.seconds:g} s")


class CleanupBounds:
    """The bounded cleanups of one owner on one clock: one timer for the earliest deadline.

    The timer is armed at the next turn of the event loop after a cleanup begins, if one is
    still open then, and cancelled when the last open cleanup ends, so nothing is left
    scheduled on the clock once every cleanup finished (a virtual clock's driver would
    otherwise advance time to a deadline nobody waits for).
    """

    __slots__ = ("_armed_at", "_clock", "_looking", "_open", "_timer", "seconds")

    def __init__(self, clock: Clock, seconds: float = CLEANUP_S) -> None:
        self.seconds = seconds
        self._clock = clock
        self._open: dict[BoundedCleanup, None] = {}  # in the order they began
        self._timer: Timer | None = None
        self._armed_at = 0.0
        self._looking = False  # a look at the open cleanups is due at the next loop turn

    def bound(self, what: str, *, beyond_s: float = 0.0) -> BoundedCleanup:
        """A shielded scope for the cleanup ``what``: the bound (plus ``beyond_s``) on the clock."""
        return BoundedCleanup(self, what, self.seconds + beyond_s)

    @property
    def scheduled(self) -> bool:
        """Whether a timer is on the clock now (for tests: none once every cleanup ended)."""
        return self._timer is not None

    def opened(self, cleanup: BoundedCleanup) -> None:
        """``cleanup`` begins: its deadline counts from now."""
        cleanup.deadline = deadline = self._clock.now() + cleanup.seconds
        self._open[cleanup] = None
        if self._looking or (self._timer is not None and self._armed_at <= deadline):
            return
        self._looking = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on asyncio: arm at once
            self._look()
        else:
            loop.call_soon(self._look)

    def closed(self, cleanup: BoundedCleanup) -> None:
        """``cleanup`` ended (finished or cut short)."""
        del self._open[cleanup]
        if not self._open and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _look(self) -> None:
        """A loop turn after a cleanup began: arm the timer for the earliest open deadline."""
        self._looking = False
        self._arm()

    def _arm(self) -> None:
        due = [cleanup.deadline for cleanup in self._open if not cleanup.cut]
        if not due:
            return
        at = min(due)
        if self._timer is not None:
            if self._armed_at <= at:
                return
            self._timer.cancel()
        self._armed_at = at
        self._timer = self._clock.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self._clock.now()
        for cleanup in [c for c in self._open if not c.cut and c.deadline <= now]:
            cleanup.cut_short()
        self._arm()


def bounded_cleanup(what: str, *, clock: Clock, seconds: float = CLEANUP_S) -> BoundedCleanup:
    """A shielded scope for the cleanup ``what``, cancelled after ``seconds`` on ``clock``.

    A one-off: an owner with many cleanups keeps one :class:`CleanupBounds` for them all.
    """
    return CleanupBounds(clock, seconds).bound(what)


__all__ = ["CLEANUP_S", "BoundedCleanup", "CleanupBounds", "bounded_cleanup"]
