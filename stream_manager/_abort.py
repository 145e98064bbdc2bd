"""The caller's abort signal for one launch (SM-2): fired once, with a typed reason.

A caller that may have to take a launch back before it starts (the session's preparing turn,
its resume) hands ``StreamRequest.abort``: fired before processing began, the launch is
``Withdrawn`` with the signal's reason; fired during processing, it is a hard stop with that
reason (one ``stream-abort``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from stream_manager._events import AbortReason


class AbortSignal:
    """A one-shot abort with its :class:`AbortReason`; the first fire wins.

    Listeners run synchronously, in the order they were added, inside :meth:`fire`.
    """

    __slots__ = ("_listeners", "_reason")

    def __init__(self) -> None:
        self._reason: AbortReason | None = None
        self._listeners: list[Callable[[AbortReason], None]] = []

    @property
    def fired(self) -> bool:
        """Whether the signal has fired."""
        return self._reason is not None

    @property
    def reason(self) -> AbortReason | None:
        """The reason it fired with, or ``None`` while it has not."""
        return self._reason

    def fire(self, reason: AbortReason) -> bool:
        """Fire the signal with ``reason`` (a later fire changes nothing).

        Returns:
            ``True`` when this call fired it, ``False`` when it had already fired.
        """
        if self._reason is not None:
            return False
        self._reason = reason
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener(reason)
        return True

    def add_listener(self, callback: Callable[[AbortReason], None]) -> None:
        """Call ``callback(reason)`` when the signal fires (at once if it already has)."""
        if self._reason is not None:
            callback(self._reason)
        else:
            self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[AbortReason], None]) -> None:
        """Forget ``callback`` (no error when it was never added or already ran)."""
        if callback in self._listeners:
            self._listeners.remove(callback)

    def __repr__(self) -> str:
        state = f"fired {self._reason.value!r}" if self._reason is not None else "live"
        return f"<AbortSignal {state}>"
