"""Requests to a session's holder (LS-10): what one engine process asks of another.

A stop, a resolution or a delegated turn's interrupt (LS-11) asked for a session another
process holds is a row of the ``requests`` table, posted with a ``pg_notify`` in one
transaction. The holder carries it out and writes its :class:`Reply` (with a ``pg_notify`` of
its own); the asker takes the reply and the row goes. Bodies and replies are JSON, encoded and
decoded here, so a damaged row is a ``CorruptRecord`` naming its key, never a crash.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from persistence._errors import CorruptRecord

#: What may be asked of a holder.
RequestKind = Literal["stop", "resolve", "interrupt"]
KINDS: tuple[RequestKind, ...] = ("stop", "resolve", "interrupt")
#: What became of a withdrawn request (``PostgresStore.withdraw``).
Withdrawn = Literal["withdrawn", "begun", "answered"]


class Request(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One request a holder has not answered yet.

    Attributes:
        id: The request's number (the ``requests`` row's key).
        session: The session it is for.
        kind: ``stop``, ``resolve`` or ``interrupt``.
        body: Its arguments (a resolve's ``op_id``, ``as`` and ``note``; an interrupt's
            ``handle``; a stop's none).
    """

    id: int
    session: str
    kind: RequestKind
    body: dict[str, str]


class Reply(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A holder's answer to a request.

    Attributes:
        ok: Whether it was carried out.
        value: What it gave (a stop's restored queue text; a resolve's operation id).
        error: When not carried out: the error's type name (``NotResolvable``,
            ``WriteFailed``, ``UsageError``, ``LeaseLost``) ...
        message: ... and its message.
    """

    ok: bool
    value: str = ""
    error: str = ""
    message: str = ""


_body = msgspec.json.Decoder(dict[str, str])
_reply = msgspec.json.Decoder(Reply)


def encode(value: dict[str, str] | Reply) -> bytes:
    """A body or a reply as stored (JSON)."""
    return msgspec.json.encode(value)


def decode_request(number: int, session: str, kind: str, body: bytes) -> Request:
    """A stored request.

    Raises:
        CorruptRecord: Its kind is unknown or its body is not a JSON object of strings.
    """
    if kind not in KINDS:
        raise CorruptRecord("requests", str(number), f"$.kind: unknown kind {kind!r}")
    try:
        arguments = _body.decode(body)
    except msgspec.DecodeError as exc:
        raise CorruptRecord("requests", str(number), f"$.body: {exc}") from None
    checked = next(known for known in KINDS if known == kind)
    return Request(id=number, session=session, kind=checked, body=arguments)


def decode_reply(number: int, answer: bytes) -> Reply:
    """A stored reply.

    Raises:
        CorruptRecord: It is not a reply's JSON.
    """
    try:
        return _reply.decode(answer)
    except msgspec.DecodeError as exc:
        raise CorruptRecord("requests", str(number), f"$.answer: {exc}") from None
