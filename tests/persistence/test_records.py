"""The records' own promises: plain frozen data, defaults for evolution, validation on decode."""

from __future__ import annotations

import msgspec
import pytest

from persistence import CutRecord, CutState, HistoryRow, RowKind, SessionRecord, TurnEnvelope

from .helpers import cut, envelope, row, session


@pytest.mark.parametrize(
    "record", [session(goal="g"), cut(), row(2, kind=RowKind.ASSISTANT, cut=cut()), envelope()]
)
def test_records_round_trip_through_msgspec_json(
    record: SessionRecord | CutRecord | HistoryRow | TurnEnvelope,
) -> None:
    assert msgspec.json.decode(msgspec.json.encode(record), type=type(record)) == record


def test_records_are_frozen() -> None:
    with pytest.raises(AttributeError):
        cut().remaining = 9  # type: ignore[misc]


def test_a_cut_record_written_with_only_the_required_fields_decodes_with_defaults() -> None:
    old = b'{"remaining":2,"model":"a","requested_model":"a"}'
    decoded = msgspec.json.decode(old, type=CutRecord)
    assert decoded == CutRecord(remaining=2, model="a", requested_model="a")
    assert decoded.state is CutState.OWED
    assert decoded.refused_models == decoded.chain == ()


def test_a_negative_remaining_budget_fails_validation() -> None:
    bad = b'{"remaining":-1,"model":"a","requested_model":"a"}'
    with pytest.raises(msgspec.ValidationError, match=r"\$\.remaining"):
        msgspec.json.decode(bad, type=CutRecord)


def test_a_history_row_body_defaults_to_an_empty_json_object() -> None:
    assert HistoryRow(session="s", seq=1, row_id="r", kind=RowKind.USER).body == b"{}"
