"""The durable bookkeeping of cut records (PS-6, R60).

Which row carries each cut's record, the record changes not yet written, and what is decided
and not yet told. The turn machine decides; this book remembers what its decisions still owe
the store and the trace. A continuation that ends while the row carrying its record is still
being written cannot be voided yet: the end waits here and becomes a change the moment the row
is durable, so a record never stays owed for a turn that ended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from agent_session._events import ContinuationEnded
from persistence import CutState

if TYPE_CHECKING:
    from agent_session._continuation import Continuation
    from agent_session._events import ContinuationOwed, ResumeAttempted


class CutChange(msgspec.Struct, frozen=True):
    """A cut record's state change waiting for its write, with the event that tells it."""

    row_id: str
    state: CutState
    #: ``None``: nothing to tell (the cut was never told owed).
    told: ContinuationEnded | None


class CutRecords:
    """Rows carrying cut records, pending record changes and untold decisions."""

    __slots__ = (
        "_ended_unwritten",
        "_rows",
        "consumed_from",
        "pending",
        "untold_owed",
        "untold_resume",
    )

    def __init__(self) -> None:
        self._rows: dict[str, str] = {}  # cut stream id -> the row carrying its record
        #: Changes decided and not yet durable, in decision order: the machine's next
        #: ``Commit`` of records takes them all (one boundary); a failed one puts them back.
        self.pending: list[CutChange] = []  # a list: an idle session's deque would cost 760 B
        #: A normal cut's ``owed``, told once the row carrying its record commits (R60).
        self.untold_owed: ContinuationOwed | None = None
        #: A resume's ``started``, told once the consumed cut's record commits.
        self.untold_resume: ResumeAttempted | None = None
        #: The bookkeeping before a starting stream consumed its marker, until the consumed
        #: record commits: a failed write puts the marker back (the cut is still owed).
        self.consumed_from: Continuation | None = None
        #: Cuts that ended while their row was being written: ended as soon as it is durable.
        self._ended_unwritten: dict[str, tuple[CutState, ContinuationEnded]] = {}

    def carried_by(self, cut: str, row_id: str) -> None:
        """``row_id`` durably carries ``cut``'s record (written now, or found at startup)."""
        self._rows[cut] = row_id

    def change(self, cut: str, state: CutState, told: ContinuationEnded) -> None:
        """``cut``'s continuation ended ``state``: queue the change (or wait for its row)."""
        row_id = self._rows.pop(cut, None)
        if row_id is not None:
            self.pending.append(CutChange(row_id, state, told))
        else:
            self._ended_unwritten[cut] = (state, told)  # its row is being written

    def forget(self, cut: str) -> None:
        """``cut``'s record is left as the store has it (nothing here will change it)."""
        self._rows.pop(cut, None)

    def change_row(self, row_id: str, state: CutState) -> None:
        """Queue a change of ``row_id``'s record that nothing tells (a cut taken back)."""
        self.pending.append(CutChange(row_id, state, None))

    def written(self, cut: str, row_id: str) -> bool:
        """The row carrying ``cut``'s record is durable; ``True`` if its end must follow now."""
        ended = self._ended_unwritten.pop(cut, None)
        if ended is None:
            self._rows[cut] = row_id
            return False
        state, told = ended
        self.pending.append(CutChange(row_id, state, told))
        return True

    def untold(self) -> bool:
        """Whether a decision waits to be told (an ``owed``, or an end whose row never came)."""
        return self.untold_owed is not None or bool(self._ended_unwritten)

    def never_written(self) -> list[ContinuationOwed | ContinuationEnded]:
        """A turn's outcome came and no row took the cut's record: what stayed untold.

        Only the in-memory marker ever existed (its row's write failed or never came), so
        there is nothing durable to wait for.
        """
        told: list[ContinuationOwed | ContinuationEnded] = []
        owed, self.untold_owed = self.untold_owed, None
        if owed is not None:
            told.append(owed)
        told += [event for _, event in self._ended_unwritten.values()]
        self._ended_unwritten.clear()
        return told
