"""B4: a stream's in-progress assistant message, durable as it grows (``docs/session.md``).

A :class:`PartialLog` mirrors one stream's parts (the very list the stream appends to) and
says which of them the store does not hold yet. Every receipt write of the stream carries
them (:meth:`PartialLog.chunk`), so the partial costs no transaction of its own: a step's text,
calls and finish are durable with its receipts, written before its calls run, and a call's
result is durable with the receipt that completes it, so no receipt says ``completed`` while
its result died in a crash. What a step streams after its last receipt write (the text of a
step still running) is not written: a crash loses it, and the retry asks for that step again.

The stream's final row (B5), its abort row (B6) or the next stream start (PS-2) drops the
partial in the transaction that commits the row; :meth:`PartialLog.close` stops the writes
before the final row is written.

Parts are encoded here (msgspec JSON of the tagged :data:`Part` union) and decoded by
:func:`decode_parts`, which names the stored part it could not read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from persistence import CorruptRecord, PartialChunk, StoredPartial, clip
from stream_manager._parts import Part

if TYPE_CHECKING:
    from collections.abc import Sequence

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Part)


def encode_part(part: Part) -> bytes:
    """The bytes stored for ``part``."""
    return _encoder.encode(part)


def decode_parts(session: str, stored: StoredPartial) -> tuple[Part, ...]:
    """A stored partial's parts, or ``CorruptRecord`` naming the part that does not read."""
    parts: list[Part] = []
    for position, body in enumerate(stored.parts):
        try:
            parts.append(_decoder.decode(body))
        except (msgspec.DecodeError, RecursionError, OverflowError) as error:
            key = f"{clip(session)}/{clip(stored.stream)}/{position}"
            raise CorruptRecord("partial_parts", key, f"$.body: {clip(str(error))}") from None
    return tuple(parts)


class PartialLog:
    """The parts of one stream, and how many of them the store holds."""

    __slots__ = ("closed", "parts", "stream", "written")

    def __init__(self, stream: str, parts: list[Part]) -> None:
        self.stream = stream
        #: The stream's own list: whoever appends to the stream appends here.
        self.parts = parts
        #: How many of ``parts`` the store holds (they are a prefix of ``parts``).
        self.written = 0
        #: Set once the stream's outcome is decided: its row takes the parts from then on.
        self.closed = False

    def chunk(self) -> PartialChunk | None:
        """The parts the store does not hold yet, for the next write; ``None``: nothing new."""
        if self.closed or self.written == len(self.parts):
            return None
        fresh: Sequence[Part] = self.parts[self.written :]
        return PartialChunk(
            stream=self.stream, start=self.written, parts=tuple(map(encode_part, fresh))
        )

    def wrote(self, chunk: PartialChunk | None) -> None:
        """``chunk`` is durable."""
        if chunk is not None:
            self.written = max(self.written, chunk.start + len(chunk.parts))

    def close(self) -> None:
        """No more writes: the stream's row (or the next stream's start) takes the parts."""
        self.closed = True
