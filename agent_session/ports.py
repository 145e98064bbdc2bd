"""The session's ports: what a host (or the harness) plugs in around the turn engine."""

from __future__ import annotations

from typing import Protocol

import msgspec

from agent_session._compaction import DEFAULT_PROMPT, CompactionPolicy
from persistence import MAX_STEPS, TurnkeeperError, UsageError
from stream_manager import CLEANUP_S


class PreStreamFailure(TurnkeeperError):
    """A pre-stream gate refused or failed; for a resume this is a failure before start."""


class PreStreamGate(Protocol):
    """The check every send and resume passes before its stream (a pricing gate)."""

    async def check(self, session: str, purpose: str) -> None:
        """Return to let the turn go on; raise :class:`PreStreamFailure` to stop it."""
        ...


class OpenGate:
    """The default gate: everything passes."""

    async def check(self, session: str, purpose: str) -> None:
        """Let every turn through."""
        del session, purpose


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The engine's policies (``[engine]`` in ``docs/scenarios.md``)."""

    #: One logical turn's step ceiling (MAX_STREAM_STEPS).
    max_stream_steps: int = 100
    #: Failed-before-start resume attempts before the continuation is forfeited (R21).
    resume_attempt_cap: int = 3
    #: The default deadline of one operation, in seconds.
    tool_deadline_s: float = 60.0
    #: How long a cancelled operation has to acknowledge, in seconds.
    cancel_grace_s: float = 5.0
    #: The key of receipts' target digests (OP-11): arguments never enter a receipt.
    receipt_salt: str = "turnkeeper"
    #: The overlap guard (OP-9): ``block`` (the default), ``warn`` or ``session``.
    overlap_policy: str = "block"
    #: Resume, when the engine starts, every turn a previous process left owed (PS-6).
    recover_at_start: bool = True
    #: Retry a stream that failed with a retryable error, after a backoff, under what the
    #: failed attempt left (AS-32, AS-33); and, when the engine starts, a turn a crash
    #: interrupted (PS-4: its history ends on the user's row, a ``[CONTINUE]`` sentinel or a
    #: partial row). A session's user may turn it off for that session (persisted).
    auto_retry: bool = True
    #: The first retry's delay in seconds on the engine's clock; it doubles per attempt, up
    #: to ``retry_backoff_cap_s``. A provider's longer ``Retry-After`` wins.
    retry_backoff_s: float = 1.0
    retry_backoff_cap_s: float = 60.0
    #: Retries of one turn before it is abandoned (``retry-abandoned``); 0 retries nothing.
    retry_max_attempts: int = 3
    #: AS-36: the tokens of input a model takes (``context_windows`` names a model's own);
    #: a step whose input reaches ``compact_at`` of it stops its stream for a compaction
    #: (0 never compacts), whose request asks ``compaction_prompt``.
    context_window: int = 200_000
    context_windows: dict[str, int] = msgspec.field(default_factory=dict)
    compact_at: float = 0.8
    compaction_prompt: str = DEFAULT_PROMPT

    def compaction(self) -> CompactionPolicy:
        """The compaction policy these settings make (validated)."""
        return CompactionPolicy(
            window=self.context_window,
            windows=self.context_windows,
            at=self.compact_at,
            prompt=self.compaction_prompt,
        )

    #: Recovered resumes starting at once, at most (each holds its slot until its stream
    #: started or its attempt failed): no thundering herd of stream starts at the provider,
    #: and a bounded set of starts in flight (a cheaper heap for the garbage collector).
    recovery_concurrency: int = 64
    #: How long one shielded cleanup (a stop's receipts, a start or final write, closing a
    #: stream) may take, in seconds on the engine's clock, before it is cut short and logged:
    #: a host store that hangs cannot hang the engine's exit (``docs/architecture.md``).
    cleanup_s: float = CLEANUP_S
    #: On a leased store (``PostgresStore``, LS-8): sessions one claim takes at most (each
    #: process's share of a recovery storm), and the seconds of real time between claim
    #: rounds (each jittered by up to a quarter either way, so peers do not claim in step):
    #: a dead holder's sessions are taken at most ``lease + claim_every_s * 1.25`` after its
    #: last renewal.
    claim_limit: int = 64
    claim_every_s: float = 0.5
    #: LS-10: seconds of real time a stop or a resolution asked of a session's holder in
    #: another process waits for its answer before it is withdrawn (``RequestUnanswered``);
    #: above the lease plus a claim round, so a dead holder's successor can answer.
    request_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        """Refuse a policy the engine cannot keep (one line naming the field)."""
        if not 1 <= self.max_stream_steps <= MAX_STEPS:  # a stored budget reads back in range
            raise UsageError(f"EngineConfig.max_stream_steps must be 1..{MAX_STEPS}")
        if self.resume_attempt_cap < 1:
            raise UsageError("EngineConfig.resume_attempt_cap must be at least 1")
        if self.recovery_concurrency < 1:
            raise UsageError("EngineConfig.recovery_concurrency must be at least 1")
        if not self.cleanup_s > 0:  # NaN too
            raise UsageError("EngineConfig.cleanup_s must be a positive number of seconds")
        if not 0 <= self.retry_backoff_s <= self.retry_backoff_cap_s:  # NaN too
            raise UsageError(
                "EngineConfig.retry_backoff_s must be 0 or more, and at most retry_backoff_cap_s"
            )
        if self.retry_max_attempts < 0:
            raise UsageError("EngineConfig.retry_max_attempts must be 0 or more")
        if self.claim_limit < 1:
            raise UsageError("EngineConfig.claim_limit must be at least 1")
        if not self.claim_every_s > 0:  # NaN too
            raise UsageError("EngineConfig.claim_every_s must be a positive number of seconds")
        if not self.request_timeout_s > 0:  # NaN too
            raise UsageError("EngineConfig.request_timeout_s must be a positive number of seconds")
        self.compaction()  # refuses a window, share or prompt no compaction can keep
