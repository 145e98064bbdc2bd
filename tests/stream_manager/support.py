"""Fakes for step-loop tests: tools we own, a stream host, an event recorder.

The driver of virtual time is ``agent_session/harness/virtual_time.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import anyio
import anyio.abc

from stream_manager import (
    CLEANUP_S,
    ChatMessage,
    Completed,
    Constructed,
    Milestone,
    QueuedStopReport,
    Role,
    ScriptedModel,
    ScriptStep,
    ScriptToolCall,
    Started,
    StreamEvent,
    StreamHost,
    StreamInfo,
    StreamManager,
    StreamRequest,
    Tool,
    ToolCallPart,
    ToolContext,
    ToolKind,
    ToolResultPart,
    VirtualClock,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from persistence import Store

T = TypeVar("T")


@dataclass
class FakeTool:
    """A client tool that answers ``output``; ``before`` runs first (e.g. to queue something)."""

    name: str
    output: object = field(default_factory=lambda: {"success": True})
    kind: ToolKind = ToolKind.CLIENT
    before: Callable[[ToolCallPart], None] | None = None
    gate: anyio.Event | None = None
    raises: Exception | None = None
    calls: list[ToolCallPart] = field(default_factory=list)

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        self.calls.append(call)
        if self.before is not None:
            self.before(call)
        if self.gate is not None:
            await self.gate.wait()
        if self.raises is not None:
            raise self.raises
        output = call.args.get("output", self.output)
        return ToolResultPart(call_id=call.call_id, name=call.name, output=output)


def _never() -> bool:
    return False


def _nothing() -> str | None:
    return None


@dataclass
class Host:
    """A ``StreamHost`` for step-loop tests: answers from callables, keeps every milestone.

    ``queued`` stands in for the session's live reader ``has_queued("tool-end")``, ``refuse``
    for the launch probe, ``envelope`` for the envelope write (awaited at ``Constructed``),
    ``started`` for the start's write (awaited at ``Started``), ``final`` for the final write
    (awaited at ``Completed``); ``on_queued_stop`` receives the synchronous cut report (SM-8).
    """

    queued: Callable[[], bool] = _never
    refuse: Callable[[], str | None] = _nothing
    thinking: Callable[[], str | None] = _nothing
    envelope: Callable[[StreamInfo], Awaitable[None]] | None = None
    started: Callable[[], Awaitable[None]] | None = None
    final: Callable[[Completed], Awaitable[None]] | None = None
    on_queued_stop: Callable[[QueuedStopReport], None] | None = None
    milestones: list[Milestone] = field(default_factory=list)

    def thinking_for_step(self) -> str | None:
        return self.thinking()

    def tool_end_queued(self) -> bool:
        return self.queued()

    def refusal(self) -> str | None:
        return self.refuse()

    def queued_stop(self, report: QueuedStopReport) -> None:
        if self.on_queued_stop is not None:
            self.on_queued_stop(report)

    async def reached(self, milestone: Milestone) -> None:
        self.milestones.append(milestone)
        if isinstance(milestone, Constructed) and self.envelope is not None:
            await self.envelope(milestone.info)
        elif isinstance(milestone, Started) and self.started is not None:
            await self.started()
        elif isinstance(milestone, Completed) and self.final is not None:
            await self.final(milestone)


@dataclass
class Recorder:
    """An observer that keeps every event."""

    events: list[StreamEvent] = field(default_factory=list)

    def __call__(self, event: StreamEvent) -> None:
        self.events.append(event)

    def names(self) -> list[str]:
        return [str(type(e).__struct_config__.tag) for e in self.events]

    def of(self, kind: type[T]) -> list[T]:
        return [e for e in self.events if isinstance(e, kind)]


def T_(*tools: str) -> ScriptStep:
    """A step that calls client tools (``T_("a", "b")``)."""
    return ScriptStep(tool_calls=tuple(ScriptToolCall(tool=t) for t in tools))


def X(text: str = "done") -> ScriptStep:
    """A text-only step (X("text"))."""
    return ScriptStep(text=text)


def P(tool: str, text: str = "partial text", result: object = None) -> ScriptStep:
    """A step with a provider-executed tool and text (P(x))."""
    return ScriptStep(
        tool_calls=(
            ScriptToolCall(tool=tool, provider_executed=True, result=result or {"ok": True}),
        ),
        text=text,
    )


REFUSE = ScriptStep(refuse=True)
EMPTY = ScriptStep(error="empty")


def user_messages(text: str = "go") -> tuple[ChatMessage, ...]:
    return (ChatMessage(role=Role.USER, text=text),)


@dataclass
class Rig:
    """A StreamManager over scripted models and fake tools, with a recorder attached."""

    manager: StreamManager
    models: dict[str, ScriptedModel]
    tools: dict[str, FakeTool]
    clock: VirtualClock
    recorder: Recorder

    def request(self, model: str = "M", **kw: object) -> StreamRequest:
        return StreamRequest(session="s1", model=model, messages=user_messages(), **kw)  # type: ignore[arg-type]


def rig(
    scripts: Mapping[str, Sequence[ScriptStep]],
    *,
    tools: Sequence[FakeTool] = (),
    fallbacks: Mapping[str, Sequence[str]] | None = None,
    max_stream_steps: int = 8,
    extra_models: Mapping[str, object] | None = None,
    store: Store | None = None,
    cleanup_s: float = CLEANUP_S,
    cancel_grace_s: float = 5.0,
) -> Rig:
    clock = VirtualClock()
    models = {name: ScriptedModel(name, steps, clock=clock) for name, steps in scripts.items()}
    tool_map: dict[str, FakeTool] = {t.name: t for t in tools}
    for name in ("bash", "a", "b"):
        tool_map.setdefault(name, FakeTool(name))
    recorder = Recorder()
    all_models: dict[str, object] = {**models, **(extra_models or {})}
    manager = StreamManager(
        models=all_models,  # type: ignore[arg-type]
        tools=tool_map,
        clock=clock,
        fallbacks=fallbacks,
        max_stream_steps=max_stream_steps,
        observers=[recorder],
        store=store,
        cleanup_s=cleanup_s,
        cancel_grace_s=cancel_grace_s,
    )
    return Rig(manager, models, tool_map, clock, recorder)


def _tool_protocol_check(tool: FakeTool) -> Tool:
    return tool


def _host_protocol_check(host: Host) -> StreamHost:
    return host
