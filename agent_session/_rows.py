"""History rows as the session writes and reads them.

A row's ``body`` is msgspec JSON of a :class:`RowBody`, owned here: the store keeps it byte-exact
and never decodes it. Reading it back goes through a typed decoder, so a hand-edited or corrupt
body is a :class:`~persistence.CorruptRecord` naming the row and the field, never a silent
"absent" (R61).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from message_queue import Correlation
from persistence import CorruptRecord, CutRecord, HistoryRow, OperationRecord, RowKind, clip
from stream_manager import (
    ChatMessage,
    Finish,
    ModelFallbackProgress,
    ModelUsage,
    Part,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

#: B9: the synthetic, UI-hidden user row a resume appends after a complete assistant row.
CONTINUE_TEXT = "[CONTINUE]"


class RowBody(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a history row says."""

    text: str = ""
    tool_calls: tuple[ToolCallPart, ...] = ()
    tool_results: tuple[ToolResultPart, ...] = ()
    #: For user rows: the queue entry kind that produced it (``wake``, ``report`` ...).
    entry_kind: str | None = None
    correlation: Correlation | None = None
    #: For assistant rows: the finish reason and the effective model.
    finish: str | None = None
    model: str | None = None
    #: For an assistant row that ends on a tool boundary: how many results its last step got
    #: that no model step has seen yet (``None`` in rows written before it was recorded).
    open_results: int | None = None
    #: For a summary row: its pending follow-up while one is owed (B7); for a follow-up row:
    #: the retry options it runs under (PS-7). Plain JSON, read by ``_compaction.read_follow_up``
    #: (a damaged one drops the follow-up; it never makes the row unreadable).
    follow_up: dict[str, object] | None = None
    #: For assistant and partial rows: what the stream's steps used, by the model that ran
    #: them (SM-14, SM-15, R59: a fallback's usage under the fallback).
    usage: tuple[ModelUsage, ...] = ()
    #: For a summary row written as a turn launched (on send): the last seq it summarizes
    #: (the turn's own row came before it and follows it in requests); ``None``: everything
    #: before the summary row.
    through: int | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RowBody)
#: How a summary row introduces itself in a request (AS-36).
SUMMARY_HEADING = "Summary of the conversation so far:"


def encode_body(body: RowBody) -> bytes:
    """The bytes stored for ``body``."""
    return _encoder.encode(body)


def decode_body(row: HistoryRow) -> RowBody:
    """Read a row's body back, or raise ``CorruptRecord`` naming the row and the field."""
    key = f"{clip(row.session)}/{clip(row.row_id)}"
    try:
        return _decoder.decode(row.body)
    except msgspec.DecodeError as error:  # ValidationError is one
        raise CorruptRecord("history_rows", key, f"$.body: {clip(str(error))}") from None
    except RecursionError:
        raise CorruptRecord("history_rows", key, "$.body: nested too deep to read") from None
    except OverflowError as exc:  # a number no Python type holds
        raise CorruptRecord("history_rows", key, f"$.body: {clip(str(exc))}") from None


def row_id(session: str, seq: int) -> str:
    """A history row's id: the session's and its seq (``TurnMachine.new_row`` inlines it)."""
    return f"{session}:r{seq}"


def restart_note(closed: Sequence[OperationRecord]) -> str:
    """What a session's model is told of the calls a process restart left indeterminate."""
    calls = ", ".join(f"{record.capability.name} (operation {record.op_id})" for record in closed)
    return (
        "[turnkeeper] The process stopped while these tool calls were running, so their "
        f"outcome is unknown (receipts indeterminate, termination not confirmed): {calls}. "
        "Do not assume that any of them ran or that it did not run; check before repeating one."
    )


def body_from_parts(parts: Sequence[Part], *, finish: str | None, model: str) -> RowBody:
    """An assistant row's body from a stream's parts."""
    open_results = None
    if finish == "tool-calls":  # the results after the last step's finish: nobody read them
        ends = [index for index, part in enumerate(parts) if isinstance(part, Finish)]
        tail = parts[ends[-1] + 1 :] if ends else parts
        open_results = sum(isinstance(part, ToolResultPart) for part in tail)
    return RowBody(
        text="".join(p.text for p in parts if isinstance(p, TextPart)),
        tool_calls=tuple(p for p in parts if isinstance(p, ToolCallPart)),
        tool_results=tuple(p for p in parts if isinstance(p, ToolResultPart)),
        finish=finish,
        model=model,
        open_results=open_results,
    )


def cut_record(
    remaining: int,
    model: str,
    progress: ModelFallbackProgress,
    correlation: Correlation | None,
    goal: tuple[str | None, str | None] = (None, None),
) -> CutRecord:
    """The durable cut record (R60, PS-6) as persistence stores it."""
    return CutRecord(remaining=remaining, **turn_fields(model, progress, correlation, goal))


def turn_fields(
    model: str,
    progress: ModelFallbackProgress,
    correlation: Correlation | None,
    goal: tuple[str | None, str | None],
) -> dict[str, Any]:
    """What a durable record of a turn to continue keeps beside its budget, flat (R58, R60).

    A cut record and a compaction's follow-up (AS-37) store the same fields.
    """
    return {
        "model": model,
        "requested_model": progress.requested_model,
        "refused_models": progress.refused_models,
        "chain": progress.chain,
        "handle_id": correlation.handle_id if correlation else None,
        "owner_session": correlation.owner_session if correlation else None,
        "turn_id": correlation.turn_id if correlation else None,
        "goal_kind": goal[0],
        "goal_id": goal[1],
    }


def to_messages(rows: Sequence[HistoryRow]) -> tuple[ChatMessage, ...]:
    """The model request messages a history says (AS-22), from its last summary on (AS-36)."""
    messages: list[ChatMessage] = []
    for row in _from_last_summary(rows):
        body = decode_body(row)
        if row.kind is RowKind.SUMMARY:
            text = f"{SUMMARY_HEADING}\n{body.text}"
            messages.append(ChatMessage(role=Role.SYSTEM, text=text))
        elif row.kind in (RowKind.USER, RowKind.SENTINEL):
            messages.append(ChatMessage(role=Role.USER, text=body.text))
        elif row.kind is RowKind.SYSTEM:
            messages.append(ChatMessage(role=Role.SYSTEM, text=body.text))
        else:
            messages.extend(assistant_messages(body))
    return tuple(messages)


def _from_last_summary(rows: Sequence[HistoryRow]) -> list[HistoryRow]:
    """The rows a request reads: the last summary row, then every later row it does not cover.

    A summary written as a turn launched covers the rows up to its ``through``; the turn's own
    row, before it, comes after it (AS-36 on send).
    """
    last = max((i for i, row in enumerate(rows) if row.kind is RowKind.SUMMARY), default=None)
    if last is None:
        return list(rows)
    summary = rows[last]
    through = decode_body(summary).through
    if through is None:
        return list(rows[last:])
    kept = [r for r in rows if r.seq > through and r.kind is not RowKind.SUMMARY]
    return [summary, *kept]


def assistant_messages(body: RowBody) -> list[ChatMessage]:
    """An assistant row as the model sees it: what it said and called, then the results."""
    out: list[ChatMessage] = []
    if body.text or body.tool_calls:
        out.append(ChatMessage(role=Role.ASSISTANT, text=body.text, tool_calls=body.tool_calls))
    if body.tool_results:
        out.append(ChatMessage(role=Role.TOOL, tool_results=body.tool_results))
    return out


def unanswered(rows: Sequence[HistoryRow]) -> int:
    """Tool results in history that no later model step answered (``expect.unanswered``).

    A complete assistant row whose stream ended on a tool boundary (``tool-calls``) leaves the
    results of its last step unanswered until a later model step says something; any other
    finish, or a later assistant or partial row with text or calls, answers them.
    """
    pending = 0
    for row in rows:
        if row.kind not in (RowKind.ASSISTANT, RowKind.PARTIAL):
            continue
        body = decode_body(row)
        if body.text or body.tool_calls:
            pending = 0
        if row.kind is RowKind.ASSISTANT and body.finish == "tool-calls" and body.tool_results:
            pending = body.open_results if body.open_results is not None else 1
    return pending


def needs_continue_sentinel(rows: Sequence[HistoryRow]) -> bool:
    """AS-22: a request must not end with a complete assistant row."""
    return bool(rows) and rows[-1].kind is RowKind.ASSISTANT
