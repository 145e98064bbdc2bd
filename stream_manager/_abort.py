"""The caller's abort signal for one launch (SM-2): fired once, with a typed reason.

A caller that may have to take a launch back before it starts (the session's preparing turn,
its resume) hands ``StreamRequest.abort``: fired before processing began, the launch is
``Withdrawn`` with the signal's reason; fired during processing, it is a hard stop with that
reason (one ``stream-abort``).
"""

from __future__ import annotations

from message_queue import OneShot
from stream_manager._events import AbortReason


class AbortSignal(OneShot[AbortReason]):
    """A one-shot abort with its typed reason; the first ``fire`` wins, listeners run inside it.

    A class of its own rather than the alias ``OneShot[AbortReason]``: calling a subscripted
    generic goes through ``typing`` on every launch (and fails, silently, to set
    ``__orig_class__`` on a slotted instance).
    """

    __slots__ = ()
