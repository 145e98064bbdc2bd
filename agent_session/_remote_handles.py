"""A delegated turn whose owner and target run in different engine processes (LS-11).

On a store many processes share, the engine holding a delegated turn's *target* decides it:
its claims (ST-15) and its settlement (TD-2 to TD-10) are made there, from the target's own
stream events, and written under the target's lease. The engine holding the *owner* only
starts the turn and hears how it ends:

* **start**: the owner's engine writes the handle and posts the prompt to the target's inbox
  in one transaction fenced by the owner's lease (``LeasedStore.delegate``); the inbox row
  names the handle.
* **take**: the engine that takes the prompt (the target's holder, or whoever takes an
  unowned target, LS-9) reads the handle from the store, adopts it, and queues the prompt
  with the turn's correlation. A prompt whose turn settled before it was taken is dropped.
* **claim**: an engine that claims a session (LS-8) adopts the active handles delegated into
  it before it recovers it, and settles those nothing continues, as a startup does.
* **hear**: a handle written under a target's lease for an owner held elsewhere is followed by
  a ``pg_notify`` naming the owner; the owner's engine reads its handles and settles its
  in-memory record (``Delegations.heard``), waking ``Delegation.settled()``. Its claim rounds
  poll the same (the fallback when a notification is lost).
* **interrupt**: the owner's TD-8 is a request to the target's holder (LS-10), carried out
  there by ``Engine.interrupt_handle``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from agent_session._delegation import Delegation, Delegations
from agent_session._requests import Asker, RequestRefused
from agent_session._session import AgentSession
from message_queue import Correlation, MessageMetadata, MetadataType, NewMessage
from persistence import (
    Boundary,
    HandleRecord,
    HandleStatus,
    LeasedStore,
    Reply,
    TurnkeeperError,
    UsageError,
    clip,
)
from stream_manager import Persisted

log = logging.getLogger("turnkeeper.delegation")


def correlation_of(record: HandleRecord) -> Correlation:
    """The correlation a delegated turn's entries and streams carry."""
    return Correlation(
        handle_id=record.handle_id, owner_session=record.owner, turn_id=record.turn_id
    )


class RemoteHandles:
    """The engine's side of delegated turns across processes (LS-11)."""

    __slots__ = ("_delegations", "_emit", "_sessions", "_store")

    def __init__(
        self,
        store: LeasedStore,
        delegations: Delegations,
        sessions: Mapping[str, AgentSession],
        emit: Callable[[Persisted], None],
    ) -> None:
        self._store = store
        self._delegations = delegations
        self._sessions = sessions
        self._emit = emit

    # ------------------------------------------------------------ the owner's side

    async def start(self, delegation: Delegation, record: HandleRecord, text: str) -> None:
        """Write the handle and post its prompt in one transaction; a failure ends it unstarted."""
        try:
            await self._store.delegate(record, text)
        except (TurnkeeperError, OSError) as error:
            log.warning("the delegated turn %s was not recorded: %s", record.handle_id, error)
            self._delegations.delegated(delegation, error)
            return
        self._emit(Persisted(session=record.owner, what="handle", id=record.handle_id))

    async def hear(self, owner: str) -> None:
        """Read ``owner``'s handles as their targets' holders wrote them; settle what ended."""
        if owner not in self._delegations.awaited_owners():
            return
        try:
            found = await self._store.handles(owner=owner)
        except (TurnkeeperError, OSError) as error:
            log.warning("the handles of %s were not read: %s", clip(owner), error)
            return
        self._delegations.heard(found.records)

    async def poll(self) -> None:
        """The fallback of a claim round: every owner waiting on a turn elsewhere reads again."""
        for owner in sorted(self._delegations.awaited_owners()):
            await self.hear(owner)

    async def interrupt(self, asker: Asker, record: HandleRecord) -> bool:
        """TD-8 for a turn running elsewhere, asked of the target's holder.

        ``False`` if it already was interrupted there.

        Raises:
            RequestUnanswered: No answer in time (the request is withdrawn).
            RequestRefused: The holder refused (the turn settled ``completed`` meanwhile ...).
        """
        reply = await asker.ask(record.target, "interrupt", {"handle": record.handle_id})
        await self.hear(record.owner)  # what the holder wrote, settled here before returning
        if not reply.ok:
            raise RequestRefused(record.target, "interrupt", reply.error, reply.message)
        return reply.value == "interrupted"

    # ------------------------------------------------------------ the target's side

    async def prompt(self, session: AgentSession, entry: str, text: str, handle: str) -> bool:
        """Take a delegated turn's prompt into ``session`` (held here); whether it is queued.

        The handle is read from the store (unless this engine holds its owner too, and so
        knows it first-hand) and adopted. A prompt whose turn is no longer active, or whose
        handle is not there, is taken off the inbox unqueued.

        Raises:
            UsageError: The queue refused it (a duplicate entry: queued already).
        """
        record = await self._current(session.id, handle)
        if record is None or record.status is not HandleStatus.ACTIVE:
            why = "its handle is gone" if record is None else f"it settled {record.status}"
            log.info("the prompt %s of %s is dropped: %s", entry, handle, why)
            await self._store.drop_mail(session.id, entry)
            return False
        self._delegations.adopt(record, begun=False)
        session.listen_for_owner()
        metadata = MessageMetadata(
            type=MetadataType.WORKSPACE_TURN, correlation=correlation_of(record)
        )
        session.enqueue_message(NewMessage(text=text, id=entry, metadata=metadata))
        return True

    async def adopt_claimed(self, claimed: Collection[str]) -> None:
        """The handles delegated into ``claimed`` (just taken here), adopted as stored.

        Adopted before their recovery: this engine decides the active ones now, and a copy
        read earlier (a startup reads every handle) gives way to what was written since, so
        a turn settled elsewhere is never settled again here. One this engine owns stays as
        it knows it.
        """
        found = await self._store.handles_into(sorted(claimed))
        for record in found.records:
            if not self._owned_here(record):
                self._delegations.adopt(record, begun=True)
        for key, why in found.corrupt:
            log.error("handle %s is damaged and treated as not active: %s", key, why)

    async def carry_out_interrupt(
        self, session_id: str, handle: str, interrupt: Callable[[str], bool]
    ) -> Reply:
        """An owner's interrupt, asked of this engine, which holds ``session_id``: its reply."""
        record = await self._current(session_id, handle)
        if record is None or record.target != session_id:
            raise UsageError(f"no delegated turn {handle!r} runs in session {session_id!r}")
        if not self._delegations.knows(handle):
            self._delegations.adopt(record, begun=True)
        done = interrupt(handle)
        await self._delegations.wait_settled(handle)
        return Reply(ok=True, value="interrupted" if done else "already interrupted")

    async def written(self, session: str, boundary: Boundary) -> None:
        """After a handle write under ``session``'s lease: tell the owners held elsewhere."""
        for owner in sorted({r.owner for r in boundary.handles if r.owner != session}):
            try:
                await self._store.notify_handle(owner)
            except (TurnkeeperError, OSError) as error:  # the owner's poll finds it
                log.warning("the owner %s was not told of its handle: %s", clip(owner), error)

    def _owned_here(self, record: HandleRecord) -> bool:
        return (
            record.owner in self._sessions and self._delegations.find(record.handle_id) is not None
        )

    async def _current(self, target: str, handle: str) -> HandleRecord | None:
        """``handle``'s record: this engine's when it holds the owner, else the store's."""
        known = self._delegations.find(handle)
        if known is not None and known.owner in self._sessions:
            return known
        found = await self._store.handles(target=target)
        return next((r for r in found.records if r.handle_id == handle), None)


__all__ = ["RemoteHandles", "correlation_of"]
