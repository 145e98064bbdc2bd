"""The message queue's errors.

A refused add (empty message, a dedupe key already held) is not an error: ``add`` returns a
:class:`~message_queue.Rejected` value. These exceptions are for caller misuse.
"""

from persistence import UsageError


class InvalidEntry(UsageError):
    """An add named an unknown kind or mode, a duplicate id, or inconsistent metadata."""


class UnknownEntry(UsageError):
    """An operation named an entry id the queue does not hold."""


class QueueEmpty(UsageError):
    """``dequeue_next`` was called on a queue that holds no entry at all."""
