"""Values that look like credentials are redacted before they are traced (``docs/trace.md``)."""

from __future__ import annotations

from agent_session import QueueCleared, Recovered
from agent_session.harness.trace import TraceRecorder
from stream_manager import ErrorKind, StreamFailed, VirtualClock


def test_credentials_in_event_text_never_reach_the_trace() -> None:
    recorder = TraceRecorder(VirtualClock())
    recorder(Recovered(session="s1", action="abandon", why="bad kind 'token=abc123xyz' on s1:r2"))
    recorder(
        StreamFailed(
            session="s1",
            stream="s1/1",
            kind=ErrorKind.TERMINAL,
            remaining=3,
            type="provider_error",
            message="401 from provider: Authorization: Bearer sk-live-0123456789",
        )
    )
    raw = recorder.jsonl()
    assert b"abc123xyz" not in raw
    assert b"sk-live-0123456789" not in raw
    assert raw.count(b"[redacted]") >= 2
    assert recorder.lines[0]["why"].endswith("on s1:r2")  # the rest of the text stays


def test_credentials_inside_list_fields_never_reach_the_trace() -> None:
    recorder = TraceRecorder(VirtualClock())
    recorder(QueueCleared(session="s1", entries=("u1", "token=abc123xyz"), hard_stop=False))
    raw = recorder.jsonl()
    assert b"abc123xyz" not in raw
    assert recorder.lines[0]["entries"] == ["u1", "token=[redacted]"]  # the key stays
