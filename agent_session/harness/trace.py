"""The trace: one JSON object per engine event, in order (``docs/trace.md``).

Every line has ``seq`` (from 1), ``t`` (virtual milliseconds), ``event`` and ``session``, then
the event's own fields under the names ``docs/trace.md`` gives them. Lines are built from the
event Structs with msgspec, so the same run always gives the same bytes. Every string, at the
top level or in a list, passes through :func:`stream_manager.redact` first
(no credentials in a trace).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from agent_session._events import EngineEvent
from stream_manager import Clock, redact

TraceLine = dict[str, Any]


class Crash(msgspec.Struct, frozen=True, kw_only=True, tag_field="event", tag="crash"):
    """The harness's own trace event: a ``crash`` action killed the engine (no fields)."""

    session: str | None = None


#: What the recorder writes: the engine's events, and the harness's ``crash``.
Recorded = EngineEvent | Crash

_encoder = msgspec.json.Encoder()


def event_name(event: EngineEvent) -> str:
    """The trace name of an event (its tag), as ``docs/trace.md`` lists it."""
    return str(type(event).__struct_config__.tag)


class TraceRecorder:
    """An engine observer that turns events into trace lines and hands each to listeners."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.lines: list[TraceLine] = []
        self._listeners: list[Callable[[TraceLine, Recorded], None]] = []

    def listen(self, listener: Callable[[TraceLine, Recorded], None]) -> None:
        """Call ``listener(line, event)`` after each line is recorded."""
        self._listeners.append(listener)

    def __call__(self, event: Recorded) -> None:
        """Record ``event`` as the next trace line."""
        fields = {key: _redacted(value) for key, value in msgspec.to_builtins(event).items()}
        line: TraceLine = {
            "seq": len(self.lines) + 1,
            "t": round(self._clock.now() * 1000),
            "event": fields.pop("event"),
            "session": fields.pop("session"),
            **fields,
        }
        self.lines.append(line)
        for listener in self._listeners:
            listener(line, event)

    def jsonl(self) -> bytes:
        """The trace as JSON Lines."""
        return b"".join(_encoder.encode(line) + b"\n" for line in self.lines)


def _redacted(value: Any) -> Any:
    """``value`` with every string in it, however deeply listed, redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list | tuple):
        return [_redacted(item) for item in value]
    if isinstance(value, dict):
        return {key: _redacted(item) for key, item in value.items()}
    return value


def encode_line(line: TraceLine) -> bytes:
    """One trace line as JSON, without the newline."""
    return _encoder.encode(line)
