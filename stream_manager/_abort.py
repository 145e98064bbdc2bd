"""The caller's abort signal for one launch (SM-2): fired once, with a typed reason.

A caller that may have to take a launch back before it starts (the session's preparing turn,
its resume) hands ``StreamRequest.abort``: fired before processing began, the launch is
``Withdrawn`` with the signal's reason; fired during processing, it is a hard stop with that
reason (one ``stream-abort``).
"""

from __future__ import annotations

from message_queue import OneShot
from stream_manager._events import AbortReason

#: A one-shot abort with its typed reason; the first ``fire`` wins, listeners run inside it.
AbortSignal = OneShot[AbortReason]
