"""When a sent message is safe: ``await session.send(...)`` (``docs/session.md``).

A user message is *safe* once it is durable: committed to the session's durable queue (the
session was busy) or accepted into history (its user row committed, the point of no return).
``AgentSession.send`` returns a :class:`Delivery` at once; awaiting it waits until the message
is safe or will never be (refused before its row, or its queue write failed), and returns it.
A host that never awaits it loses nothing: the message is queued or sent all the same.
"""

from __future__ import annotations

from collections.abc import Generator
from enum import StrEnum
from typing import Any

import anyio


class DeliveryState(StrEnum):
    """What became of a sent message so far."""

    #: Neither durable nor refused yet.
    PENDING = "pending"
    #: Committed to the session's durable queue: it survives a crash and runs after it.
    QUEUED = "queued"
    #: Its user row is committed: it is in history (the turn may still fail later).
    ACCEPTED = "accepted"
    #: Refused or cancelled before any row was kept (``detail`` says why).
    REFUSED = "refused"
    #: Queued in memory only: the store refused the write (``detail``); it runs unless the
    #: process dies first.
    NOT_DURABLE = "not-durable"


class Delivery:
    """A sent message's delivery: awaitable, and readable at any time (``state``).

    Attributes:
        message: The message's id in the queue (``None`` for a message sent straight to an
            idle session: its row id is in history once accepted).
        state: What became of it so far.
        detail: Why, when it was refused or is not durable.
    """

    __slots__ = ("_waiter", "detail", "message", "state")

    def __init__(self, message: str | None = None) -> None:
        self.message = message
        self.state = DeliveryState.PENDING
        self.detail: str | None = None
        self._waiter: anyio.Event | None = None  # made only when someone waits

    @property
    def safe(self) -> bool:
        """Whether the message is durable (queued or in history)."""
        return self.state is DeliveryState.QUEUED or self.state is DeliveryState.ACCEPTED

    @property
    def settled(self) -> bool:
        """Whether awaiting it would return at once."""
        return self.state is not DeliveryState.PENDING

    def settle(self, state: DeliveryState, detail: str | None = None) -> None:
        """Record what became of the message (the first settlement wins)."""
        if self.state is not DeliveryState.PENDING:
            return
        self.state, self.detail = state, detail
        if self._waiter is not None:
            self._waiter.set()

    def __await__(self) -> Generator[Any, None, Delivery]:
        return self._wait().__await__()

    async def _wait(self) -> Delivery:
        if self.state is DeliveryState.PENDING:
            if self._waiter is None:
                self._waiter = anyio.Event()
            await self._waiter.wait()
        return self

    def __repr__(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return f"<Delivery {self.message or 'direct'} {self.state.value}{detail}>"
