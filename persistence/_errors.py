"""The root of turnkeeper's error tree.

Exceptions are kept for caller misuse, impossible events and bad stored data; everything else
(a rejected add, a refused launch, a cancelled operation) is returned as a value. Every error we
raise on purpose derives from :class:`TurnkeeperError`, so a host can catch them all at once.
"""


class TurnkeeperError(Exception):
    """Base of every error turnkeeper raises on purpose."""


class UsageError(TurnkeeperError):
    """The caller used an API wrongly (bad argument, unknown name, wrong state)."""
