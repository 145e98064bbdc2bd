"""History rows written by earlier versions still read back (``agent_session/_rows.py``)."""

from __future__ import annotations

from agent_session._rows import decode_body, encode_body, to_messages
from persistence import HistoryRow, RowKind
from stream_manager import ChatMessage, Role, ToolCallPart

#: An assistant row as versions before the call part lost its harness-only ``behaviour`` wrote
#: it: every call carried ``"behaviour":{}`` (a scripted run's overrides, too).
OLD_BODY = (
    b'{"text":"checking","tool_calls":['
    b'{"type":"tool-call","call_id":"s1/1/1/c0","name":"fetch","args":{"url":"u"},'
    b'"provider_executed":false,"behaviour":{}},'
    b'{"type":"tool-call","call_id":"s1/1/1/c1","name":"fetch","args":{},'
    b'"provider_executed":false,"behaviour":{"hang":true,"duration_ms":50}}'
    b'],"finish":"tool-calls","model":"M"}'
)


def test_an_old_row_whose_calls_carry_behaviour_decodes_without_it() -> None:
    row = HistoryRow(session="s1", seq=1, row_id="s1:r1", kind=RowKind.ASSISTANT, body=OLD_BODY)
    body = decode_body(row)
    calls = (
        ToolCallPart(call_id="s1/1/1/c0", name="fetch", args={"url": "u"}),
        ToolCallPart(call_id="s1/1/1/c1", name="fetch"),
    )
    assert body.tool_calls == calls
    assert to_messages([row]) == (
        ChatMessage(role=Role.ASSISTANT, text="checking", tool_calls=calls),
    )
    assert b"behaviour" not in encode_body(body)  # rewritten, the row no longer carries it
