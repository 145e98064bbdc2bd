"""stream_manager: the model step loop.

Owns the step loop, the step budget shared by every cut and resume of one logical turn, the
stop conditions, the fallback chain and its progress, soft and hard stops and their abort
reasons (a caller's ``AbortSignal`` fires with one), the caller's typed port ``StreamHost``
(``StreamRequest.host``: the launch probe, the queued-entry reader, the thinking level, the
cut report and the milestones the loop awaits; ``NullHost`` by default), tool calls as
operations (deadlines, cancellation, receipts, a tool's ``Capability``), the ``Model``, ``Tool``
and ``Clock`` ports, the clocks, the ``ScriptedModel`` and ``FunctionModel``. The MCP tool
adapter is ``stream_manager.mcp`` (optional extra; not imported here). Auto-retry and
compaction are the session's (``agent_session``): a retry or a follow-up is a new stream under
the remainder the failed or stopped one reported.

May import ``message_queue`` and ``persistence``. Must never import ``agent_session``. The
decision modules (``_budget``, ``_fallback``, ``_stop``, ``_validate``) are pure: no I/O, no
awaits, no clock.
"""

from stream_manager._abort import AbortSignal
from stream_manager._budget import StepBudget, initial_budget
from stream_manager._cleanup import CLEANUP_S, BoundedCleanup, CleanupBounds, bounded_cleanup
from stream_manager._events import (
    AbortReason,
    ErrorKind,
    FellBack,
    LaunchRefused,
    LoopStopped,
    Observer,
    OpBlocked,
    OpCancelRequested,
    OperationStarted,
    OpOverlapWarned,
    OpProgress,
    Persisted,
    ReceiptWritten,
    StartCause,
    StepCompleted,
    StepUsage,
    StreamAborted,
    StreamEnded,
    StreamEvent,
    StreamFailed,
    StreamStarted,
    ToolCallEnded,
    ToolCallStarted,
)
from stream_manager._fallback import Hop, ModelFallbackProgress, NoHop, plan_hop, start_progress
from stream_manager._loop import StreamManager
from stream_manager._op_answers import answer_open_calls
from stream_manager._op_guard import OverlapPolicy
from stream_manager._op_parts import operation_id
from stream_manager._op_states import CancelWhy, OutcomeCode
from stream_manager._operations import OperationRunner
from stream_manager._partial import decode_parts, encode_part
from stream_manager._parts import (
    ChatMessage,
    Finish,
    FinishReason,
    ModelUsage,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
    add_usage,
    merge_usage,
)
from stream_manager._request import (
    Aborted,
    AbortMetadata,
    Completed,
    Constructed,
    Ended,
    Failed,
    Milestone,
    NullHost,
    QueuedStopReport,
    Refused,
    Started,
    StreamHost,
    StreamInfo,
    StreamOutcome,
    StreamRequest,
    Withdrawn,
)
from stream_manager._stop import RequiredTools, StopDecision, StopWhy, decide_stop, is_success
from stream_manager._stream import StreamState
from stream_manager.clock import SystemClock, VirtualClock
from stream_manager.errors import (
    ErrorType,
    ModelError,
    ScriptExhausted,
    TerminationUnconfirmed,
    ToolTransportLost,
    ToolUnavailable,
    UnknownModel,
    WriteFailed,
)
from stream_manager.ports import (
    Capability,
    Clock,
    Model,
    ModelRequest,
    Tool,
    ToolContext,
    ToolKind,
)
from stream_manager.redaction import REDACTED, RedactingFilter, redact, redact_logs
from stream_manager.scripted import (
    CallBehaviours,
    FunctionModel,
    ScriptedModel,
    ScriptStep,
    ScriptToolCall,
)
from stream_manager.tools import (
    ArgumentsCheck,
    FunctionTool,
    ToolDefinition,
    definition_of,
)

__all__ = [
    "CLEANUP_S",
    "REDACTED",
    "AbortMetadata",
    "AbortReason",
    "AbortSignal",
    "Aborted",
    "ArgumentsCheck",
    "BoundedCleanup",
    "CallBehaviours",
    "CancelWhy",
    "Capability",
    "ChatMessage",
    "CleanupBounds",
    "Clock",
    "Completed",
    "Constructed",
    "Ended",
    "ErrorKind",
    "ErrorType",
    "Failed",
    "FellBack",
    "Finish",
    "FinishReason",
    "FunctionModel",
    "FunctionTool",
    "Hop",
    "LaunchRefused",
    "LoopStopped",
    "Milestone",
    "Model",
    "ModelError",
    "ModelFallbackProgress",
    "ModelRequest",
    "ModelUsage",
    "NoHop",
    "NullHost",
    "Observer",
    "OpBlocked",
    "OpCancelRequested",
    "OpOverlapWarned",
    "OpProgress",
    "OperationRunner",
    "OperationStarted",
    "OutcomeCode",
    "OverlapPolicy",
    "Part",
    "Persisted",
    "QueuedStopReport",
    "ReasoningPart",
    "ReceiptWritten",
    "RedactingFilter",
    "Refused",
    "RequiredTools",
    "Role",
    "ScriptExhausted",
    "ScriptStep",
    "ScriptToolCall",
    "ScriptedModel",
    "StartCause",
    "Started",
    "StepBudget",
    "StepCompleted",
    "StepUsage",
    "StopDecision",
    "StopWhy",
    "StreamAborted",
    "StreamEnded",
    "StreamEvent",
    "StreamFailed",
    "StreamHost",
    "StreamInfo",
    "StreamManager",
    "StreamOutcome",
    "StreamRequest",
    "StreamStarted",
    "StreamState",
    "SystemClock",
    "TerminationUnconfirmed",
    "TextPart",
    "Tool",
    "ToolCallEnded",
    "ToolCallPart",
    "ToolCallStarted",
    "ToolContext",
    "ToolDefinition",
    "ToolKind",
    "ToolResultPart",
    "ToolTransportLost",
    "ToolUnavailable",
    "UnknownModel",
    "Usage",
    "VirtualClock",
    "Withdrawn",
    "WriteFailed",
    "add_usage",
    "answer_open_calls",
    "bounded_cleanup",
    "decide_stop",
    "decode_parts",
    "definition_of",
    "encode_part",
    "initial_budget",
    "is_success",
    "merge_usage",
    "operation_id",
    "plan_hop",
    "redact",
    "redact_logs",
    "start_progress",
]

# Every record of turnkeeper's own loggers is redacted (``stream_manager.redaction.LOGGERS``).
redact_logs()
