"""The overlap guard (OP-9): the operations that may still be running, and what they refuse.

The store is the source of truth (``Store.open_receipts``: every receipt still ``requested``,
``running`` or ``indeterminate``, read through an index). The guard keeps a cache of it:

* **Loaded once**, before this process writes a receipt of its own (the engine loads it at
  startup, after closing what the previous process left open; a stream manager without an
  engine at its first call). Every open receipt is a holder then: nothing of this process runs
  yet, so a ``requested`` or ``running`` one is a previous process's (its startup close failed,
  or no startup ran) and nobody knows whether it ran.
* **Written through** by this process: an operation that becomes indeterminate here (or is
  given up with its receipt open) is held, one resolved late or settled by a person is let go.
  One process owns a store at a time (the SQLite lock, a ``MemoryStore``'s single open), so
  nothing else adds a holder while it runs.
* **Confirmed before it refuses or warns**: a call that meets a holder makes the guard read
  that holder's receipt again (by op id), and a holder the store no longer has open (settled
  through the store by other code, or never durable) is let go first. A free call costs no
  read; a refused one costs one read by primary key.

A receipt row that fails validation in an open state is never skipped: it holds what its
indexed columns place it on, its session's target, or the whole session when its target
column is unreadable, until the store stops reporting it (``docs/operations.md``).
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Iterable
from typing import Final

import anyio

from persistence import (
    OPEN_OP_STATES,
    DamagedReceipt,
    OpenReceipts,
    OperationRecord,
    ReceiptQuery,
    Store,
    TurnkeeperError,
    clip,
)
from stream_manager.errors import WriteFailed
from stream_manager.ports import Capability

log = logging.getLogger("turnkeeper.operations")

#: The shape of a target (``_op_states.target_digest``): the capability's text and a digest.
_TARGET: Final = re.compile(r"[a-z]+:.+#[0-9a-f]{16}", re.DOTALL)

#: The key of a damaged receipt's hold whose target is unreadable: the whole session.
ANY_TARGET: Final = None


class OverlapPolicy(enum.StrEnum):
    """What a call meets while an earlier call is indeterminate (OP-9)."""

    #: Refuse a call on the same capability and target (the default).
    BLOCK = "block"
    #: Run it, noting the earlier operation in the log and the trace (``op-overlap-warned``).
    WARN = "warn"
    #: Refuse any call in the session while one of its operations is indeterminate.
    SESSION = "session"


class OverlapGuard:
    """OP-9: the operations that may still be running, and the later calls they refuse.

    An operation holds its session's target while the store says it is open (see the module).
    A target is the capability's text and a digest of the arguments (``client:bash#<digest>``),
    so one target means one capability and one set of arguments.
    """

    def __init__(self, policy: OverlapPolicy, store: Store) -> None:
        #: The engine-wide policy (a tool's declaration may override it, ``tools.overlap_of``).
        self.policy = policy
        self._store = store
        #: (session, target or ``ANY_TARGET``) -> the operations holding it, first held first
        #: (several after a crash: identical calls of one step were all open).
        self._held: dict[tuple[str, str | None], dict[str, None]] = {}
        #: Op id -> its key in ``_held``.
        self._keys: dict[str, tuple[str, str | None]] = {}
        #: Op id -> what is wrong with its receipt, for each held operation whose row is damaged.
        self._damaged: dict[str, str] = {}
        #: Completed operations of a stream a crash cut off, whose results died with it: each
        #: refuses the next identical call of its session once (``hold_lost``), then lets go.
        self._lost: set[str] = set()
        #: Whether the store's open receipts were read (``load``).
        self.loaded = False
        self._loading: anyio.Event | None = None

    async def load(self) -> None:
        """Hold every open receipt of the store; once, before this process writes a receipt.

        Concurrent callers share one read.

        Raises:
            WriteFailed: The store could not be read (nothing is loaded; the next call reads
                again). A call must not run unguarded: the stream fails as on a failed write.
        """
        while not self.loaded:
            loading = self._loading
            if loading is not None:
                await loading.wait()
                continue
            self._loading = loading = anyio.Event()
            try:
                found = await _read(self._store)
                for record in found.records:
                    self.hold(record)
                for damaged in found.damaged:
                    self._hold_damaged(damaged)
                self.loaded = True
            finally:
                self._loading = None
                loading.set()

    def hold(self, record: OperationRecord) -> None:
        """``record`` may still be running (indeterminate, or open): it holds its target."""
        self._add((record.session, record.target), record.op_id)

    def hold_lost(self, record: OperationRecord) -> None:
        """``record`` completed in a stream a crash cut off; no row holds its result.

        The startup retry of that turn would call it again without knowing: the next
        identical call of its session is refused once (``blocked_by_lost_result``, the model
        told why), then the target is free (a call the model makes knowingly runs).
        """
        self._add((record.session, record.target), record.op_id)
        self._lost.add(record.op_id)

    def forget_lost(self, session: str) -> None:
        """A stream of ``session`` ended: its lost results hold nothing any more."""
        for op_id in [o for o in self._lost if self._keys.get(o, ("",))[0] == session]:
            self._drop(self._keys[op_id], op_id)

    def lost(self, op_id: str) -> bool:
        """Whether held ``op_id`` is a completed call whose result was lost (``hold_lost``)."""
        return op_id in self._lost

    def refused_once(self, op_id: str) -> None:
        """A lost result's hold refused its one call: it lets go."""
        key = self._keys.get(op_id)
        if key is not None and op_id in self._lost:
            self._drop(key, op_id)

    def _hold_damaged(self, damaged: DamagedReceipt) -> None:
        if damaged.session is None:  # nothing places it: reported, holds nothing
            log.error(
                "receipt %s is damaged and its session column is unreadable: the overlap "
                "guard cannot place it (%s)",
                damaged.op_id,
                damaged.detail,
            )
            return
        target = damaged.target
        placed = target if target is not None and _TARGET.fullmatch(target) else ANY_TARGET
        self._add((damaged.session, placed), damaged.op_id)
        self._damaged[damaged.op_id] = damaged.detail
        log.error(
            "receipt %s of session %s is damaged (%s): the overlap guard holds %s as if it "
            "were indeterminate",
            damaged.op_id,
            clip(damaged.session),
            damaged.detail,
            "its target" if placed is not ANY_TARGET else "every call of the session",
        )

    def release(self, record: OperationRecord) -> None:
        """``record`` was resolved (late, or by a person): it holds nothing any more."""
        key = self._keys.get(record.op_id)
        if key is not None:
            self._drop(key, record.op_id)

    def _add(self, key: tuple[str, str | None], op_id: str) -> None:
        self._held.setdefault(key, {})[op_id] = None
        self._keys[op_id] = key

    def _drop(self, key: tuple[str, str | None], op_id: str) -> None:
        holders = self._held.get(key)
        if holders is not None:
            holders.pop(op_id, None)
            if not holders:
                del self._held[key]
        self._keys.pop(op_id, None)
        self._damaged.pop(op_id, None)
        self._lost.discard(op_id)

    def meets(self, session: str, target: str, policy: OverlapPolicy) -> tuple[str | None, bool]:
        """The operation a call on ``target`` meets (cached), and whether it is refused.

        ``policy`` is the call's own (its tool's declaration, else the engine-wide one).
        """
        held = self._held
        if not held:  # the hot path: nothing is held anywhere
            return None, False
        if policy is OverlapPolicy.SESSION:
            holder = next((next(iter(ops)) for (s, _), ops in held.items() if s == session), None)
            return holder, holder is not None
        holders = held.get((session, target)) or held.get((session, ANY_TARGET))
        if not holders:
            return None, False
        return next(iter(holders)), policy is OverlapPolicy.BLOCK

    @property
    def holding(self) -> bool:
        """Whether any operation is held (in any session)."""
        return bool(self._held)

    def damaged(self, op_id: str) -> str | None:
        """What is wrong with held ``op_id``'s receipt, or ``None`` when it reads fine."""
        return self._damaged.get(op_id)

    async def confirm(self, op_ids: Iterable[str]) -> list[str]:
        """Ask the store again about held ``op_ids``; let go of each it has not open.

        Returns the operations let go (settled through the store by other code, or never
        durable). A receipt the store reports damaged stays held.

        Raises:
            WriteFailed: The store could not be read (nothing is let go).
        """
        gone: list[str] = []
        for op_id in dict.fromkeys(op_ids):
            key = self._keys.get(op_id)
            if key is None or op_id in self._lost:  # completed, held on purpose: kept
                continue
            found = await _read_one(self._store, op_id)
            if found.corrupt or any(r.state in OPEN_OP_STATES for r in found.records):
                continue
            self._drop(key, op_id)
            gone.append(op_id)
        return gone

    def blocker(self, op_id: str, session: str, capability: Capability, target: str) -> str | None:
        """The held operation that refuses call ``op_id`` (cached), or ``None``: it may run."""
        holder, refused = self.meets(session, target, self.policy)
        if holder is not None and not refused:
            warn_overlap(op_id, holder, capability)
        return holder if refused else None


async def _read(store: Store) -> OpenReceipts:
    try:
        return await store.open_receipts()
    except (TurnkeeperError, OSError) as error:
        raise WriteFailed(
            f"the overlap guard could not read the open receipts, so no call may run: {error}"
        ) from error


async def _read_one(store: Store, op_id: str) -> ReceiptQuery:
    try:
        return await store.receipts(op_id=op_id)
    except (TurnkeeperError, OSError) as error:
        raise WriteFailed(
            f"the overlap guard could not read the receipt of {clip(op_id)}, so no call may "
            f"run: {error}"
        ) from error


def warn_overlap(op_id: str, holder: str, capability: Capability) -> None:
    """Log that ``op_id`` runs beside indeterminate ``holder`` (overlap: warn)."""
    log.warning(
        "%s runs although %s, on the same %s target, is indeterminate (overlap: warn)",
        op_id,
        holder,
        capability.text,
    )
