"""Errors of the step loop and its ports.

A model fails a step by raising a :class:`ModelError`; the loop turns it into a stream error
(a value) with its SM-19 category. The remaining classes are caller misuse.
"""

from __future__ import annotations

from enum import StrEnum

from persistence import TurnkeeperError, UsageError


class ErrorType(StrEnum):
    """Stream error types (SM-19)."""

    AUTHENTICATION = "authentication"
    QUOTA = "quota"
    MODEL_NOT_FOUND = "model_not_found"
    CONTEXT_EXCEEDED = "context_exceeded"
    ABORTED = "aborted"
    RUNTIME_NOT_READY = "runtime_not_ready"
    MODEL_REFUSAL = "model_refusal"
    MALFORMED_OUTPUT = "malformed_output"
    SCRIPT_EXHAUSTED = "script_exhausted"
    UNKNOWN = "unknown"
    RUNTIME_START_FAILED = "runtime_start_failed"
    STREAM_TRUNCATED = "stream_truncated"
    EMPTY_OUTPUT = "empty_output"
    PREVIOUS_RESPONSE_NOT_FOUND = "previous_response_not_found"
    #: A provider failure worth retrying (a scripted ``error = "retryable"``; a real model's
    #: overload, 5xx or lost connection).
    PROVIDER_ERROR = "provider_error"
    #: The provider's rate limit (HTTP 429): retryable, after the provider's wait.
    RATE_LIMITED = "rate_limited"
    #: A provider failure not worth retrying (a scripted ``error = "terminal"``).
    PROVIDER_REJECTED = "provider_rejected"
    #: A durable write the stream depends on failed (a receipt, its start, its final row).
    STORE_WRITE = "store_write"


#: SM-19: stream error types an auto-retry must not retry.
NON_RETRYABLE: frozenset[ErrorType] = frozenset(
    {
        ErrorType.AUTHENTICATION,
        ErrorType.QUOTA,
        ErrorType.MODEL_NOT_FOUND,
        ErrorType.CONTEXT_EXCEEDED,
        ErrorType.ABORTED,
        ErrorType.RUNTIME_NOT_READY,
        ErrorType.MODEL_REFUSAL,
        ErrorType.MALFORMED_OUTPUT,
        ErrorType.SCRIPT_EXHAUSTED,
        ErrorType.PROVIDER_REJECTED,
    }
)


def is_retryable(error_type: ErrorType) -> bool:
    """SM-19: everything not listed as non-retryable is retryable."""
    return error_type not in NON_RETRYABLE


class ModelError(TurnkeeperError):
    """A model call failed; ``type`` says how (SM-19)."""

    def __init__(
        self, error_type: ErrorType, message: str, *, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.type = error_type
        self.message = message
        #: How long the provider asked to wait before a retry, in seconds (``Retry-After``,
        #: ``retry-after-ms``), when it said; an auto-retry waits at least this long (AS-32).
        self.retry_after = _wait(retry_after)


#: The longest provider wait honoured (an hour): a larger or unreadable one is not trusted.
MAX_RETRY_AFTER_S = 3600.0


def _wait(seconds: object) -> float | None:
    """A provider's requested wait in seconds, or ``None`` when it is absent or not sane."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    if not 0 <= seconds <= MAX_RETRY_AFTER_S:  # NaN fails both
        return None
    return float(seconds)


class ScriptExhausted(ModelError):
    """A ``ScriptedModel`` was asked for a step its script does not have."""

    def __init__(self, model: str, step_index: int) -> None:
        super().__init__(
            ErrorType.SCRIPT_EXHAUSTED,
            f"model {model!r} ran out of scripted steps: it was asked for step "
            f"{step_index + 1} and its script has {step_index}",
        )
        self.model = model
        self.step_index = step_index


class WriteFailed(TurnkeeperError):
    """A durable write the stream depends on failed; the stream cannot go on.

    Raised by the receipt writer when a receipt's commit fails, and by a host when the write a
    milestone stands for fails (its stream start, its final row). The step loop ends the stream
    with a ``store_write`` stream error; nothing the failed write carried is told.
    """


class TerminationUnconfirmed(TurnkeeperError):
    """A cancelled tool could not confirm that its work stopped.

    A tool raises it from ``execute`` when it was cancelled (its cancel scope fired) and the
    layer below it did not confirm termination in time (e.g. an MCP server that never answered
    the cancelled request). The operation's receipt is then ``indeterminate``, never
    ``cancelled`` (OP-3). Returning or letting the cancellation propagate is the acknowledgement.
    """


class ToolUnavailable(TurnkeeperError):
    """The tool's server is down or unreachable, so the call was never sent.

    A tool raises it from ``execute`` before anything reached the server (a dead MCP server
    that is being restarted, say). The call did not run: its receipt is ``failed`` with
    outcome ``unavailable``, distinct from ``capability_error`` (the server answered an error).
    """


class ToolTransportLost(TurnkeeperError):
    """The call was sent and the transport to its server broke before any answer came.

    A tool raises it from ``execute`` when the server went away mid-call (its process died, its
    pipe closed). Nobody knows whether the call ran: its receipt is ``indeterminate``.
    """


class UnknownModel(UsageError):
    """A request or chain named a model the stream manager does not have."""
