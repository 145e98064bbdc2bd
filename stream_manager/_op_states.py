"""The operation lifecycle: one enum, one table, receipts as values (``docs/operations.md``).

Theory of operation
-------------------
Every tool call is an *operation*. Its receipt (``persistence.OperationRecord``) is written
``requested`` before anything runs (OP-1), ``running`` when its execute starts, then exactly one
of ``completed``, ``failed``, ``timed_out``, ``cancelled`` or ``indeterminate`` (OP-8):

* ``cancelled`` and ``timed_out`` only when the layer acknowledged termination (its execute
  ended after the cancel request, or nothing ever ran, OP-3, OP-4);
* ``indeterminate`` when nobody can say it stopped: no acknowledgement within the grace
  interval, a provider-executed call cut off, a process that died (OP-3, OP-7);
* a late answer from the same layer may resolve ``indeterminate``, recorded as resolved late;
  silence never does. A person who checked may settle it too (``persistence.resolved``:
  ``resolved_by`` operator, never resolved late).

A cancellation request is a flag with its own time and reason, recorded durably before the
engine waits on anything (OP-3); it is not a state. Receipts hold identifiers, times and codes:
never arguments, outputs or the tool's own messages (OP-11). ``outcome_code`` says which layer
ended the operation (OP-12).

Pure: records in, records out; the shell (``_operations``) does the writes and the waiting.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from enum import StrEnum
from typing import Final

import msgspec

from persistence import OperationRecord, OpState, TurnkeeperError
from stream_manager.ports import Capability
from stream_manager.redaction import redact


class OutcomeCode(StrEnum):
    """How an operation ended, by the layer that ended it (OP-12)."""

    OK = "ok"
    #: The tool raised: a tool-runtime failure.
    TOOL_ERROR = "tool_error"
    #: The tool answered with an error: the capability failed (e.g. a page would not render).
    CAPABILITY_ERROR = "capability_error"
    #: The tool's transport or controller failed (a lost connection, an unknown tool).
    TRANSPORT_ERROR = "transport_error"
    #: Sent, and the transport to its server broke before any answer (indeterminate).
    TRANSPORT_LOST = "transport_lost"
    #: Not run: the tool's server is down or unreachable, so nothing was sent.
    UNAVAILABLE = "unavailable"
    #: Not run: the model's arguments failed the tool's declared schema.
    INVALID_ARGUMENTS = "invalid_arguments"
    #: The deadline passed (timed out, or indeterminate when unacknowledged).
    TIMEOUT = "timeout"
    #: Stopped by a user Stop, a hard stop or disposal.
    CANCELLED = "cancelled"
    #: The assistant's response stream failed or was cut while the operation ran.
    STREAM_FAILURE = "stream_failure"
    #: The process died with the operation open (found at startup).
    PROCESS_RESTART = "process_restart"
    #: Refused while an earlier call on the same capability and target is indeterminate.
    BLOCKED_BY_INDETERMINATE = "blocked_by_indeterminate"
    #: Refused once: the same call completed in the stream a crash cut off, and its result was
    #: lost with that stream (a startup retry must not re-run it silently, OP-9).
    BLOCKED_BY_LOST_RESULT = "blocked_by_lost_result"
    #: Completed, but its completion never reached the engine; delivered from its record.
    COMPLETION_SIGNAL_LOST = "completion_signal_lost"
    #: Indeterminate, then a person checked and found it completed (``turnkeeper resolve``).
    OPERATOR_COMPLETED = "operator_completed"
    #: Indeterminate, then a person checked and found it failed.
    OPERATOR_FAILED = "operator_failed"
    #: Indeterminate, then a person checked and found it never ran (``cancelled``).
    OPERATOR_NOT_RUN = "operator_not_run"


class CancelWhy(StrEnum):
    """Why cancellation was requested (``op-cancel-requested.why`` in ``docs/trace.md``)."""

    USER = "user"
    DEADLINE = "deadline"
    STREAM_STOPPED = "stream-stopped"
    SHUTDOWN = "shutdown"


UNCONFIRMED: Final = "cancellation requested, termination not confirmed"
#: Why an operation is indeterminate when its tool's transport broke mid-call.
TRANSPORT_LOST: Final = "the server went away before answering"
#: Why an operation is indeterminate when the engine shut down around it.
UNCONFIRMED_AT_SHUTDOWN: Final = (
    "the engine shut down before the operation acknowledged its cancellation; "
    "termination not confirmed"
)

_S = OpState
TRANSITIONS: Final[frozenset[tuple[OpState, OpState]]] = frozenset(
    {
        (_S.REQUESTED, _S.RUNNING),
        (_S.REQUESTED, _S.CANCELLED),  # cancelled before dispatch: nothing ran (OP-4)
        (_S.REQUESTED, _S.FAILED),  # blocked by the overlap guard (OP-9)
        (_S.REQUESTED, _S.INDETERMINATE),  # a crash (found at startup)
        (_S.RUNNING, _S.COMPLETED),
        (_S.RUNNING, _S.FAILED),
        (_S.RUNNING, _S.TIMED_OUT),
        (_S.RUNNING, _S.CANCELLED),
        (_S.RUNNING, _S.INDETERMINATE),
        # OP-8: a late answer from the same layer
        (_S.INDETERMINATE, _S.COMPLETED),
        (_S.INDETERMINATE, _S.FAILED),
        (_S.INDETERMINATE, _S.TIMED_OUT),
        (_S.INDETERMINATE, _S.CANCELLED),
    }
)


class IllegalOpTransition(TurnkeeperError):
    """An operation was asked to move where the table does not allow (an engine bug)."""


def requested(
    *,
    op_id: str,
    session: str,
    stream: str,
    call_id: str,
    capability: Capability,
    target: str,
    now: float,
    deadline_at: float | None,
) -> OperationRecord:
    """OP-1: the record written before anything runs."""
    return OperationRecord(
        op_id=op_id,
        session=session,
        stream=stream,
        call_id=call_id,
        capability=capability,
        target=target,
        started_at=now,
        deadline_at=deadline_at,
        state=OpState.REQUESTED,
    )


def advance(
    record: OperationRecord,
    to: OpState,
    *,
    now: float,
    outcome: OutcomeCode | None = None,
    acknowledged: bool | None = None,
    explanation: str | None = None,
    blocked_by: str | None = None,
) -> OperationRecord:
    """Move ``record`` to ``to`` by the table; a terminal move stamps ``ended_at``.

    Raises:
        IllegalOpTransition: the table has no such move (the record is unchanged).
    """
    if (record.state, to) not in TRANSITIONS:
        raise IllegalOpTransition(f"operation {record.op_id}: {record.state} -> {to}")
    changes: dict[str, object] = {"state": to}
    if to is not OpState.RUNNING:
        changes["ended_at"] = now
    if outcome is not None:
        changes["outcome_code"] = outcome.value
    if acknowledged is not None:
        changes["termination_acknowledged"] = acknowledged
        if acknowledged and record.cancel_requested_at is not None:
            changes["cancel_acknowledged_at"] = now
    if explanation is not None:
        changes["explanation"] = redact(explanation)  # the receipt's only free text
    if blocked_by is not None:
        changes["blocked_by"] = blocked_by
    if record.state is OpState.INDETERMINATE:
        changes["resolved_late"] = True
    return msgspec.structs.replace(record, **changes)


def cancel_requested(record: OperationRecord, *, now: float, why: CancelWhy) -> OperationRecord:
    """OP-3: the request, recorded once (the first reason stands)."""
    if record.cancel_requested_at is not None:
        return record
    return msgspec.structs.replace(record, cancel_requested_at=now, cancel_reason=why.value)


_encoder = msgspec.json.Encoder(order="sorted")


def target_digest(capability: Capability, args: Mapping[str, object], salt: str) -> str:
    """OP-11: a privacy-minimised target: the capability and a salted digest of the arguments.

    Two calls with the same capability and arguments share a target (the overlap guard, OP-9);
    nothing of the arguments can be read back from it.
    """
    try:
        payload = _encoder.encode(args)
    except (TypeError, msgspec.EncodeError):
        payload = repr(sorted(args.items(), key=lambda item: item[0])).encode()
    digest = hashlib.blake2b(payload, key=salt.encode()[:64], digest_size=8).hexdigest()
    return f"{capability.text}#{digest}"
