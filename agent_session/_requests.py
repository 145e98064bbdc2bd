"""Stop and resolve from any process (LS-10): asking a session's holder, and answering.

The asker side is :class:`Asker`: it posts a request (``LeasedStore.ask``), waits for the
holder's answer (woken by the answer's notification, polling as the fallback), and gives up
after ``timeout_s`` by withdrawing the request. The holder side is :func:`answer_requests`:
each request not begun is marked begun, carried out, and answered. Both wait on real time,
never the engine's clock: the holder is another process.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from persistence import (
    LeasedStore,
    OperationRecord,
    Reply,
    Request,
    RequestKind,
    Resolution,
    TurnkeeperError,
    clip,
    found_receipt,
)
from stream_manager import WriteFailed

log = logging.getLogger("turnkeeper.engine")


class RequestUnanswered(TurnkeeperError):
    """The session's holder did not answer a stop or a resolution in time.

    The request was withdrawn. ``begun`` says whether the holder had begun it: when not, it
    was never carried out and never will be; when it had, whether it was is not known (look
    at the session, or the receipt, before asking again).

    Attributes:
        session: The session asked for.
        kind: ``stop`` or ``resolve``.
        begun: Whether the holder had begun it.
    """

    def __init__(self, session: str, kind: str, *, waited: float, begun: bool) -> None:
        fate = (
            "it was begun and its outcome is not known"
            if begun
            else "it was withdrawn and not carried out"
        )
        super().__init__(
            f"the holder of session {session!r} did not answer the {kind} in {waited:g}s: {fate}"
        )
        self.session = session
        self.kind = kind
        self.begun = begun


class RequestRefused(TurnkeeperError):
    """The session's holder carried out a stop or a resolution and it failed there.

    Attributes:
        session: The session asked for.
        kind: ``stop`` or ``resolve``.
        error: The holder's error type (``NotResolvable``, ``SessionDisposed`` ...).
        detail: The holder's error message.
    """

    def __init__(self, session: str, kind: str, error: str, detail: str) -> None:
        super().__init__(f"the holder of session {session!r} refused the {kind}: {error}: {detail}")
        self.session = session
        self.kind = kind
        self.error = error
        self.detail = detail


def refusal(error: BaseException) -> Reply:
    """The reply that carries ``error`` back to the asker."""
    return Reply(ok=False, error=type(error).__name__, message=str(error))


class Asker:
    """Asks the holders of sessions in other processes, and waits for their answers.

    ``heard(request)`` is the store's answer notification (``watch_answers``).
    """

    __slots__ = ("_poll_s", "_store", "_timeout_s", "_waiting")

    def __init__(self, store: LeasedStore, *, timeout_s: float, poll_s: float) -> None:
        self._store = store
        self._timeout_s = timeout_s
        self._poll_s = poll_s
        self._waiting: dict[int, anyio.Event] = {}

    @property
    def store(self) -> LeasedStore:
        """The store the requests are posted to."""
        return self._store

    def heard(self, request: int) -> None:
        """The holder answered ``request``: wake its asker."""
        event = self._waiting.get(request)
        if event is not None:
            event.set()

    async def ask(self, session: str, kind: RequestKind, body: dict[str, str]) -> Reply:
        """Ask ``session``'s holder to carry out ``kind``; its reply.

        Raises:
            RequestUnanswered: No answer in ``timeout_s`` (the request is withdrawn).
            UsageError: The session does not exist (nothing asked).
            StoreError: The database failed.
        """
        store = self._store
        number = await store.ask(session, kind, body)
        self._waiting[number] = anyio.Event()
        try:
            with anyio.move_on_after(self._timeout_s):
                while (reply := await store.take_answer(number)) is None:
                    with anyio.move_on_after(self._poll_s):
                        await self._waiting[number].wait()
                    self._waiting[number] = anyio.Event()
                return reply
            with anyio.CancelScope(shield=True):
                fate = await store.withdraw(number)
                reply = await store.take_answer(number) if fate == "answered" else None
        except BaseException:
            with anyio.CancelScope(shield=True):  # cancelled: never carried out after
                await _withdraw_quietly(store, number)
            raise
        finally:
            self._waiting.pop(number, None)
        if reply is not None:
            return reply  # answered as the wait ran out
        raise RequestUnanswered(session, kind, waited=self._timeout_s, begun=fate == "begun")


async def resolve_by_holder(
    asker: Asker, session: str, op_id: str, as_: Resolution, note: str
) -> OperationRecord:
    """Ask the holder of ``session`` to resolve its receipt ``op_id``; the receipt it wrote.

    Raises:
        RequestUnanswered: No answer in time (withdrawn).
        WriteFailed: The holder's write failed (the operation stays indeterminate).
        RequestRefused: The holder refused otherwise (``NotResolvable`` when it was settled
            meanwhile ...), naming its error's type.
    """
    reply = await asker.ask(session, "resolve", {"op_id": op_id, "as": as_.value, "note": note})
    if not reply.ok:
        if reply.error == WriteFailed.__name__:
            raise WriteFailed(f"the holder of session {session!r}: {reply.message}")
        raise RequestRefused(session, "resolve", reply.error, reply.message)
    return found_receipt(await asker.store.receipts(op_id=op_id), op_id)


async def _withdraw_quietly(store: LeasedStore, number: int) -> None:
    try:
        if await store.withdraw(number) == "answered":
            await store.take_answer(number)  # nobody waits for it now: the row goes
    except (TurnkeeperError, OSError) as error:
        log.warning("request %d was not withdrawn: %s", number, error)


async def answer_requests(
    store: LeasedStore, session: str, carry_out: Callable[[Request], Awaitable[Reply]]
) -> int:
    """Carry out ``session``'s requests not begun, oldest first, and answer each; how many.

    The caller holds the session. A request its asker withdrew meanwhile is left (``begin``
    refuses it). A reply that cannot be written is logged: the asker's wait runs out and it
    learns the request was begun.
    """
    done = 0
    for request in await store.requests(session):
        if not await store.begin(request.id):
            continue  # withdrawn meanwhile: never carried out
        reply = await carry_out(request)
        try:
            await store.answer(request.id, reply)
        except (TurnkeeperError, OSError) as error:
            log.warning("the %s of %s was not answered: %s", request.kind, clip(session), error)
        done += 1
    return done
