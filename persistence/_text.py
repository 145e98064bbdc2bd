"""Stored text as a store reads it back and as messages show it.

A TEXT value that is not UTF-8 fails Python's ``sqlite3`` for the whole query ("Could not
decode to UTF-8 column ..."): one damaged row would hide every other row the query reads. A
read that meets one runs again with a text factory that hands such a value over as
:class:`NotUtf8` (its bytes, never decoded), so the decoders name that one row and field
(``persistence._decode``) and the others read as usual. Sound reads pay nothing: the retry
runs only after the failure.

A stored value can be any size; a message that shows one shows at most :data:`SHOWN`
characters of it, with its size (:func:`clip`), so a damaged 20 MB value never reaches a log
line, an error or a printed report whole.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")

#: The characters of a value a message shows at most (the rest is cut, its size said).
SHOWN = 200
_UNDECODABLE = "Could not decode to UTF-8"


class NotUtf8(bytes):
    """A stored TEXT value that is not UTF-8, read back as its bytes."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<text that is not UTF-8, {len(self):,} bytes>"


def _text(data: bytes) -> str | NotUtf8:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return NotUtf8(data)


def tolerant(job: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
    """``job`` (a read), run again reading undecodable TEXT as :class:`NotUtf8` if it met one."""

    def run(db: sqlite3.Connection) -> T:
        try:
            return job(db)
        except sqlite3.OperationalError as exc:
            if not str(exc).startswith(_UNDECODABLE):
                raise
        db.text_factory = _text
        try:
            return job(db)
        finally:
            db.text_factory = str

    return run


def clip(value: object, limit: int = SHOWN) -> str:
    """``value`` as text, at most about ``limit`` characters: a longer one is cut, its size said.

    ``"abc… (20,971,520 bytes, cut)"``; bytes are shown by their ``repr``.
    """
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, bytes) else len(text.encode(errors="replace"))
    return f"{text[:limit]}… ({size:,} bytes, cut)"
