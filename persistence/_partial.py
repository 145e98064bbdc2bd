"""The session's partial (B4): checking a chunk before it is written, assembling what is read.

Both stores keep a stream's in-progress parts by position, byte-exact, and read them back
through :func:`assemble`, so a position missing in the middle (a store edited by hand) ends
what is read there instead of closing the gap silently. SQLite's rows go through
:func:`decode_parts` first: a damaged one is a gap too, and is logged.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from persistence._errors import CorruptRecord, UsageError
from persistence._text import clip
from persistence.records import MAX_SEQ, PartialChunk, StoredPartial

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

log = logging.getLogger("turnkeeper.persistence")


def check_chunk(session: str, chunk: PartialChunk | None, drops: tuple[str, ...]) -> None:
    """Refuse a partial chunk a reader could not place.

    Raises:
        UsageError: Naming the field that is wrong; nothing is written.
    """
    for index, stream in enumerate(drops):
        if type(stream) is not str or not stream:
            raise UsageError(
                f"Boundary.drop_partials[{index}] of session {session!r} is not a stream id; "
                "nothing was written"
            )
    if chunk is None:
        return
    if type(chunk.stream) is not str or not chunk.stream:
        raise UsageError(
            f"Boundary.partial of session {session!r} names no stream; nothing was written"
        )
    if type(chunk.start) is not int:
        raise UsageError(
            f"Boundary.partial.start of stream {chunk.stream!r} is "
            f"{type(chunk.start).__name__}, not an int; nothing was written"
        )
    if chunk.start < 0 or chunk.start + len(chunk.parts) > MAX_SEQ:
        raise UsageError(
            f"Boundary.partial of stream {chunk.stream!r}: positions {chunk.start}.."
            f"{chunk.start + len(chunk.parts)} are not in 0..{MAX_SEQ}; nothing was written"
        )
    for index, part in enumerate(chunk.parts):
        if type(part) is not bytes:
            raise UsageError(
                f"Boundary.partial.parts[{index}] of stream {chunk.stream!r} is "
                f"{type(part).__name__}, not bytes; nothing was written"
            )


def assemble(stream: str, stored: Iterable[tuple[int, bytes]]) -> StoredPartial:
    """A stream's stored parts from ``(position, body)`` pairs, in order, up to the first gap."""
    parts: list[bytes] = []
    for position, body in sorted(stored, key=lambda pair: pair[0]):
        if position != len(parts):
            return StoredPartial(stream=stream, parts=tuple(parts), gap=len(parts))
        parts.append(body)
    return StoredPartial(stream=stream, parts=tuple(parts))


def decode_parts(session: str, rows: Sequence[Sequence[Any]]) -> tuple[StoredPartial, ...]:
    """A session's stored partials from its ``partial_parts`` rows ``(stream, position, body)``.

    ``rows`` come in the order they were first written: the streams come back in the order
    each first wrote a part. A damaged row (its position not an integer in 0..``MAX_SEQ``, its
    body not a blob, as a hand edit leaves them) never fails the load: it is logged as an
    error naming the table, session, stream and position, and its stream's parts stop at the
    first position not read intact (``gap``), so a damaged partial is never read as whole. A
    row whose stream id is not text names no stream a reader could ask for: logged, skipped.
    Nothing stored is changed.
    """
    found: dict[str, list[tuple[int, bytes]]] = {}
    damaged: dict[str, int] = {}  # stream -> where its parts stop at the latest
    for stream, position, body in rows:
        if type(stream) is not str:
            _damage(session, stream, position, "$.stream: not text; the part is skipped")
            continue
        pairs = found.setdefault(stream, [])
        placed = type(position) is int and 0 <= position <= MAX_SEQ
        if placed and type(body) is bytes:
            pairs.append((position, body))
            continue
        if placed:
            why, stop = f"$.body: {type(body).__name__}, not a blob", position
        else:  # placed nowhere: the stream's intact run ends where it ends, as a gap
            why = f"$.position: {clip(repr(position))} is not a position in 0..{MAX_SEQ}"
            stop = MAX_SEQ + 1
        damaged[stream] = min(damaged.get(stream, stop), stop)
        _damage(session, stream, position, f"{why}; the stream's parts are read up to a gap")
    partials = []
    for stream, pairs in found.items():
        stop = damaged.get(stream)
        if stop is None:
            partials.append(assemble(stream, pairs))
            continue
        cut = assemble(stream, [pair for pair in pairs if pair[0] < stop])
        partials.append(StoredPartial(stream=stream, parts=cut.parts, gap=len(cut.parts)))
    return tuple(partials)


def _damage(session: str, stream: object, position: object, detail: str) -> None:
    key = f"{clip(session)}/{clip(stream)}/{clip(position)}"
    log.error("%s", CorruptRecord("partial_parts", key, detail))
