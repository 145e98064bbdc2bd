"""A turn's thinking level, changed mid-turn at the next step (R20, AS-9)."""

from __future__ import annotations


class ThinkingHolder:
    """A turn's thinking level: the original, a pending mid-turn change, the applied one."""

    __slots__ = ("applied", "original", "pending")

    def __init__(self, original: str | None) -> None:
        self.original = original
        self.pending: str | None = None
        self.applied: str | None = None

    def for_step(self) -> str | None:
        """The level a step prepares with; a pending change becomes applied here."""
        if self.pending is not None:
            self.applied, self.pending = self.pending, None
        return self.applied if self.applied is not None else self.original

    def at_cut(self) -> str | None:
        """R20: ``pending ?? applied ?? original``."""
        for level in (self.pending, self.applied):
            if level is not None:
                return level
        return self.original
