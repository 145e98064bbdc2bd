"""The owner port of delegated turns, and the router between the engine's owner and a host's.

A target session tells its owner what each stream of a delegated turn did
(:data:`~agent_session._delegation.ChildEvent`) and asks it, before a resume launches, whether
the turn's handle still admits it (R41). :class:`TurnOwner` is that port. The engine's own
owner (``Delegations``: handles in the engine's store, the turns sessions of one engine
delegate to each other) implements it; a host with a task store of its own implements it too
and passes it as ``Engine(owner=...)``. :class:`Owners` routes between the two: an event of
a correlation whose handle the engine's owner holds goes to it, any other correlated event to
the host's; what concerns a whole target (an uncorrelated stream-end, TD-4; a hard stop,
TD-7; disposal, R27) goes to both.

A host's owner answers the claim the way the engine's does: inside :meth:`TurnOwner.on_child`
for a correlated ``tool-calls`` end, it calls ``engine.session(target).claim(correlation,
stream)`` (synchronous, ST-15) and defers on ``True`` or settles on ``False``. What it returns
is awaited by the target before it goes on (its decision durable before the target drains).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agent_session._delegation import ChildEvent, Delegations
    from message_queue import Correlation


class TurnOwner(Protocol):
    """The owner side of delegated turns, as the engine's sessions tell it and ask it."""

    def on_child(self, event: ChildEvent) -> Awaitable[None] | None:
        """A target's stream ended, aborted or failed, or its delegated turn was forfeited.

        Decide at once (a claim for a ``tool-calls`` end, a settlement that is idempotent for
        a handle already settled, TD-10); return the write of the decision for the target to
        await, or ``None`` when nothing changed. Never raise: the target's flow runs it.
        """
        ...

    def refusal(self, correlation: Correlation, target: str) -> str | None:
        """R41: why ``target`` may not continue ``correlation``'s turn, or ``None``.

        Asked at every launch checkpoint of a resume: answer from what is known now.
        """
        ...

    def turn_began(self, handle: str) -> None:
        """A stream of the delegated turn ``handle`` started (its prompt row is in history)."""
        ...


class Owners:
    """The engine's owner and, when the host gave one, the host's: each event to its owner."""

    __slots__ = ("_host", "_own")

    def __init__(self, own: Delegations, host: TurnOwner | None) -> None:
        self._own = own
        self._host = host

    @property
    def host(self) -> TurnOwner | None:
        """The host's owner, if the host gave one."""
        return self._host

    def on_child(self, event: ChildEvent) -> Awaitable[None] | None:
        """Route ``event``: by its correlation's handle, or to both for a whole target."""
        host = self._host
        if host is None:
            return self._own.on_child(event)
        correlation: Correlation | None = getattr(event, "correlation", None)
        if correlation is not None:
            owner = self._own if self._own.knows(correlation.handle_id) else host
            return owner.on_child(event)
        writes = [w for w in (self._own.on_child(event), host.on_child(event)) if w is not None]
        if len(writes) < 2:
            return writes[0] if writes else None
        return _in_order(*writes)

    def refusal(self, correlation: Correlation, target: str) -> str | None:
        """R41, from the owner that holds the handle."""
        if self._host is None or self._own.knows(correlation.handle_id):
            return self._own.refusal(correlation, target)
        return self._host.refusal(correlation, target)

    def follow_up_refusal(self, correlation: Correlation, target: str) -> str | None:
        """TD-8 for a follow-up of the turn, from the owner that holds its handle.

        The engine's owner for its handles, else the host's (its ``refusal``), else nothing.
        """
        if self._own.knows(correlation.handle_id) or self._host is None:
            return self._own.follow_up_refusal(correlation, target)
        return self._host.refusal(correlation, target)

    def turn_began(self, handle: str) -> None:
        """Both hear it; each ignores a handle it does not hold."""
        self._own.turn_began(handle)
        if self._host is not None:
            self._host.turn_began(handle)


async def _in_order(*writes: Awaitable[None]) -> None:
    for write in writes:
        await write


__all__ = ["Owners", "TurnOwner"]
