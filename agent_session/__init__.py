"""agent_session: the session and the engine a host embeds.

Owns the ``Engine`` (the composition root), the ``AgentSession`` state machine (phases, the send
pipeline, queue drain, stops), the owed continuation and its idempotent idle sweep, the owner's
claim and settlement of delegated turns, admission ports, auto-retry, startup recovery, the
scenario harness and the ``turnkeeper`` CLI.

May import every other package; nothing imports it.
"""

from agent_session._continuation import (
    Continuation,
    EndedHow,
    Marker,
    SweepSnapshot,
    plan_sweep,
)
from agent_session._engine import Engine, EngineObserver
from agent_session._events import (
    ContinuationEnded,
    ContinuationOwed,
    EngineEvent,
    EntryCanceled,
    EntryDequeued,
    EntryQueued,
    EntryWithdrawn,
    Persisted,
    PhaseChanged,
    QueueCleared,
    Recovered,
    ResumeAttempted,
    SessionEvent,
)
from agent_session._phases import IllegalTransition, Phase
from agent_session._session import SessionDisposed
from agent_session._session_resume import AgentSession
from agent_session.ports import EngineConfig, OpenGate, PreStreamFailure, PreStreamGate

__all__ = [
    "AgentSession",
    "Continuation",
    "ContinuationEnded",
    "ContinuationOwed",
    "EndedHow",
    "Engine",
    "EngineConfig",
    "EngineEvent",
    "EngineObserver",
    "EntryCanceled",
    "EntryDequeued",
    "EntryQueued",
    "EntryWithdrawn",
    "IllegalTransition",
    "Marker",
    "OpenGate",
    "Persisted",
    "Phase",
    "PhaseChanged",
    "PreStreamFailure",
    "PreStreamGate",
    "QueueCleared",
    "Recovered",
    "ResumeAttempted",
    "SessionDisposed",
    "SessionEvent",
    "SweepSnapshot",
    "plan_sweep",
]
