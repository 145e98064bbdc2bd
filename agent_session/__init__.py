"""agent_session: the session and the engine a host embeds.

Owns the ``Engine`` (the composition root), the ``AgentSession`` state machine (phases, the send
pipeline, queue drain, stops), the owed continuation and its idempotent idle sweep, startup
recovery of owed cuts, the pre-stream gate port, the scenario harness (with its trace) and the
``turnkeeper`` CLI.

Not built yet: auto-retry and startup retry, compaction, a durable queue.

May import every other package; nothing imports it.
"""

from agent_session._admission import (
    AdmissionUnreadable,
    GoalBoard,
    Goals,
    GoalState,
    WorkspaceBoard,
    Workspaces,
    WorkspaceState,
    WorkspaceStatus,
)
from agent_session._continuation import (
    Continuation,
    EndedHow,
    Marker,
    SweepSnapshot,
    plan_sweep,
)
from agent_session._delegation import (
    ChildAborted,
    ChildDisposed,
    ChildEnded,
    ChildEvent,
    ChildFailed,
    ChildForfeited,
    ChildHardStopped,
    ChildUnsent,
    Delegation,
    HandleInUse,
    UnknownHandle,
)
from agent_session._delivery import Delivery, DeliveryState
from agent_session._engine import Engine, EngineObserver
from agent_session._events import (
    Compacted,
    ContinuationEnded,
    ContinuationOwed,
    EngineEvent,
    EntryCanceled,
    EntryDequeued,
    EntryQueued,
    EntryWithdrawn,
    HandleClaimed,
    HandleSettled,
    Persisted,
    PhaseChanged,
    QueueCleared,
    Recovered,
    ResumeAttempted,
    RetryAbandoned,
    RetryScheduled,
    SessionBroken,
    SessionEvent,
)
from agent_session._owners import TurnOwner
from agent_session._phases import BrokenSession, IllegalTransition, Phase
from agent_session._requests import RequestRefused, RequestUnanswered
from agent_session._session import AgentSession, SessionDisposed
from agent_session._statistics import SessionStatistics
from agent_session.ports import EngineConfig, OpenGate, PreStreamFailure, PreStreamGate

__all__ = [
    "AdmissionUnreadable",
    "AgentSession",
    "BrokenSession",
    "ChildAborted",
    "ChildDisposed",
    "ChildEnded",
    "ChildEvent",
    "ChildFailed",
    "ChildForfeited",
    "ChildHardStopped",
    "ChildUnsent",
    "Compacted",
    "Continuation",
    "ContinuationEnded",
    "ContinuationOwed",
    "Delegation",
    "Delivery",
    "DeliveryState",
    "EndedHow",
    "Engine",
    "EngineConfig",
    "EngineEvent",
    "EngineObserver",
    "EntryCanceled",
    "EntryDequeued",
    "EntryQueued",
    "EntryWithdrawn",
    "GoalBoard",
    "GoalState",
    "Goals",
    "HandleClaimed",
    "HandleInUse",
    "HandleSettled",
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
    "RequestRefused",
    "RequestUnanswered",
    "ResumeAttempted",
    "RetryAbandoned",
    "RetryScheduled",
    "SessionBroken",
    "SessionDisposed",
    "SessionEvent",
    "SessionStatistics",
    "SweepSnapshot",
    "TurnOwner",
    "UnknownHandle",
    "WorkspaceBoard",
    "WorkspaceState",
    "WorkspaceStatus",
    "Workspaces",
    "plan_sweep",
]
