"""The scenario file's schema (``docs/scenarios.md``) as frozen, strict pydantic models.

Structural validation only: every model forbids unknown keys and never coerces a type (a string
is not a number, a number is not a boolean). References between parts of the file, and turning
pydantic's errors into ``FILE: $.path: reason`` lines, are :mod:`agent_session.harness.loader`'s.
Two shapes need care so that error paths stay readable: a trigger ``at`` (``"start"``, an event
trigger whose extra keys are gathered into :attr:`EventTrigger.match`, or ``{time_ms}``) is
picked by a callable discriminator, and ``do`` is a union discriminated on ``op``, one model per
op with exactly the arguments ``docs/scenarios.md`` gives it. ``cancel_op`` names its operation
``op_id``, because ``op`` is the discriminator. Nothing below the harness sees these models.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, TypeAlias, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    PlainValidator,
    Tag,
    model_validator,
)

from persistence import MAX_STEPS

Mode: TypeAlias = Literal["tool-end", "turn-end"]
ToolKind: TypeAlias = Literal["client", "provider", "completion"]
OnCancel: TypeAlias = Literal["ack", "ignore"]
StepError: TypeAlias = Literal["retryable", "terminal", "context_exceeded", "empty"]
PhaseName: TypeAlias = Literal["idle", "preparing", "streaming", "completing", "disposed"]
HandleState: TypeAlias = Literal[
    "queued", "starting", "running", "completed", "interrupted", "error"
]
ReceiptState: TypeAlias = Literal["completed", "failed", "timed_out", "cancelled", "indeterminate"]
NonNegative: TypeAlias = Annotated[int, Field(ge=0)]
Positive: TypeAlias = Annotated[int, Field(gt=0)]


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


def _is_json(value: object) -> bool:
    if isinstance(value, list):
        return all(_is_json(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return value is None or isinstance(value, str | bool | int | float)


def _table(value: object) -> dict[str, JsonValue]:
    if not isinstance(value, dict):
        raise ValueError("should be a table")
    if not _is_json(value):
        raise ValueError("values should be strings, numbers, booleans, arrays or tables")
    return value


def _result(value: object) -> str | dict[str, JsonValue]:
    if not isinstance(value, str | dict):
        raise ValueError("should be a string or a table")
    return value if isinstance(value, str) else _table(value)


def _scalar(value: object) -> str | int | float | bool | None:
    if value is None or isinstance(value, str | bool | int | float):
        return value
    raise ValueError("should be a string, number or boolean")


def _expected_value(value: object) -> ExpectedValue:
    if isinstance(value, list):
        return [_scalar(item) for item in value]
    return _scalar(value)


def _has_event(item: dict[str, ExpectedValue]) -> dict[str, ExpectedValue]:
    if "event" not in item:
        raise ValueError("missing required key 'event'")
    if not isinstance(item["event"], str):
        raise ValueError("'event' should be a string")
    return item


#: An id or name: a string with something in it.
Name: TypeAlias = Annotated[str, AfterValidator(_non_empty)]
#: A tool's result: a string or a table.
ToolResult: TypeAlias = Annotated[str | dict[str, JsonValue], PlainValidator(_result)]
#: A value matched against one field of a trace event (``None`` only from JSON).
Scalar: TypeAlias = Annotated[str | int | float | bool | None, PlainValidator(_scalar)]
ScalarValue: TypeAlias = str | int | float | bool | None
ExpectedValue: TypeAlias = ScalarValue | list[ScalarValue]
#: One expected trace event: ``event`` plus the fields it must carry.
ExpectedEvent: TypeAlias = Annotated[
    dict[str, Annotated[ExpectedValue, PlainValidator(_expected_value)]],
    AfterValidator(_has_event),
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _SessionAction(_Model):
    session: Name


class EngineConfig(_Model):
    """Engine settings a scenario may override (``[engine]``)."""

    max_stream_steps: int = Field(100, ge=1, le=MAX_STEPS)
    resume_attempt_cap: int = Field(3, ge=1)
    tool_deadline_ms: int = Field(60_000, gt=0)
    cancel_grace_ms: int = Field(5_000, ge=0)
    #: AS-32: a stream that failed with a retryable error is retried after a backoff; PS-4:
    #: a turn a crash interrupted is retried when the next engine starts.
    auto_retry: bool = True
    #: The first retry's delay on the engine clock; it doubles per attempt.
    retry_backoff_ms: int = Field(1_000, ge=0, le=3_600_000)
    #: Retries of one turn before it is abandoned.
    retry_max_attempts: int = Field(3, ge=0, le=1_000)
    #: AS-36: tokens of input a model takes (a ``[[models]]`` entry may name its own).
    context_window: int = Field(200_000, ge=1, le=100_000_000)
    #: The share of the window whose crossing stops a stream for compaction (0: never).
    compact_at: float = Field(0.8, ge=0, le=1)


class ModelSpec(_Model):
    """A declared model and the fallback chain tried, in order, after it refuses."""

    id: Name
    fallbacks: list[Name] = []
    #: This model's own context window (AS-36), else ``[engine] context_window``.
    context_window: int | None = Field(None, ge=1, le=100_000_000)


class ToolSpec(_Model):
    """A declared tool and its default scripted behaviour."""

    name: Name
    kind: ToolKind = "client"
    duration_ms: NonNegative = 0
    result: ToolResult = "ok"
    fail: str | None = None
    hang: bool = False
    on_cancel: OnCancel = "ack"
    ack_delay_ms: NonNegative = 0
    lose_completion: bool = False
    deadline_ms: Positive | None = None


class SessionSpec(_Model):
    """A declared session, the model it runs on and its optional goal."""

    id: Name
    model: Name
    goal: str | None = None


#: Overrides whose explicit ``null`` (JSON only) means something: "no error", "no own deadline".
_NULLABLE_OVERRIDES: Final = frozenset({"fail", "deadline_ms"})


class ToolCallSpec(_Model):
    """One tool call in a scripted step, with optional overrides of the tool's behaviour."""

    tool: Name
    args: Annotated[dict[str, JsonValue], PlainValidator(_table)] = {}
    duration_ms: NonNegative | None = None
    result: ToolResult | None = None
    fail: str | None = None
    hang: bool | None = None
    on_cancel: OnCancel | None = None
    ack_delay_ms: NonNegative | None = None
    lose_completion: bool | None = None
    deadline_ms: Positive | None = None

    def behaviour(self) -> dict[str, object]:
        """The behaviour overrides this call gives, and only those.

        Returns:
            Override name to value, for each override field (all but ``tool`` and ``args``)
            the file set; ``None`` only where it means something.
        """
        given = [key for key in type(self).model_fields if key in self.model_fields_set]
        return {
            key: getattr(self, key)
            for key in given
            if key not in ("tool", "args")
            and (getattr(self, key) is not None or key in _NULLABLE_OVERRIDES)
        }


class UsageSpec(_Model):
    """The tokens a scripted step reports (``usage = { input = N, output = M }``)."""

    input: NonNegative = 0
    output: NonNegative = 0


class StepSpec(_Model):
    """One scripted model step."""

    text: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallSpec] = []
    refuse: bool = False
    error: StepError | None = None
    delay_ms: NonNegative = 0
    usage: UsageSpec | None = None


class ScriptSpec(_Model):
    """A model's script: steps consumed in order by every stream on that model."""

    steps: list[StepSpec]


class EventTrigger(_Model):
    """Fire at the ``nth`` trace event named ``event`` whose fields equal every ``match`` value.

    In the file the match fields sit beside ``event`` and ``nth``
    (``{ event = "stream-end", session = "s1", nth = 1 }``); they are gathered into ``match``.
    """

    event: Name
    nth: int = Field(1, ge=1)
    match: dict[str, Scalar] = {}

    @model_validator(mode="before")
    @classmethod
    def _gather_match(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        extra = {k: v for k, v in data.items() if k not in ("event", "nth")}
        # ``match`` given as a table: built in code (or written so in the file); merge it.
        given = extra.pop("match") if isinstance(extra.get("match"), dict) else {}
        kept = {k: v for k, v in data.items() if k in ("event", "nth")}
        return {**kept, "match": {**given, **extra}}


class TimeTrigger(_Model):
    """Fire when virtual time reaches ``time_ms``."""

    time_ms: NonNegative


def _trigger_tag(value: Any) -> str | None:
    if isinstance(value, str):
        return "start"
    if isinstance(value, dict):
        return "time" if "time_ms" in value else "event"
    return None


Trigger: TypeAlias = Annotated[
    Annotated[Literal["start"], Tag("start")]
    | Annotated[EventTrigger, Tag("event")]
    | Annotated[TimeTrigger, Tag("time")],
    Discriminator(
        _trigger_tag,
        custom_error_type="trigger_type",
        custom_error_message="should be 'start', an event trigger table or a time trigger table",
    ),
]


class SendAction(_SessionAction):
    """A user message; queued while the session is busy (``entry`` names it)."""

    op: Literal["send"]
    text: str
    mode: Mode | None = None
    entry: Name | None = None


class EnqueueAction(_SessionAction):
    """An agent-initiated entry with a cancel signal (``handle``: a delegated turn's)."""

    op: Literal["enqueue"]
    entry: Name
    kind: Literal["wake", "report", "system"]
    text: str
    mode: Mode | None = None
    dedupe_key: str | None = None
    handle: Name | None = None
    sealed: bool = False


class WithdrawAction(_SessionAction):
    """Fire an entry's cancel signal."""

    op: Literal["withdraw"]
    entry: Name


class RemoveDedupeAction(_SessionAction):
    """Remove the keyed messages whose dedupe key starts with ``prefix``."""

    op: Literal["remove_dedupe"]
    prefix: str


class ClearQueueAction(_SessionAction):
    """A user clear, or a hard-stop clear."""

    op: Literal["clear_queue"]
    hard_stop: bool = False


class RestoreQueueAction(_SessionAction):
    """User-authored entries go back to the input; synthetic ones are cancelled."""

    op: Literal["restore_queue"]


class StopAction(_SessionAction):
    """User Stop: interrupt with reason user, then restore the queue."""

    op: Literal["stop"]


class HardStopAction(_SessionAction):
    """A task hard stop: clear the queue with hard_stop, then stop the stream."""

    op: Literal["hard_stop"]


class DisposeAction(_SessionAction):
    """Tear the session down."""

    op: Literal["dispose"]


class CancelOpAction(_Model):
    """A person stops a running operation, named by exactly one of ``op_id`` and ``tool``."""

    op: Literal["cancel_op"]
    op_id: Name | None = None
    tool: Name | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> CancelOpAction:
        if (self.op_id is None) == (self.tool is None):
            raise ValueError("give exactly one of 'op_id' and 'tool'")
        return self


class GoalAction(_SessionAction):
    """The goal changes under the session."""

    op: Literal["goal"]
    state: Literal["active", "paused", "replaced", "complete"]


class WorkspaceAction(_SessionAction):
    """The workspace changes under the session."""

    op: Literal["workspace"]
    state: Literal["ok", "renaming", "archived", "removed"]


class DelegateAction(_Model):
    """The owner delegates a turn to the target under a new handle."""

    op: Literal["delegate"]
    owner: Name
    target: Name
    handle: Name
    text: str


class HandleAction(_Model):
    """The owner stops a delegated turn."""

    op: Literal["handle"]
    handle: Name
    state: Literal["interrupted"]


class ThinkingAction(_SessionAction):
    """A mid-turn thinking-level change."""

    op: Literal["thinking"]
    level: Name


class DiscardContextAction(_SessionAction):
    """A context-discarding history mutation."""

    op: Literal["discard_context"]


class FailNextAction(_Model):
    """Fault injection: the next ``count`` such operations fail."""

    op: Literal["fail_next"]
    what: Literal["store_write", "queue_write", "pre_stream", "settlement"]
    count: int = Field(1, ge=1)


class CrashAction(_Model):
    """The process dies here; a new engine recovers from the same store."""

    op: Literal["crash"]


class RestartAction(_Model):
    """A clean shutdown, then a reopen."""

    op: Literal["restart"]


Action: TypeAlias = Annotated[
    SendAction
    | EnqueueAction
    | WithdrawAction
    | RemoveDedupeAction
    | ClearQueueAction
    | RestoreQueueAction
    | StopAction
    | HardStopAction
    | DisposeAction
    | CancelOpAction
    | GoalAction
    | WorkspaceAction
    | DelegateAction
    | HandleAction
    | ThinkingAction
    | DiscardContextAction
    | FailNextAction
    | CrashAction
    | RestartAction,
    Field(discriminator="op"),
]
#: Every action op a scenario may name.
ACTION_OPS: Final = frozenset(
    get_args(model.model_fields["op"].annotation)[0] for model in get_args(get_args(Action)[0])
)


class ActionSpec(_Model):
    """An action and the moment it runs."""

    at: Trigger
    do: Action


class Limits(_Model):
    """When a run gives up (exit 3)."""

    max_events: int = Field(10_000, ge=1)
    max_virtual_ms: int = Field(3_600_000, ge=1)


class Expect(_Model):
    """What must hold at quiescence (``[expect]``)."""

    phases: dict[str, PhaseName] = {}
    owed: dict[str, bool] = {}
    streams: dict[str, NonNegative] = {}
    unanswered: dict[str, NonNegative] = {}
    handles: dict[str, HandleState] = {}
    receipts: dict[ReceiptState, NonNegative] = {}
    events: list[ExpectedEvent] = []


class Scenario(_Model):
    """A whole scenario file."""

    name: Name
    description: str | None = None
    engine: EngineConfig = EngineConfig()
    models: list[ModelSpec] = []
    tools: list[ToolSpec] = []
    sessions: list[SessionSpec] = []
    scripts: dict[str, ScriptSpec] = {}
    actions: list[ActionSpec] = []
    limits: Limits = Limits()
    expect: Expect | None = None
