"""The session's partial (B4): checking a chunk before it is written, assembling what is read.

Both stores keep a stream's in-progress parts by position, byte-exact, and read them back
through :func:`assemble`, so a position missing in the middle (a store edited by hand) ends
what is read there instead of closing the gap silently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence._errors import UsageError
from persistence.records import MAX_SEQ, PartialChunk, StoredPartial

if TYPE_CHECKING:
    from collections.abc import Iterable


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
