"""The auto-retry of a failed turn (AS-32, AS-33, R36, R38): a policy and a pure decision.

Theory of operation
-------------------
A stream that fails with a retryable error (SM-19) is retried: the turn machine owes the turn
a *retry marker* (a :class:`~agent_session._continuation.Marker` of cause ``retry``, with no
durable record) and waits out a backoff on the engine's clock; then the idle sweep launches it
through the same path as a resume: the pre-stream gate, the admission of its goal, workspace
and delegated handle asked again (R44), the launch probe carried to the boundary. So a retry
is withdrawn, forfeited or consumed exactly as an owed continuation is (a Stop, a superseding
user row, disposal, a hard stop, any stream of the turn that starts), and never both a resume
and a retry continue a turn: the stream failure withdraws the cut's marker first (ST-10, R25).

What the retry carries (AS-33): the steps the failed attempt left (R36), the model it reached
and its fallback progress (R38), its correlation (R49), goal attribution, thinking level and
retry-safe options. What decides it is :func:`decide`, from the policy, the session's
:class:`RetryBook` (which it counts the attempt in) and the failure; no I/O, no clock:

* a non-retryable failure (or ``context_exceeded``: in-session context retries are separate)
  abandons, naming the type;
* no steps left abandons (R36: never a fresh budget);
* more consecutive failed attempts than ``max_attempts`` abandons;
* auto-retry off (engine-wide, or the session's persisted preference) abandons, saying so;
* else a retry is scheduled after ``backoff_s * 2 ** (attempt - 1)`` seconds (capped), or the
  provider's ``Retry-After`` when that is longer.

Each scheduled backoff has a generation: a timer whose generation is no longer the book's
(the retry it waited for ended, another was scheduled) does nothing when it fires.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from persistence import UsageError
from stream_manager import ErrorKind, Failed

if TYPE_CHECKING:
    from agent_session.ports import EngineConfig

#: The first retry's delay, doubling per attempt (``EngineConfig.retry_backoff_s``).
RETRY_BACKOFF_S = 1.0
#: The longest backoff between two attempts, whatever the attempt (a longer Retry-After wins).
RETRY_BACKOFF_CAP_S = 60.0
#: Retries of one turn before it is abandoned (``EngineConfig.retry_max_attempts``).
RETRY_MAX_ATTEMPTS = 3


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How a session retries failed streams (from ``EngineConfig``)."""

    enabled: bool = True
    backoff_s: float = RETRY_BACKOFF_S
    cap_s: float = RETRY_BACKOFF_CAP_S
    max_attempts: int = RETRY_MAX_ATTEMPTS

    def __post_init__(self) -> None:
        """Refuse a policy no retry can keep (one line naming the field)."""
        if not self.backoff_s >= 0:  # NaN too
            raise UsageError("EngineConfig.retry_backoff_s must be 0 or more seconds")
        if not self.cap_s >= self.backoff_s:
            raise UsageError("EngineConfig.retry_backoff_cap_s must be at least retry_backoff_s")
        if self.max_attempts < 0:
            raise UsageError("EngineConfig.retry_max_attempts must be 0 or more")

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """The backoff before retry ``attempt`` (1 first): doubling, capped; Retry-After wins."""
        delay: float = min(self.cap_s, self.backoff_s * float(2 ** min(attempt - 1, 62)))
        if retry_after is not None and retry_after > delay:
            return retry_after
        return delay


def retry_policy(config: EngineConfig) -> RetryPolicy:
    """The retry policy ``config`` sets (``EngineConfig`` validated its fields)."""
    return RetryPolicy(
        enabled=config.auto_retry,
        backoff_s=config.retry_backoff_s,
        cap_s=config.retry_backoff_cap_s,
        max_attempts=config.retry_max_attempts,
    )


class RetryBook:
    """One session's retry bookkeeping (mutable; owned by its turn machine)."""

    __slots__ = ("attempts", "generation", "off")

    def __init__(self) -> None:
        #: Consecutive failed attempts of the current turn (a stream end or a new user row
        #: resets it).
        self.attempts = 0
        #: The generation of the backoff now pending; a timer of another one does nothing.
        self.generation = 0
        #: The session's persisted preference: auto-retry turned off by the user.
        self.off = False

    def next_generation(self) -> int:
        """A new backoff is scheduled: earlier timers are stale from now on."""
        self.generation += 1
        return self.generation

    def reset(self) -> None:
        """The turn succeeded, or a new one began: the count starts again."""
        self.attempts = 0


class Schedule(msgspec.Struct, frozen=True):
    """Retry after ``delay_s`` seconds; this is attempt ``attempt`` (1 first)."""

    attempt: int
    delay_s: float


class GiveUp(msgspec.Struct, frozen=True):
    """Do not retry; ``why`` is the reason a person reads (``retry-abandoned``)."""

    why: str


def decide(policy: RetryPolicy, book: RetryBook, failed: Failed) -> Schedule | GiveUp:
    """AS-32, AS-33, R36: whether ``failed`` is retried, and when."""
    if failed.kind is not ErrorKind.RETRYABLE:
        return GiveUp(f"{failed.type.value}: not retryable")
    if not policy.enabled:
        return GiveUp("auto-retry is off for this engine")
    if book.off:
        return GiveUp("auto-retry is turned off for this session")
    if failed.remaining <= 0:
        return GiveUp(f"stream {failed.stream} failed with no steps left (R36)")
    return again(policy, book, failed.retry_after)


def again(
    policy: RetryPolicy, book: RetryBook, retry_after: float | None = None
) -> Schedule | GiveUp:
    """Count one more failed attempt: the next retry, or the reason there is none."""
    attempt = book.attempts + 1
    if attempt > policy.max_attempts:
        return GiveUp(f"{book.attempts} retries failed (retry_max_attempts {policy.max_attempts})")
    book.attempts = attempt
    return Schedule(attempt, policy.delay(attempt, retry_after))
