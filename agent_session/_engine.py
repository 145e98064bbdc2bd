"""The Engine: the composition root a host embeds.

It owns the store, the stream manager (models, tools, clock), the sessions and one task group
in which every session's turns run. Events from the stream manager and the sessions reach the
engine's observers synchronously, in order, before the session reacts to them (so an observer
sees a fact before its consequences).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, NamedTuple, Self

import anyio
import anyio.abc
import msgspec

from agent_session._admission import Admission, GoalBoard, Goals, WorkspaceBoard, Workspaces
from agent_session._continuation import EndedHow
from agent_session._delegation import Delegation, Delegations, final_report
from agent_session._events import (
    ContinuationEnded,
    EngineEvent,
    Recovered,
    ResumeAttempted,
    RetryAbandoned,
)
from agent_session._owners import Owners, TurnOwner
from agent_session._queue_keeper import QueueKeeper, RebuiltQueue, rebuild
from agent_session._recovery import (
    Abandon,
    DropFollowUp,
    NoRetry,
    plan_follow_up,
    plan_recovery,
    plan_retry,
    steps_done,
)
from agent_session._remote_handles import RemoteHandles
from agent_session._requests import (
    Asker,
    RequestRefused,
    answer_requests,
    refusal,
    resolve_by_holder,
)
from agent_session._retry import retry_policy
from agent_session._rows import decode_body, encode_body
from agent_session._session import AgentSession, SessionDisposed
from agent_session._startup_receipts import plan_startup_receipts, sessions_of
from agent_session._writer import Writer
from agent_session.ports import EngineConfig, OpenGate, PreStreamGate
from message_queue import CancelToken, DispatchMode, InvalidEntry, NewMessage
from persistence import (
    RETRY_SETTINGS,
    AbandonMarker,
    Boundary,
    CorruptRecord,
    CutState,
    CutStateChange,
    HandleStatus,
    HistoryRow,
    LeasedStore,
    LeaseLost,
    OperationRecord,
    OpState,
    RecoverableCut,
    RecoveryScan,
    Reply,
    Request,
    Resolution,
    RowKind,
    SessionLoad,
    SessionRecord,
    SessionTail,
    Store,
    TurnkeeperError,
    UsageError,
    as_resolution,
    clip,
)
from stream_manager import (
    AbortReason,
    Clock,
    Model,
    OverlapPolicy,
    Persisted,
    StreamEvent,
    StreamManager,
    StreamStarted,
    SystemClock,
    Tool,
    ToolResultPart,
    WriteFailed,
    decode_parts,
)

if TYPE_CHECKING:
    from types import TracebackType

EngineObserver = Callable[[EngineEvent], None]
#: How long a close waits for a claim round in flight to end before cancelling it.
CLAIM_CLOSE_GRACE_S = 5.0
#: The failure types a provider's configuration can cause, and a change of it fix (PS-8).
PROVIDER_FIXABLE = frozenset({"authentication", "quota", "model_not_found"})
log = logging.getLogger("turnkeeper.engine")
#: The claim rounds' jitter (not a secret: it only spreads peers apart in time).
_jitter = random.Random()


class Engine:
    """Runs many sessions' turns on one event loop and one store.

    Use it as an async context manager; leaving it shuts the engine down (work still running
    is cancelled), so wait for what you need first::

        async with Engine(store=MemoryStore(), models={"m": model}) as engine:
            session = await engine.open_session("s1", model="m")
            session.send("hello")
            await session.wait_idle()
    """

    def __init__(
        self,
        *,
        store: Store,
        models: Mapping[str, Model],
        tools: Mapping[str, Tool] | None = None,
        fallbacks: Mapping[str, Sequence[str]] | None = None,
        clock: Clock | None = None,
        config: EngineConfig | None = None,
        gate: PreStreamGate | None = None,
        goals: Goals | None = None,
        workspaces: Workspaces | None = None,
        owner: TurnOwner | None = None,
        observers: Iterable[EngineObserver] = (),
    ) -> None:
        self.config = config or EngineConfig()
        self.store = store
        self.clock = clock or SystemClock()
        self._models = dict(models)
        self._fallbacks = {name: tuple(chain) for name, chain in (fallbacks or {}).items()}
        #: What every session shares: the models it may name and the engine's hooks (one
        #: object each for all sessions, not one per session).
        self._known_models = frozenset(self._models)
        self._session_emit: Callable[[EngineEvent], None] = self._emit
        self._session_spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], None] = self._spawn
        self._gate = gate or OpenGate()
        self._observers: list[EngineObserver] = list(observers)
        self.manager = StreamManager(
            models=self._models,
            tools=tools,
            fallbacks=fallbacks,
            clock=self.clock,
            max_stream_steps=self.config.max_stream_steps,
            tool_deadline_s=self.config.tool_deadline_s,
            cancel_grace_s=self.config.cancel_grace_s,
            store=store,
            owner=lambda: self._owner,
            receipt_salt=self.config.receipt_salt,
            overlap_policy=OverlapPolicy(self.config.overlap_policy),
            observers=[self._on_stream_event],
            cleanup_s=self.config.cleanup_s,
        )
        self._sessions: dict[str, AgentSession] = {}
        #: The retry and compaction policies every session shares (made once, not per session).
        self._policies = (retry_policy(self.config), self.config.compaction())
        #: Sessions made from the store whose rebuilt queue is not yet taken up.
        self._rebuilt: dict[str, RebuiltQueue] = {}
        #: Set when a peer gave its leases back: the claim loop runs a round at once (LS-8).
        self._claim_wake = anyio.Event()
        #: Set once the claim loop ended (the close waits for it before cancelling the
        #: engine's tasks); ``None`` when no loop runs or the close asked it to stop.
        self._claim_stopped: anyio.Event | None = None
        #: One taking of posted messages at a time (LS-9): a notification and a poll of the
        #: same session never queue one message twice.
        self._mail_lock = anyio.Lock()
        #: Posted messages this engine queued whose inbox row may still be there (their
        #: write in flight): never queued again; forgotten once the inbox no longer has them.
        self._mail_taken: dict[str, set[str]] = {}
        #: LS-10: what this engine asks of peers (made when a leased store opens), and one
        #: answering of a session's requests at a time.
        self._asker: Asker | None = None
        self._request_lock = anyio.Lock()
        #: Recovered sessions whose resume has no outcome yet: what frees each one's slot.
        self._recovering: dict[str, Callable[[], None]] = {}
        self._group: anyio.abc.TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        #: The store's owner token, read once when the engine opened it: every commit of the
        #: engine carries it, so a store that changed owners since refuses them (StaleOwner).
        self._owner: str | None = None
        #: The one writer (``_writer``): the engine's own writes go through it too.
        self._writer = Writer(self.store, None)
        #: The owner side of delegated turns between this engine's sessions (TD-1 to TD-10).
        self.delegations = Delegations(
            clock=self.clock,
            emit=self._emit,
            spawn=self._spawn,
            write=self._write_handle,
            claimer=self._sessions.get,
            holds=self._sessions.__contains__ if isinstance(store, LeasedStore) else None,
        )
        #: LS-11: delegated turns whose owner and target run in different processes.
        self._remote: RemoteHandles | None = None
        if isinstance(store, LeasedStore):
            self._remote = RemoteHandles(store, self.delegations, self._sessions, self._emit)
        #: The host's goals and workspaces (in-process boards unless given): what a resume
        #: asks again before it launches, with the handle of a delegated turn (ST-8, R41).
        self.goals: Goals = goals if goals is not None else GoalBoard()
        self.workspaces: Workspaces = workspaces if workspaces is not None else WorkspaceBoard()
        #: Who hears the delegated turns' streams: the engine's owner, and the host's for the
        #: handles the engine does not hold (``owner``: a task store of the host's own).
        self.owners = Owners(self.delegations, owner)
        self._admission = Admission(
            self.goals, self.workspaces, self.owners.refusal, self.owners.follow_up_refusal
        )

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        stack = AsyncExitStack()
        await stack.enter_async_context(self.store)
        self._owner = self.store.owner
        self._writer = Writer(self.store, self._owner)
        self._group = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        self.manager.operations.bind(self._spawn)
        try:
            leased = isinstance(self.store, LeasedStore)
            if leased and self.config.recover_at_start:
                await self._claim()  # LS-8: what dead owners left, this engine's share
            await self._recover_operations()
            handles = await self.store.handles()  # delegated turns a previous process left
            self.delegations.load(handles.records, (key for key, _ in handles.corrupt))
            for key, why in handles.corrupt:
                log.error("handle %s is damaged and treated as not active: %s", key, why)
            if self.config.recover_at_start:
                await self.recover()
                await self._settle_orphaned_handles()
            if leased:
                assert isinstance(self.store, LeasedStore)
                # a peer's close: claim now (the current round's event: one is made per round)
                self.store.watch_releases(lambda: self._claim_wake.set())
                self.store.watch_inbox(self._mail_heard)  # LS-9: a message for a session
                self._asker = Asker(
                    self.store,
                    timeout_s=self.config.request_timeout_s,
                    poll_s=self.config.claim_every_s,
                )
                self.store.watch_answers(self._asker.heard)  # LS-10: a peer answered
                self.store.watch_requests(self._requests_heard)  # LS-10: a peer asks
                self.store.watch_handles(self._handles_heard)  # LS-11: a turn elsewhere moved
                self._claim_stopped = anyio.Event()
                self._spawn(self._claim_forever)
        except BaseException:
            self._stack = None
            self._group.cancel_scope.cancel("the engine did not start")
            await stack.aclose()
            raise
        return self

    async def _recover_operations(self, only: Collection[str] | None = None) -> None:
        """OP-7: what a previous process left open is indeterminate (``process_restart``).

        ``only``: those sessions' receipts alone (a claim's). On a leased store, only the
        receipts of sessions this engine holds: a peer's running call is the peer's.

        The stale receipts (``requested``, ``running``: ``Store.open_receipts``, in the store's
        order) and their sessions' histories are read first; the plan
        (``agent_session._startup_receipts``) then closes each session's receipts in one write
        with a system row that tells its model what became of those calls
        (``docs/operations.md``: every call's fate reaches the model). Only the written
        sessions' ``receipt`` events are told, in the store's order. Then the overlap guard
        (OP-9) reads what the store has open: the closed receipts, and those whose close failed
        (still open in the store: held all the same).
        """
        found = await self.store.open_receipts()  # the open-states index, not every receipt
        wanted = self._wanted(only)
        stale = [
            r for r in found.records if r.state is not OpState.INDETERMINATE and wanted(r.session)
        ]
        now = self.clock.now()
        histories = {sid: await self._restart_history(sid) for sid in sessions_of(stale)}
        plan = plan_startup_receipts(stale, histories, now)
        written: set[str] = set()
        for write in plan.writes:
            try:
                await self._writer.write(write.session, write.boundary)
            except (TurnkeeperError, OSError) as error:  # still open in the store: held
                log.warning("receipts of %s not closed at startup: %s", clip(write.session), error)
                continue
            written.add(write.session)
        for event in plan.told(written):  # told in the store's order, once durable
            self._emit(event)
        await self.manager.operations.load_guard()

    async def _claim(self) -> dict[str, int]:
        """LS-8: claim up to ``claim_limit`` sessions dead owners left; each one's epoch."""
        store = self.store
        assert isinstance(store, LeasedStore)
        claimed = await store.claim(self.config.claim_limit)
        if claimed:
            log.info("claimed %d sessions: %s", len(claimed), clip(", ".join(sorted(claimed))))
        return claimed

    async def claim_expired(self) -> tuple[str, ...]:
        """LS-8: one claim round: take what dead owners left, and recover it; the sessions.

        On a leased store only (elsewhere nothing to claim: ``()``). Up to ``claim_limit``
        sessions whose lease ran out (or that nobody owns) and that have work are taken; their
        receipts left running are closed ``indeterminate`` (OP-7) and their turns are planned
        as at startup (resume, retry, follow-up, abandon). The engine runs a round at start
        and every ``claim_every_s`` (jittered) while it runs.
        """
        if not isinstance(self.store, LeasedStore):
            return ()
        claimed = await self._claim()
        if claimed:
            await self._recover_operations(only=claimed)
            if self._remote is not None:
                await self._remote.adopt_claimed(claimed)  # LS-11: their turns, decided here
            await self.recover(only=claimed)
            await self._settle_orphaned_handles(only=claimed)
        return tuple(sorted(claimed))

    async def post(self, session_id: str, text: str) -> str:
        """LS-9: a message to any session, from any engine process; its queue entry id.

        On a store many processes share (``PostgresStore``): the message is committed to the
        session's inbox with a ``pg_notify`` in one transaction, whichever process holds the
        session. The holder's listener hears it and takes it into the session's durable
        queue (as the entry ``inbox-<id>``, exactly once: the queue write that holds it takes
        it off the inbox in the same transaction); a session nobody holds is taken by the
        engine that hears it first. The claim rounds poll the inbox too (the fallback when a
        notification is lost). The message is then a user message like any other.

        Raises:
            UsageError: The store is not shared (use ``AgentSession.send``), the session does
                not exist, or the text is blank (nothing posted).
            StoreError: The database failed (nothing posted).
        """
        store = self.store
        if not isinstance(store, LeasedStore):
            raise UsageError(
                "Engine.post needs a store many processes share (PostgresStore); "
                "on this store, send through the session (AgentSession.send)"
            )
        entry = await store.post(session_id, text)
        self._mail_heard(session_id)  # held here: taken now, not when the notification comes
        return entry

    def _mail_heard(self, session_id: str) -> None:
        """A message was posted to ``session_id`` (heard, or posted here): take it up."""
        if self._group is not None:
            self._spawn(lambda: self._take_mail(session_id))

    async def _take_mail(self, session_id: str) -> None:
        """Take ``session_id``'s posted messages into its queue, if this engine may hold it.

        A session a peer holds is left to the peer (it hears the same notification). One that
        nobody holds is taken (LS-2), what a previous holder left is recovered as a claim's,
        and it is opened here. A failure is logged: the next claim round polls again.
        """
        store = self.store
        assert isinstance(store, LeasedStore)
        async with self._mail_lock:
            try:
                session = self._sessions.get(session_id)
                if session is None:
                    session = await self._take_for_mail(store, session_id)
                    if session is None:
                        return
                waiting = await store.inbox(session_id)
                # What the inbox no longer holds was written: it need not be remembered.
                taken = self._mail_taken.get(session_id, set()) & {e for e, _, _ in waiting}
                for entry_id, text, handle in waiting:
                    if entry_id in taken:
                        continue  # queued here already: its write is in flight
                    try:
                        if handle is None:
                            session.enqueue_message(NewMessage(text=text, id=entry_id))
                        else:  # LS-11: a delegated turn's prompt
                            assert self._remote is not None
                            if not await self._remote.prompt(session, entry_id, text, handle):
                                continue
                    except InvalidEntry:
                        continue  # in the queue already
                    taken.add(entry_id)
                self._mail_taken[session_id] = taken
            except (TurnkeeperError, OSError) as error:
                log.warning("messages posted to %s not taken yet: %s", clip(session_id), error)

    async def _take_for_mail(self, store: LeasedStore, session_id: str) -> AgentSession | None:
        """The session ``session_id``, taken and opened here; ``None`` when a peer holds it."""
        if session_id not in store.leases.held and await store.acquire(session_id) is None:
            return None  # a peer holds it (or it does not exist): the peer takes the message
        loaded = await self.store.load(session_id, envelopes=False)
        if loaded is None:
            return None
        await self._recover_operations(only={session_id})
        await self.recover(only={session_id})
        found = self._sessions.get(session_id)
        return found or await self.open_session(session_id, model=loaded.record.model)

    async def _poll_mail(self) -> None:
        """LS-9's fallback: the held sessions with messages waiting take them up."""
        store = self.store
        assert isinstance(store, LeasedStore)
        for session_id in sorted(await store.mail_for(sorted(store.leases.held))):
            await self._take_mail(session_id)

    async def _claim_forever(self) -> None:
        """LS-8: a claim round every ``claim_every_s``, jittered, on real time.

        Real time, not the engine's clock: leases run out on the database's clock, whatever
        the engine's. A peer's clean close wakes a round at once (its release is heard
        through the store's listener), so a graceful handoff waits for no round. A round that
        fails (the database away) is logged and tried again at the next; what it would have
        taken waits for it, or for a peer.
        """
        every = self.config.claim_every_s
        stopped = self._claim_stopped
        try:
            while True:
                with anyio.move_on_after(every * (0.75 + 0.5 * _jitter.random())):
                    await self._claim_wake.wait()  # a peer gave its leases back (LISTEN)
                if self._claim_stopped is not stopped:
                    return  # the close asked the loop to stop
                self._claim_wake = anyio.Event()
                try:
                    await self.claim_expired()
                    await self._poll_mail()
                    await self._poll_requests()
                    if self._remote is not None:
                        await self._remote.poll()
                except (TurnkeeperError, OSError) as error:
                    log.warning("claiming expired sessions failed: %s", error)
        finally:
            if stopped is not None:
                stopped.set()

    # ------------------------------------------------------------ LS-10: requests

    async def stop(self, session_id: str) -> str:
        """AS-30 from any process: a user Stop of ``session_id``; the queued text given back.

        A session open here is stopped here (``AgentSession.stop``). On a store many
        processes share, one held elsewhere (or by nobody) is asked of its holder: the
        request and a ``pg_notify`` commit in one transaction, the holder (the engine that
        takes it, when nobody holds it) stops it and answers, and its answer is returned.

        Raises:
            UsageError: The session is not open here, and the store is not shared; or it
                does not exist.
            RequestUnanswered: No answer in ``request_timeout_s`` (the request is withdrawn).
            RequestRefused: The holder's stop failed (its error type and message).
        """
        session = self._sessions.get(session_id)
        store = self.store
        if session is not None and (
            not isinstance(store, LeasedStore) or session_id in store.leases.held
        ):
            return session.stop()
        if self._asker is None:
            return self.session(session_id).stop()  # not open: the UsageError it names
        reply = await self._asker.ask(session_id, "stop", {})
        if not reply.ok:
            raise RequestRefused(session_id, "stop", reply.error, reply.message)
        return reply.value

    def _requests_heard(self, session_id: str) -> None:
        """A request was posted for ``session_id``: answer it, if this engine may hold it."""
        if self._group is not None:
            self._spawn(lambda: self._take_requests(session_id))

    async def _take_requests(self, session_id: str) -> None:
        """Carry out and answer ``session_id``'s requests, when this engine holds it or may.

        A session a peer holds is left to the peer (it hears the same notification); one that
        nobody holds is taken here (LS-2). A resolution needs the lease alone; a stop needs
        the session open here, so one not open is opened as for a message (LS-9). A failure
        is logged: the next claim round polls again.
        """
        store = self.store
        assert isinstance(store, LeasedStore)
        async with self._request_lock:
            try:
                if session_id not in store.leases.held and await store.acquire(session_id) is None:
                    return  # a peer holds it (or it does not exist): the peer answers

                async def carry_out(request: Request) -> Reply:
                    return await self._carry_out(store, session_id, request)

                await answer_requests(store, session_id, carry_out)
            except (TurnkeeperError, OSError) as error:
                log.warning("requests for %s not answered yet: %s", clip(session_id), error)

    async def _carry_out(self, store: LeasedStore, session_id: str, request: Request) -> Reply:
        """One request, carried out here: its reply (a failure's type and message)."""
        try:
            if request.kind == "resolve":
                body = request.body  # carried out here only: never asked on of another engine
                record = await self.manager.operations.resolve_indeterminate(
                    body.get("op_id", ""),
                    as_resolution(body.get("as", "")),
                    note=body.get("note", ""),
                )
                return Reply(ok=True, value=record.op_id)
            session = self._sessions.get(session_id)
            if session is None:
                session = await self._take_for_mail(store, session_id)
            if session is None:
                raise UsageError(f"session {session_id!r} cannot be opened here")
            if request.kind == "interrupt":  # LS-11: an owner in another process asks
                assert self._remote is not None
                handle = request.body.get("handle", "")
                return await self._remote.carry_out_interrupt(
                    session_id, handle, self.interrupt_handle
                )
            return Reply(ok=True, value=session.stop())
        except TurnkeeperError as error:
            return refusal(error)

    async def _poll_requests(self) -> None:
        """LS-10's fallback: the held sessions with requests waiting answer them."""
        store = self.store
        assert isinstance(store, LeasedStore)
        for session_id in sorted(await store.asked_for(sorted(store.leases.held))):
            await self._take_requests(session_id)

    async def _restart_history(self, session: str) -> tuple[HistoryRow, ...] | None:
        """``session``'s rows, where the restart note goes after them.

        ``None`` when the session's history cannot be read (unknown, or damaged: reported where
        it is read) and so has no place for the row.
        """
        try:
            loaded = await self.store.load(session, envelopes=False)
        except (TurnkeeperError, OSError) as error:
            log.warning("no restart note for %s: %s", clip(session), error)
            return None
        return None if loaded is None else loaded.rows

    async def resolve_operation(
        self, op_id: str, *, as_: Resolution | str, note: str
    ) -> OperationRecord:
        """A person checked indeterminate ``op_id``: settle it (``docs/operations.md``).

        ``as_`` is ``completed``, ``failed`` or ``not-run`` (nothing happened: ``cancelled``).
        The receipt is written durably (``resolved_by`` operator, at the engine's clock, with
        ``note``), then the overlap guard lets the operation go: an identical call in its
        session runs again (OP-9), and after a restart too.

        On a store many processes share, a receipt whose session a peer holds is resolved by
        that peer (LS-10): this engine's write is refused by the lease (nothing written), so
        it asks the holder, which writes the receipt and answers; the receipt returned is
        then read back from the store.

        Raises:
            NotResolvable: No such receipt, a damaged one, or one that is not indeterminate
                (nothing written).
            UsageError: An unknown resolution or an empty note.
            WriteFailed: The write failed (here or at the holder); the operation stays
                indeterminate.
            RequestUnanswered: The holder did not answer in ``request_timeout_s``.
            RequestRefused: The holder's resolution failed otherwise (its error's type).
        """
        resolution = as_resolution(as_)
        try:
            return await self.manager.operations.resolve_indeterminate(op_id, resolution, note=note)
        except WriteFailed as failed:
            lost = failed.__cause__
            if not isinstance(lost, LeaseLost) or lost.holder is None or self._asker is None:
                raise
        return await resolve_by_holder(self._asker, lost.session, op_id, resolution, note)

    async def provider_changed(
        self, *, fixable: frozenset[str] = PROVIDER_FIXABLE
    ) -> tuple[str, ...]:
        """PS-8: the provider's configuration changed (a new key, more quota, a model added).

        Every stored abandon marker a provider could have caused (``fixable``: the failure
        types ``authentication``, ``quota``, ``model_not_found`` by default) is cleared, one
        write per session, each told ``persisted abandon``: the next startup retries those
        turns. Nothing starts a stream now. A damaged marker is logged and left as it is.

        Returns:
            The sessions whose marker was cleared.
        """
        found = await self.store.abandon_markers()
        for sid, why in found.corrupt:
            log.error("the abandon marker of %s is damaged and left as it is: %s", clip(sid), why)
        cleared: list[str] = []
        for sid, marker in found.markers:
            if marker.reason not in fixable:
                continue
            try:
                await self._writer.write(sid, Boundary(clear_abandon=True))
            except (TurnkeeperError, OSError) as error:
                log.warning("the abandon marker of %s was not cleared: %s", clip(sid), error)
                continue
            open_one = self._sessions.get(sid)
            if open_one is not None:
                open_one.knows_abandon(stored=False, anchor=open_one.anchor)
            self._emit(Persisted(session=sid, what="abandon", id=marker.user_row or sid))
            cleared.append(sid)
        return tuple(cleared)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        assert self._group is not None
        if isinstance(self.store, LeasedStore):
            self.store.watch_releases(None)
            self.store.watch_inbox(None)
            self.store.watch_requests(None)
            self.store.watch_answers(None)
            self.store.watch_handles(None)
        self.manager.operations.close()  # from here on, no late resolution is written
        await self._stop_claiming()
        self._group.cancel_scope.cancel("the engine is shutting down")
        try:
            await stack.__aexit__(exc_type, exc, tb)
        finally:
            self._group = None
            for session in self._sessions.values():  # a queue write that never ran: not durable
                session.unsettled_deliveries("the engine closed before the queue write")

    async def _stop_claiming(self) -> None:
        """Let a claim round in flight end before the close cancels it (at most a grace).

        A round cancelled in the middle of a query makes the driver cancel it on the server,
        which the repeated cancellation interrupts too: the connection is dropped with a
        warning. A round still running after ``CLAIM_CLOSE_GRACE_S`` is cancelled anyway.
        """
        stopped, self._claim_stopped = self._claim_stopped, None
        if stopped is None:
            return
        self._claim_wake.set()
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLAIM_CLOSE_GRACE_S):
            await stopped.wait()

    async def _write_handle(self, session: str, boundary: Boundary) -> object:
        written = await self._writer.write(session, boundary)
        if self._remote is not None:
            await self._remote.written(session, boundary)  # LS-11: an owner held elsewhere
        return written

    def _handles_heard(self, owner: str) -> None:
        """LS-11: a handle of ``owner`` was written in another process: read it."""
        if self._group is not None and self._remote is not None:
            remote = self._remote
            self._spawn(lambda: remote.hear(owner))

    async def _poll_handles(self) -> None:
        """LS-11's fallback: every owner waiting on a turn elsewhere reads its handles."""
        if self._remote is not None:
            await self._remote.poll()

    def _spawn(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if self._group is None:
            raise UsageError("the engine is not running: use it as `async with Engine(...)`")
        self._group.start_soon(work)

    # ------------------------------------------------------------ events

    def add_observer(self, observer: EngineObserver) -> None:
        """Report every engine event to ``observer``, synchronously and in order."""
        self._observers.append(observer)

    def _emit(self, event: EngineEvent) -> None:
        if self._recovering and isinstance(event, ResumeAttempted):  # only while recovering
            free = self._recovering.get(event.session or "")
            if free is not None:
                free()
        for observer in self._observers:
            try:
                observer(event)
            except Exception:  # a host's observer must never wedge a turn mid-flight
                log.exception("observer %r failed on %s", observer, type(event).__name__)

    def _on_stream_event(self, event: StreamEvent) -> None:
        if type(event) is StreamStarted and event.handle is not None:
            self.owners.turn_began(event.handle)  # TD-4: its prompt row is in history
        session = self._sessions.get(event.session) if event.session is not None else None
        if session is None:
            self._emit(event)
        else:  # the observers first, then the session: calls they make wait for both
            session.on_stream_event(event, tell=self._emit)

    # ------------------------------------------------------------ sessions

    async def _scan(self, only: str | Collection[str] | None) -> RecoveryScan:
        """The startup scan: on a leased store, of the sessions this engine holds only."""
        store = self.store
        if not isinstance(store, LeasedStore):
            return await store.scan_recoverable()
        held = set(store.leases.held)
        if only is not None:
            held &= {only} if isinstance(only, str) else set(only)
        if not held:
            return RecoveryScan()
        return await store.scan_recoverable_of(held)

    def _wanted(self, only: str | Collection[str] | None) -> Callable[[str], bool]:
        """Which sessions a recovery plans: ``only`` (one, or a few), and only this engine's.

        On a leased store (LS-8) a session is this engine's when it holds its lease (claimed
        or taken); a peer's sessions are the peer's to recover.
        """
        named = None if only is None else ({only} if isinstance(only, str) else set(only))
        held = self._leases()

        def wanted(sid: str) -> bool:
            return (named is None or sid in named) and (held is None or sid in held)

        return wanted

    def _leases(self) -> Mapping[str, int] | None:
        """The sessions this engine holds on a leased store (``None``: the store has no leases)."""
        store = self.store
        return store.leases.held if isinstance(store, LeasedStore) else None

    async def recover(self, *, only: str | Collection[str] | None = None) -> int:
        """PS-6: resume every turn a previous process left owed; return how many.

        One scan of the store finds each session whose latest cut record is still owed; each
        is planned by :func:`~agent_session._recovery.plan_recovery` and reported as a
        ``recovered`` event (``resume`` or ``abandon``, with why), told once the records the
        plans end are durable. A resumed session is opened and its turn resumes through the
        normal idle sweep, concurrently; each counts as busy from here until its resume has an
        outcome, so ``wait_idle`` right after the engine started covers its recovered turns
        (the race of a start that looked idle before its resumes began). A session whose
        record fails validation is abandoned with the store's message and nothing is written
        (R61). A failed write of the records a plan ends is logged; that session's abandon is
        not told, and the next startup plans it again. Runs at start unless
        ``EngineConfig.recover_at_start`` is off. ``only``: plan that session (or those) alone
        (:meth:`reopen_session`).
        """
        scan = await self._scan(only)
        wanted = self._wanted(only)
        corrupt = [(sid, why) for sid, why in scan.corrupt if wanted(sid)]
        cuts = [found for found in scan.cuts if wanted(found.session.id)]
        for session_id, problem in corrupt:
            log.error("recovery of session %s abandoned: %s", clip(session_id), clip(problem, 2000))
            self._emit(RetryAbandoned(session=session_id, why=problem))  # R61: never as absent
            self._emit(Recovered(session=session_id, action="abandon", why=problem))
        voids: list[_Void] = []
        superseded: set[str] = set()  # a user row answered nothing yet: the retry's, next
        told: list[Recovered | RetryAbandoned] = []  # told once the voids they decided are durable
        resumed = self._plan_cuts(cuts, told, voids, superseded)
        if self.config.auto_retry:
            resumed += await self._plan_retries(scan.tails, wanted, told)
        unwritten = await self._commit_plans(voids)
        for event in told:
            own = isinstance(event, RetryAbandoned) or event.action != "abandon" or event.cut
            if own or event.session not in unwritten:
                self._emit(event)  # an abandon is its write: untold when that failed
        superseded -= unwritten
        if superseded and self.config.auto_retry:  # its user row is the tail now (PS-4)
            again = await self._scan(only)
            retried: list[Recovered | RetryAbandoned] = []
            tails = tuple(t for t in again.tails if t.session.id in superseded)
            resumed += await self._plan_retries(tails, wanted, retried)
            for event in retried:
                self._emit(event)
        await self._recover_queues(scan.queued, wanted)
        if resumed:
            held = [session.hold() for session in resumed]  # ``wait_idle`` covers them now
            self._spawn(lambda: self._start_recovered(resumed, held))
        return len(resumed)

    def _plan_cuts(
        self,
        cuts: list[RecoverableCut],
        told: list[Recovered | RetryAbandoned],
        voids: list[_Void],
        superseded: set[str],
    ) -> list[AgentSession]:
        """PS-6: each owed cut is resumed or abandoned (what to write and tell is collected)."""
        resumed: list[AgentSession] = []
        for found in cuts:
            sid = found.session.id
            if sid in self._sessions:
                continue  # already open here: its own bookkeeping stands
            plan = plan_recovery(found, self._known_models, self.config.max_stream_steps)
            if isinstance(plan, Abandon):
                log.warning("recovery of session %s abandoned: %s", clip(sid), clip(plan.why, 2000))
                if plan.gives_up:
                    told.append(RetryAbandoned(session=sid, why=plan.why))
                told.append(Recovered(session=sid, action="abandon", why=plan.why))
                live = found.row.row_id
                voids.extend(
                    _Void(sid, rid, CutState.VOIDED)
                    if rid != live
                    else _Void(sid, rid, plan.state, found.row.stream, plan.why)
                    for rid in plan.void
                )
                if plan.state is CutState.WITHDRAWN:
                    superseded.add(sid)
                continue
            voids.extend(_Void(sid, rid, CutState.VOIDED) for rid in plan.stale)
            session = self._make_session(
                found.session,
                next_seq=found.last_seq + 1,
                next_stream=1 + max(map(_stream_number, (*found.streams, plan.marker.cut))),
                queue_version=found.queue_version,
            )
            why = f"cut {plan.marker.cut} owed with {plan.marker.step_budget} steps left"
            told.append(Recovered(session=sid, action="resume", why=why, cut=plan.marker.cut))
            session.knows_abandon(stored=True, anchor=None)  # not read here: cleared to be sure
            session.adopt_owed(plan.marker, plan.row_id)
            resumed.append(session)
        return resumed

    async def _plan_retries(
        self,
        tails: tuple[SessionTail, ...],
        wanted: Callable[[str], bool],
        told: list[Recovered | RetryAbandoned],
    ) -> list[AgentSession]:
        """PS-4: each turn a crash interrupted (its history ends unanswered) is retried.

        Planned by :func:`~agent_session._recovery.plan_retry` from the history's tail, the
        last envelope and the steps its receipts show; a retry is owed like a recovered cut
        (no durable record: it is rebuilt from the same facts at every startup until a row
        answers the turn) and resumed by the sweep with cause ``recovery``, its admission
        asked again (R57). A turn that cannot be retried is told ``retry-abandoned``.
        """
        sessions: list[AgentSession] = []
        for tail in tails:
            sid = tail.session.id
            if not wanted(sid) or sid in self._sessions:
                continue
            receipts: tuple[OperationRecord, ...] = ()
            spent = 0
            if tail.envelope is not None:  # what its streams spent, and what they ran
                receipts = (await self.store.receipts(sid)).records
                spent = steps_done(tail.envelope.stream, [r.op_id for r in receipts])
            summary = _summary_tail(tail)
            if summary is not None:  # PS-7: a crash between the summary and its follow-up
                found = await self._plan_follow_up(tail, summary, told)
                if found is not None:
                    sessions.append(found)
                continue
            if not tail.auto_retry:  # AS-32: the session's user turned it off (persisted)
                off = NoRetry("auto-retry is turned off for this session", _anchor_of(tail))
                await self._abandon_retry(sid, off, told)
                continue
            plan = plan_retry(
                tail,
                spent=spent,
                models=self._known_models,
                ceiling=self.config.max_stream_steps,
                chain=self._chain,
            )
            if isinstance(plan, NoRetry):
                if not plan.quiet:
                    await self._abandon_retry(sid, plan, told)
                continue
            session = self._make_session(
                tail.session,
                next_seq=tail.last_seq + 1,
                next_stream=1 + max(map(_stream_number, tail.streams), default=0),
                queue_version=tail.queue_version,
            )
            told.append(Recovered(session=sid, action="retry", why=plan.why, cut=plan.marker.cut))
            loaded = await self._interrupted(tail)
            if loaded is not None:  # PS-2: the next row the session appends takes them first
                session.knows_partials(loaded.partials)
            for record in _lost_results(tail, receipts, loaded):  # OP-9: never unknowingly
                self.manager.operations.remember_lost(record)
            session.knows_abandon(stored=tail.abandon is not None, anchor=plan.anchor)
            session.knows_auto_retry(on=tail.auto_retry)
            session.adopt_retry(plan.marker)
            sessions.append(session)
        return sessions

    async def _plan_follow_up(
        self, tail: SessionTail, summary: HistoryRow, told: list[Recovered | RetryAbandoned]
    ) -> AgentSession | None:
        """PS-7: the follow-up pending on ``summary`` is owed again, or dropped (R48)."""
        sid = tail.session.id
        plan = plan_follow_up(
            tail, summary, models=self._known_models, ceiling=self.config.max_stream_steps
        )
        if isinstance(plan, NoRetry):
            if not plan.quiet:
                log.warning("follow-up of session %s left: %s", clip(sid), clip(plan.why, 2000))
                told.append(RetryAbandoned(session=sid, why=plan.why))
                told.append(Recovered(session=sid, action="abandon", why=plan.why))
            return None
        if isinstance(plan, DropFollowUp):  # settled, cleared, then told (R48)
            log.warning("follow-up of session %s dropped: %s", clip(sid), clip(plan.why, 2000))
            handle = _follow_up_handle(plan.row)
            ours = any(r.handle_id == handle and r.target == sid for r in self.delegations.records)
            if handle is not None and ours:  # R55: only this session's own delegated turn
                # the owner first (R48; its write is retried until durable, R54)
                self.delegations.settle_orphan(handle, f"its follow-up was dropped: {plan.why}")
            cleared = _cleared_summary(plan.row)
            try:
                await self._writer.write(sid, Boundary(delete=(plan.row.row_id,), rows=(cleared,)))
            except (TurnkeeperError, OSError) as error:
                log.error("the follow-up of %s was not dropped: %s", clip(sid), error)
                return None
            self._emit(Persisted(session=sid, what="summary", id=plan.row.row_id))
            told.append(RetryAbandoned(session=sid, why=plan.why))
            told.append(Recovered(session=sid, action="abandon", why=plan.why))
            return None
        session = self._make_session(
            tail.session,
            next_seq=tail.last_seq + 1,
            next_stream=1 + max(map(_stream_number, tail.streams), default=0),
            queue_version=tail.queue_version,
        )
        told.append(Recovered(session=sid, action="follow-up", why=plan.why, cut=plan.marker.cut))
        session.knows_abandon(stored=tail.abandon is not None, anchor=_anchor_of(tail))
        session.knows_auto_retry(on=tail.auto_retry)
        session.adopt_follow_up(plan.marker, plan.row)
        return session

    async def _interrupted(self, tail: SessionTail) -> SessionLoad | None:
        """The session of a tail whose last stream a crash cut off, read once (else ``None``).

        Unreadable: ``None`` (logged): the launch reads the partials again.
        """
        if tail.envelope is None or tail.envelope_ended:
            return None
        sid = tail.session.id
        try:
            return await self.store.load(sid)
        except (TurnkeeperError, OSError) as error:
            log.warning("the interrupted stream of %s was not read: %s", clip(sid), error)
            return None

    async def _abandon_retry(
        self, sid: str, plan: NoRetry, told: list[Recovered | RetryAbandoned]
    ) -> None:
        """PS-8: a turn startup will not retry gets its abandon marker, then is told so.

        The marker names the turn's row, so the next startup leaves it quietly; a failed write
        is logged and tells nothing (the next startup plans it again).
        """
        log.warning("startup retry of session %s abandoned: %s", clip(sid), clip(plan.why, 2000))
        marker = AbandonMarker(reason=plan.why, user_row=plan.anchor)
        try:
            await self._writer.write(sid, Boundary(abandon=marker))
        except (TurnkeeperError, OSError) as error:
            log.error("the abandon marker of %s was not written: %s", clip(sid), error)
            return
        self._emit(Persisted(session=sid, what="abandon", id=plan.anchor or sid))
        told.append(RetryAbandoned(session=sid, why=plan.why))
        told.append(Recovered(session=sid, action="abandon", why=plan.why))

    def _chain(self, model: str) -> tuple[str, ...]:
        """The fallback chain a fresh turn on ``model`` would try."""
        return self._fallbacks.get(model, ())

    async def _recover_queues(self, queued: tuple[str, ...], wanted: Callable[[str], bool]) -> None:
        """Every session a previous process left with queued entries takes its queue up.

        A session the cut plans already made gets its entries too (its queue drains before
        the sweep resumes anything, as it would have live: the queue goes first); the others
        are opened from the store. A session whose history cannot be read is logged and left
        as it is stored.
        """
        for sid in queued:
            if not wanted(sid):
                continue
            try:
                loaded = await self.store.load(sid, envelopes=True)
            except (TurnkeeperError, OSError) as error:
                log.error("the queue of %s was not rebuilt: %s", clip(sid), clip(str(error), 2000))
                continue
            if loaded is None:
                continue
            session = self._sessions.get(sid)
            if session is None:
                session = self._session_from(loaded.record, loaded)
            elif sid not in self._rebuilt and not session.busy:
                session.knows_partials(loaded.partials)
                rebuilt = rebuild(loaded)
                session.adopt_queue(rebuilt.queue, rebuilt.keeper)
                self._rebuilt[sid] = rebuilt
            await self._take_up_queue(session)

    async def _settle_orphaned_handles(self, only: Collection[str] | None = None) -> None:
        """A delegated turn a previous process left active, and nothing owed continues: settled.

        After startup recovery the only continuations are the resumed cuts and the rebuilt
        queues' entries (user-authored ones; agent-initiated entries did not survive the
        process): an active handle whose turn none of them carries would wait for ever, so it
        settles (recovery settles or resumes, never neither): ``completed``
        with the report when the turn's last stream had ended ``stop`` in a durable row and
        the process died before the settlement was written (``final_report``, read from the
        target's history), else ``interrupted``.
        """
        carried = {
            handle
            for session in self._sessions.values()
            if (handle := session.owed_handle()) is not None
        }
        carried.update(h for session in self._sessions.values() for h in session.queued_handles())
        # After a claim a recovered turn may be running already (at startup, none is).
        carried.update(
            h for session in self._sessions.values() if (h := session.running_handle()) is not None
        )
        wanted = self._wanted(only)  # on a shared store, only turns whose target is held here
        for record in self.delegations.records:
            if (
                record.status is HandleStatus.ACTIVE
                and record.handle_id not in carried
                and wanted(record.target)
            ):
                self.delegations.settle_orphan(
                    record.handle_id,
                    "its turn did not survive the restart: nothing owed continues it",
                    report=await self._final_report(record.handle_id, record.target),
                )

    async def _final_report(self, handle: str, target: str) -> str | None:
        """The report of ``handle``'s turn, ended ``stop`` in ``target``'s history, if it did."""
        try:
            loaded = await self.store.load(target)
        except (TurnkeeperError, OSError) as error:
            log.warning("the history of %s is unreadable: %s", clip(target), error)
            return None
        return None if loaded is None else final_report(handle, loaded)

    async def _commit_plans(self, voids: list[_Void]) -> set[str]:
        """Write the record changes the plans decided, one boundary per session.

        Each is told ``persisted cut-void`` once durable; a live continuation the plan ended is
        then told ``continuation-ended`` (withdrawn, voided), as the live engine tells it.
        Returns the sessions whose write failed (logged; the next startup plans them again).
        """
        by_session: dict[str, list[_Void]] = {}
        for void in voids:
            by_session.setdefault(void.session, []).append(void)
        unwritten: set[str] = set()
        for sid, mine in by_session.items():
            changes = tuple(CutStateChange(row_id=v.row_id, state=v.state) for v in mine)
            try:
                await self._writer.write(sid, Boundary(cut_states=changes))
            except (TurnkeeperError, OSError) as error:
                log.error(
                    "recovery of session %s: its records were not written: %s", clip(sid), error
                )
                unwritten.add(sid)
                continue
            for void in mine:
                self._emit(Persisted(session=sid, what="cut-void", id=void.row_id))
                if void.cut is not None:
                    how = (
                        EndedHow.WITHDRAWN if void.state is CutState.WITHDRAWN else EndedHow.VOIDED
                    )
                    ended = ContinuationEnded(session=sid, cut=void.cut, how=how, why=void.why)
                    self._emit(ended)
        return unwritten

    async def _start_recovered(
        self, sessions: list[AgentSession], held: list[Callable[[], None]]
    ) -> None:
        """Sweep the recovered sessions, at most ``recovery_concurrency`` starting at once.

        A slot is held from the sweep until that resume has an outcome (``resume`` event:
        started, failed, refused or withdrawn); a session the sweep does not resume (the host
        acted on it first) gives its slot back at once and is swept at its next idle moment.
        The resumed turn runs on in the task that swept it (one task per session, not two).
        """
        slots = anyio.Semaphore(max(1, self.config.recovery_concurrency))

        async def start(session: AgentSession, release: Callable[[], None]) -> None:
            freed = False

            def free() -> None:
                nonlocal freed
                if not freed:
                    freed = True
                    self._recovering.pop(session.id, None)
                    slots.release()
                    release()

            self._recovering[session.id] = free
            try:
                await session.sweep_here()
            finally:
                free()

        async with anyio.create_task_group() as group:
            for session, release in zip(sessions, held, strict=True):
                await slots.acquire()
                group.start_soon(start, session, release)

    async def open_session(
        self, session_id: str, *, model: str, goal: str | None = None
    ) -> AgentSession:
        """Create (or reopen) a session and return it.

        ``goal``: the goal the session's turns are attributed to (kept with the session when
        it is created; a resume of its turns asks that goal again, R8).

        Raises:
            UsageError: an unknown model, or the id exists with another model.
        """
        if session_id in self._sessions:
            return self._sessions[session_id]
        if model not in self._models:
            raise UsageError(f"unknown model {model!r} for session {session_id!r}")
        record = SessionRecord(id=session_id, model=model, goal=goal)
        await self._writer.write(session_id, Boundary(create=record))
        loaded = await self.store.load(session_id)
        if loaded is None:  # pragma: no cover - the write above created it
            raise UsageError(f"session {session_id!r} was not created")
        if loaded.record.goal is not None:  # the goal it was created with
            record = msgspec.structs.replace(record, goal=loaded.record.goal)
        session = self._session_from(record, loaded)
        await self._take_up_queue(session)
        return session

    def _session_from(self, record: SessionRecord, loaded: SessionLoad) -> AgentSession:
        """A session made from what the store holds: numbering, its queue, its abandon marker."""
        session = self._make_session(
            record,
            next_seq=1 + max((r.seq for r in loaded.rows), default=0),
            next_stream=1 + max((_stream_number(e.stream) for e in loaded.envelopes), default=0),
            rebuilt=rebuild(loaded),
        )
        anchor = next((r.row_id for r in reversed(loaded.rows) if r.kind is RowKind.USER), None)
        session.knows_abandon(stored=loaded.abandon is not None, anchor=anchor)
        session.knows_partials(loaded.partials)
        session.knows_auto_retry(on=loaded.auto_retry)
        for table, why in loaded.corrupt:
            if table == RETRY_SETTINGS:  # read as off: never retries what may be turned off
                log.error("session %s: %s", clip(record.id), why)
        return session

    async def _take_up_queue(self, session: AgentSession) -> None:
        """A session's rebuilt queue goes on: what a restart dropped is told, then it drains.

        The agent-initiated entries a previous process left are dropped (``entry-canceled``
        reason ``restart``) once a snapshot without them is durable; a damaged entry is
        reported and kept in the store; the user-authored ones drain as usual.
        """
        rebuilt = self._rebuilt.pop(session.id, None)
        if rebuilt is None:
            return
        for entry_id, why in rebuilt.damaged:
            log.error(
                "queued entry %s of %s is damaged and kept for a person to see: %s",
                clip(entry_id),
                clip(session.id),
                clip(why, 2000),
            )
        await session.take_up_queue(rebuilt.dropped)

    async def reopen_session(self, session_id: str) -> AgentSession:
        """Dispose the open session ``session_id`` and open it again from the store.

        The way back for a session that broke (phase ``broken``, ``BrokenSession``), and for
        any session a host wants rebuilt from what is durable: the new session's history,
        sequence numbers and owed cut are the store's. An owed cut is planned and resumed as
        at startup (a ``recovered`` event); a broken session's disposal forfeits nothing, so
        the cut its turn owed is still there.

        Raises:
            UsageError: no such session is open.
        """
        old = self.session(session_id)
        await old.dispose()
        del self._sessions[session_id]
        await self.recover(only=session_id)
        reopened = self._sessions.get(session_id)
        if reopened is None:  # nothing owed (or abandoned): a plain open
            reopened = await self.open_session(session_id, model=old.model)
        return reopened

    def _make_session(
        self,
        record: SessionRecord,
        *,
        next_seq: int,
        next_stream: int,
        rebuilt: RebuiltQueue | None = None,
        queue_version: int = 0,
    ) -> AgentSession:
        if rebuilt is not None and (rebuilt.queue or rebuilt.dropped or rebuilt.damaged):
            self._rebuilt[record.id] = rebuilt  # taken up once the session is made
        keeper = rebuilt.keeper if rebuilt is not None else QueueKeeper(record.id, queue_version)
        session = AgentSession(
            session_id=record.id,
            model=record.model,
            store=self.store,
            manager=self.manager,
            config=self.config,
            gate=self._gate,
            emit=self._session_emit,
            spawn=self._session_spawn,
            known_models=self._known_models,
            owner=self._owner,
            writer=self._writer,
            next_seq=next_seq,
            next_stream=next_stream,
            tell_owner=self.owners.on_child,
            goal=record.goal,
            admission=self._admission,
            queue=rebuilt.queue if rebuilt is not None else None,
            keeper=keeper,
            policies=self._policies,
        )
        if self.owners.host is not None or self.delegations.active_into(record.id):
            session.listen_for_owner()
        self._sessions[record.id] = session
        return session

    def delegate(self, owner: str, target: str, handle: str, text: str) -> Delegation:
        """``owner`` delegates a turn to ``target`` under ``handle``: ``text`` is its prompt.

        The handle record is written first (B10, ``persisted handle``), then ``target`` gets
        the prompt as a correlated send: its streams carry the handle (``stream-start``), and
        ``owner`` hears how each ends, defers on a claimed cut (ST-15) or settles (TD-2 to
        TD-10). Await the returned :meth:`Delegation.settled` for the settlement.

        On a store many processes share (LS-11), ``target`` may be a session this engine does
        not hold: the handle and the prompt are then written in one transaction under
        ``owner``'s lease, the target's holder (or whoever takes it) runs and settles the
        turn, and this engine hears the settlement. A target that does not exist fails
        :meth:`Delegation.settled` with a ``UsageError``.

        Raises:
            UsageError: ``owner`` or ``target`` is not an open session (``target`` may be
                elsewhere on a shared store), or is disposed; they are the same session; the
                handle is blank.
            HandleInUse: a delegated turn already has ``handle`` (ids are never reused).
        """
        remote = self._remote
        if remote is not None and target not in self._sessions:
            if self.session(owner).disposed:
                raise SessionDisposed(f"session {owner!r} is disposed")
            record, _ = self.delegations.open(owner, target, handle)
            delegation = Delegation(self.delegations, handle)
            self._spawn(lambda: remote.start(delegation, record, text))
            return delegation
        for session_id in (owner, target):
            if self.session(session_id).disposed:
                raise SessionDisposed(f"session {session_id!r} is disposed")
        record, correlation = self.delegations.open(owner, target, handle)
        child = self.session(target)
        child.listen_for_owner()
        delegation = Delegation(self.delegations, handle)

        async def start() -> None:
            now = self.delegations.record(handle)  # settled already if the target went (R27)
            try:
                await self._writer.write(owner, Boundary(handles=(now,)))
            except (TurnkeeperError, OSError) as error:
                log.warning("the delegated turn %s was not recorded: %s", handle, error)
                self.delegations.delegated(delegation, error)
                return
            self._emit(Persisted(session=owner, what="handle", id=handle))
            if not child.disposed and self.delegations.record(handle).status is record.status:
                child.send(text, correlation=correlation)

        self._spawn(start)
        return delegation

    def interrupt_handle(self, handle: str) -> bool:
        """TD-8: the owner stops the delegated turn ``handle``; ``False`` if it already was.

        The handle settles ``interrupted``; then the entries queued in the target for that
        turn (its prompt, a correlated wake) are removed, nothing else; then the target's
        stream of that turn, if one runs, is stopped (``system``).

        Raises:
            UnknownHandle: no delegated turn has that handle.
            UsageError: the turn already settled ``completed`` or ``error``; or its target
                runs in another process (:meth:`interrupt_delegated` asks its holder).
        """
        record = self.delegations.record(handle)
        if self.delegations.elsewhere(record) and record.status is HandleStatus.ACTIVE:
            raise UsageError(
                f"the delegated turn {handle!r} runs in session {record.target!r} of another "
                "process: await engine.interrupt_delegated(handle), which asks its holder"
            )
        if not self.delegations.interrupt(handle):
            return False
        target = self._sessions.get(record.target)
        if target is None or target.disposed:
            return True
        target.remove_workspace_turn(handle, "its delegated turn was interrupted by its owner")
        if target.running_handle() == handle:
            self.manager.request_stop_nowait(record.target, soft=False, reason=AbortReason.SYSTEM)
        return True

    async def interrupt_delegated(self, handle: str) -> bool:
        """TD-8 wherever the target runs; ``False`` if the turn already was interrupted.

        A target open here is interrupted here (:meth:`interrupt_handle`). On a store many
        processes share, one held elsewhere is asked of its holder (LS-10's requests), which
        settles the turn under the target's lease; the settlement is read back here before
        this returns, so :meth:`Delegation.settled` has it.

        Raises:
            UnknownHandle: no delegated turn has that handle.
            UsageError: the turn already settled ``completed`` or ``error``.
            RequestUnanswered: the holder did not answer in ``request_timeout_s``.
            RequestRefused: the holder refused (the turn settled meanwhile ...).
        """
        record = self.delegations.record(handle)
        if self._remote is None or self._asker is None or not self.delegations.elsewhere(record):
            return self.interrupt_handle(handle)
        if not self.delegations.interruptible(handle):
            return False
        return await self._remote.interrupt(self._asker, record)

    def queue_report(
        self,
        session_id: str,
        text: str,
        *,
        entry: str | None = None,
        dedupe_key: str | None = None,
        mode: DispatchMode | str = DispatchMode.TOOL_END,
        handle: str | None = None,
    ) -> CancelToken:
        """TD-9: queue a report wake-up (kind ``report``) into ``session_id``.

        It carries the correlation of the delegated turn active in that session (``handle``'s
        when given, if it is active there) unless something unrelated is live in the queue
        ahead of it (``AgentSession.unrelated_live``; then it carries none and settles
        nothing). A correlated report's cancellation before acceptance settles that turn
        ``interrupted``; a failure after acceptance and before its stream, or the queue
        refusing it here, settles it ``error``. ``dedupe_key`` is removable
        (``remove_dedupe``). Returns the entry's cancel token.

        Raises:
            UsageError: no open session ``session_id``, or it is disposed; the queue refused
                the report (blank text, a held dedupe key, a duplicate entry id).
        """
        session = self.session(session_id)
        correlation = self.delegations.report_correlation(session_id, handle)
        if correlation is not None and session.unrelated_live(correlation):
            correlation = None  # an unrelated predecessor: the report must not continue it
        token = CancelToken()
        message = self.delegations.report_message(
            text, correlation, entry=entry, mode=mode, token=token
        )
        try:
            session.enqueue_message(message, dedupe_key=dedupe_key)
        except UsageError as error:
            if correlation is not None:
                why = f"its report wake-up could not be queued: {error}"
                self.delegations.report_settles(correlation, HandleStatus.ERROR, why)
            raise
        return token

    def session(self, session_id: str) -> AgentSession:
        """The open session ``session_id``.

        Raises:
            UsageError: no such session is open.
        """
        try:
            return self._sessions[session_id]
        except KeyError:
            raise UsageError(f"no open session {session_id!r}") from None

    @property
    def sessions(self) -> Mapping[str, AgentSession]:
        """Every open session, by id."""
        return dict(self._sessions)

    async def wait_idle(self) -> None:
        """Return once every session is settled (nothing running, scheduled or being written)."""
        while True:
            for session in list(self._sessions.values()):
                await session.wait_idle()
            await anyio.lowlevel.checkpoint()
            if all(s.settled for s in self._sessions.values()):
                return


class _Void(NamedTuple):
    """A cut record recovery ends: the live one names its cut, to tell its ending."""

    session: str
    row_id: str
    state: CutState
    cut: str | None = None
    why: str = ""


def _summary_tail(tail: SessionTail) -> HistoryRow | None:
    """The summary row a tail ends on (only system rows after it), if it owes a follow-up.

    PS-7. A summary written as a turn launched (on send: it names the last row it covers)
    comes after that turn's own row: that turn is the tail's, retried as any (PS-4).
    """
    last = next((r for r in reversed(tail.rows) if r.kind is not RowKind.SYSTEM), None)
    if last is None or last.kind is not RowKind.SUMMARY:
        return None
    try:
        on_send = decode_body(last).through is not None
    except CorruptRecord:
        return last  # reported by the follow-up's plan
    return None if on_send else last


def _follow_up_handle(row: HistoryRow) -> str | None:
    """The handle a summary row's pending follow-up names, if it names one as a string."""
    follow = decode_body(row).follow_up or {}
    handle = follow.get("handle_id")
    return handle if isinstance(handle, str) else None


def _cleared_summary(row: HistoryRow) -> HistoryRow:
    """``row`` with its pending follow-up cleared (R48), or as it is when it is unreadable."""
    body = decode_body(row)
    return msgspec.structs.replace(
        row, body=encode_body(msgspec.structs.replace(body, follow_up=None))
    )


def _anchor_of(tail: SessionTail) -> str | None:
    """The user row the tail's turn answers (its abandon marker names it), if any."""
    return next((r.row_id for r in reversed(tail.rows) if r.kind is RowKind.USER), None)


def _stream_number(stream: str) -> int:
    tail = stream.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _lost_results(
    tail: SessionTail, receipts: Sequence[OperationRecord], loaded: SessionLoad | None
) -> list[OperationRecord]:
    """The completed calls of the retried turn whose results no row or partial holds (OP-9).

    Every stream of the turn (its envelope written at or after the turn's user row) that no
    history row names died, over as many crashes as it took; a completed call's result rides
    its receipt into the stream's partial (B4), so only a result the partial does not hold
    (written before partials were kept) is lost: a retry would call it again without knowing.
    ``receipts``: the session's, as the plan read them.
    """
    anchor = tail.rows[0].seq if tail.rows and tail.rows[0].kind is RowKind.USER else None
    if anchor is None or loaded is None:
        return []
    completed = [r for r in receipts if r.state is OpState.COMPLETED]
    if not completed:
        return []
    ended = {row.stream for row in loaded.rows if row.stream is not None}
    turn = {
        e.stream
        for e in loaded.envelopes
        if e.after_seq is not None and e.after_seq >= anchor and e.stream not in ended
    }
    last = tail.envelope
    if last is not None and last.after_seq is None and last.stream not in ended:
        turn.add(last.stream)  # an envelope written before after_seq was kept
    held = _results_held(loaded)
    return [r for r in completed if r.stream in turn and (r.stream, r.call_id) not in held]


def _results_held(loaded: SessionLoad) -> set[tuple[str, str]]:
    """(stream, call id) of every tool result the session's stored partials hold."""
    held: set[tuple[str, str]] = set()
    for partial in loaded.partials:
        try:
            parts = decode_parts(loaded.record.id, partial)
        except CorruptRecord:
            continue  # damaged: it holds nothing a retry could read
        held.update((partial.stream, p.call_id) for p in parts if isinstance(p, ToolResultPart))
    return held
