"""Bounded cleanup: a shielded await of host or store code ends within ``CLEANUP_S``.

A stop, a failed write or the engine's exit runs cleanup that the cancellation which caused it
must not cut short (it is shielded); but a host store or a host milestone that never returns
must not hold the engine for ever either (``Engine.__aexit__`` would hang). So every such
shield is bounded, on the engine's clock: when the bound fires, the await is cancelled (the
scope's cancel carries the reason), one warning names the site and the bound, and the site
treats the work as not done: a write cut short is a failed write, and nothing of it is told.
"""

from __future__ import annotations

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
    """``with bounded_cleanup(what, clock=...) as cleanup:``: shielded, cut off after the bound.

    :attr:`fired` says afterwards whether the bound cut the work short.
    """

    __slots__ = ("_clock", "_scope", "_timer", "seconds", "what")

    def __init__(self, what: str, *, clock: Clock, seconds: float = CLEANUP_S) -> None:
        self.what = what
        self.seconds = seconds
        self._clock = clock
        self._scope = anyio.CancelScope(shield=True)
        self._timer: Timer | None = None

    def __enter__(self) -> Self:
        reason = f"cleanup bound: {self.what} did not finish within {self.seconds:g} s"
        scope = self._scope
        self._timer = self._clock.call_at(
            self._clock.now() + self.seconds, lambda: scope.cancel(reason)
        )
        scope.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self._timer is not None:
            self._timer.cancel()
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


def bounded_cleanup(what: str, *, clock: Clock, seconds: float = CLEANUP_S) -> BoundedCleanup:
    """A shielded scope for the cleanup ``what``, cancelled after ``seconds`` on ``clock``."""
    return BoundedCleanup(what, clock=clock, seconds=seconds)


__all__ = ["CLEANUP_S", "BoundedCleanup", "bounded_cleanup"]
