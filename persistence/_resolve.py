"""A person settles an indeterminate operation (``docs/operations.md``, issue 12).

An ``indeterminate`` receipt says nobody could tell whether the operation stopped; while it
stays so, the overlap guard (OP-9) refuses every identical call in its session. Only a person
who checked outside turnkeeper can settle it: it completed, it failed, or it never ran. The
decision is here, at the bottom layer, so the engine (``Engine.resolve_operation``) and the
command line on a store no process holds (``turnkeeper resolve``) settle a receipt the same way.

Pure but for :func:`resolve_operation`, which reads and writes through the ``Store`` port.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

import msgspec

from persistence._errors import UsageError
from persistence.records import Boundary, OperationRecord, OpState, ReceiptQuery
from persistence.store import Store

#: ``resolved_by`` of a receipt a person settled.
OPERATOR: Final = "operator"


class Resolution(StrEnum):
    """What a person found when they checked an indeterminate operation."""

    #: It did its work: ``completed``, outcome ``operator_completed``.
    COMPLETED = "completed"
    #: It ran and failed: ``failed``, outcome ``operator_failed``.
    FAILED = "failed"
    #: Nothing happened: ``cancelled`` (acknowledged), outcome ``operator_not_run``.
    NOT_RUN = "not-run"


#: Per resolution: the state, the outcome code (OP-12), acknowledged, the explanation.
_SETTLED: Final[dict[Resolution, tuple[OpState, str, bool | None, str]]] = {
    Resolution.COMPLETED: (
        OpState.COMPLETED,
        "operator_completed",
        None,
        "an operator checked and found that it completed",
    ),
    Resolution.FAILED: (
        OpState.FAILED,
        "operator_failed",
        None,
        "an operator checked and found that it failed",
    ),
    Resolution.NOT_RUN: (
        OpState.CANCELLED,
        "operator_not_run",
        True,
        "an operator checked and found that it never ran",
    ),
}

#: The outcome codes a person's resolution writes (``stream_manager.OutcomeCode`` has them too).
OPERATOR_OUTCOMES: Final = frozenset(code for _, code, _, _ in _SETTLED.values())


class NotResolvable(UsageError):
    """The operation cannot be settled: no such receipt, a damaged one, or not indeterminate.

    Nothing was written.

    Attributes:
        op_id: The operation asked for.
        state: Its receipt's state, or ``None`` when there is no readable receipt.
        damaged: Its receipt is stored but fails validation.
    """

    def __init__(
        self, op_id: str, state: OpState | None, *, detail: str = "", damaged: bool = False
    ) -> None:
        if damaged:
            why = f"its receipt is damaged ({detail})"
        elif state is None:
            why = "no receipt has that id"
        else:
            why = f"it is {state.value}; only an indeterminate operation can be resolved"
        super().__init__(f"operation {op_id} cannot be resolved: {why}")
        self.op_id = op_id
        self.state = state
        self.damaged = damaged


def as_resolution(value: Resolution | str) -> Resolution:
    """``value`` as a :class:`Resolution`.

    Raises:
        UsageError: It names none (``completed``, ``failed``, ``not-run``).
    """
    try:
        return Resolution(value)
    except ValueError:
        allowed = ", ".join(r.value for r in Resolution)
        raise UsageError(f"unknown resolution {value!r} ({allowed})") from None


def checked_note(note: str) -> str:
    """``note`` without surrounding blanks.

    Raises:
        UsageError: It is empty: a resolution says what was checked.
    """
    text = note.strip()
    if not text:
        raise UsageError("a resolution needs a note saying what was checked")
    return text


def resolved(
    record: OperationRecord, as_: Resolution | str, *, at: float, note: str
) -> OperationRecord:
    """``record`` settled by a person: its new state, outcome, ``resolved_by``, time and note.

    ``resolved_late`` stays false (that flag means the same tool layer answered late) and
    ``ended_at`` keeps when it became indeterminate.

    Raises:
        NotResolvable: ``record`` is not ``indeterminate``.
        UsageError: An unknown resolution, or an empty note.
    """
    resolution = as_resolution(as_)
    text = checked_note(note)
    if record.state is not OpState.INDETERMINATE:
        raise NotResolvable(record.op_id, record.state)
    state, outcome, acknowledged, explanation = _SETTLED[resolution]
    return msgspec.structs.replace(
        record,
        state=state,
        outcome_code=outcome,
        termination_acknowledged=(
            record.termination_acknowledged if acknowledged is None else acknowledged
        ),
        explanation=explanation,
        resolved_late=False,
        resolved_by=OPERATOR,
        resolved_at=at,
        note=text,
    )


def found_receipt(query: ReceiptQuery, op_id: str) -> OperationRecord:
    """The receipt ``op_id`` from ``store.receipts(op_id=op_id)``'s answer.

    Raises:
        NotResolvable: There is none, or it fails validation.
    """
    for record in query.records:
        if record.op_id == op_id:
            return record
    for corrupt_id, detail in query.corrupt:
        if corrupt_id == op_id:
            raise NotResolvable(op_id, None, detail=detail, damaged=True)
    raise NotResolvable(op_id, None)


async def resolve_operation(
    store: Store,
    op_id: str,
    as_: Resolution | str,
    *,
    note: str,
    at: float,
    owner: str | None = None,
) -> OperationRecord:
    """Settle the indeterminate operation ``op_id`` in ``store``, durably; the new receipt.

    For a store no running engine uses (``turnkeeper resolve``). On a running engine's own
    store it works too: the engine's overlap guard asks the store again before it refuses
    the identical call, so it lets go then, and nothing the engine writes later overwrites
    the settlement; ``Engine.resolve_operation`` lets go at once. ``owner`` defaults to the
    store's own token.

    Raises:
        NotResolvable: No such receipt, a damaged one, or one that is not indeterminate.
        UsageError: An unknown resolution or an empty note (nothing was written).
        StoreError: The write failed (nothing was written).
    """
    record = resolved(
        found_receipt(await store.receipts(op_id=op_id), op_id), as_, at=at, note=note
    )
    await store.commit(
        record.session,
        Boundary(operations=(record,)),
        owner=store.owner if owner is None else owner,
    )
    return record
