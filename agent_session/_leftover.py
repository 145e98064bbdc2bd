"""PS-2: the partial a stream left, committed into history before anything follows it.

A stream's parts are durable as it runs (B4, ``stream_manager._partial``); its final row (B5)
or its abort row (B6) takes them and drops the partial in one transaction. A stream that
failed, or whose row could not be written, or that a crash cut off, leaves them: the next row
the session appends (a user row, or a stream's start, PS-2) first commits them as a
``partial`` row, every call in them answered (a call without a result gets one that says what
is known: providers refuse a call with no result), and drops them in the same transaction.

The session keeps the parts of its own failed stream in memory (they hold what the store may
not: the text of the step that failed); the store's are read at every stream start, so a
partial from before a restart, or one whose row's write failed, is never skipped. A stored
partial that does not decode is logged and left in the store for a person to see.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from agent_session._rows import body_from_parts
from persistence import CorruptRecord, clip
from stream_manager import Part, answer_open_calls, decode_parts

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agent_session._rows import RowBody
    from persistence import StoredPartial
    from stream_manager import ModelUsage

log = logging.getLogger("turnkeeper.session")


@dataclass(frozen=True, slots=True)
class Leftover:
    """The parts one stream left, and the model that produced them."""

    stream: str
    parts: tuple[Part, ...]
    model: str
    #: What its steps used, by model (recorded on the row that takes it, SM-14).
    usage: tuple[ModelUsage, ...] = ()


def body_of(leftover: Leftover) -> RowBody:
    """The ``partial`` row's body: the parts, every call answered, and their usage."""
    parts = list(leftover.parts)
    answer_open_calls(parts, mid_step=True)
    body = body_from_parts(parts, finish=None, model=leftover.model)
    return msgspec.structs.replace(body, usage=leftover.usage) if leftover.usage else body


def gather(
    session: str, known: Leftover | None, stored: Sequence[StoredPartial], model: str
) -> tuple[list[Leftover], tuple[str, ...]]:
    """What to commit (in order), and every stream whose stored partial goes with it.

    ``known``: the session's own leftover (it wins over the store's copy of its stream).
    A stored partial that does not decode is neither committed nor dropped (logged).
    """
    found: list[Leftover] = []
    drops: list[str] = []
    for partial in stored:
        if known is not None and partial.stream == known.stream:
            continue
        try:
            parts = decode_parts(session, partial)
        except CorruptRecord as error:
            log.error(
                "the partial of stream %s of %s is damaged and kept for a person to see: %s",
                clip(partial.stream),
                clip(session),
                error,
            )
            continue
        drops.append(partial.stream)
        if parts:
            found.append(Leftover(partial.stream, parts, model))
    if known is not None:
        drops.append(known.stream)
        if known.parts:
            found.append(known)
    return found, tuple(drops)
