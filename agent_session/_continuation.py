"""The owed continuation of a cut turn and the idle sweep that resumes it (rules ST-1 to ST-15).

Theory of operation
-------------------
A turn cut at a tool boundary for a queued entry (a normal cut, ST-2) or soft-stopped for one
(ST-3) is *owed* a continuation: a :class:`Marker` recorded synchronously with everything a
resume needs (the model at the cut, the steps it has left, its fallback progress, correlation,
thinking level, scratchpad, retry-safe options; its goal-attribution fields stay empty until
goal attribution is built). The marker ends in one of these ways:

* **consumed** (ST-4): any stream that reaches STREAMING, whoever started it;
* **withdrawn** (ST-5): another path owns the turn's outcome (Stop, send-now, a superseding
  send, a stream error, an edit, a stop before the resume started);
* **forfeited** (ST-6): no later stream event will continue the turn (the attempt cap, a
  refused resume launch, context discard, disposal, a hard-stop clear, removal of the turn's
  queued continuation). A correlated one settles its delegated owner (TD-11);
* **voided** (ST-15): the delegated owner's binding "no" for exactly that cut (the owner's
  claim, ``TurnMachine.claim``), or a record startup recovery ends (``persistence.CutState``).

A marker may also stand for an auto-retry of a failed stream (cause ``retry``, AS-32) or for
a compaction's follow-up (cause ``follow-up``, AS-37): the same sweep launches them and the
same endings end them, told as ``retry-abandoned`` rather than ``continuation-ended``.

The sweep (ST-7) is :func:`plan_sweep`: a pure function of the bookkeeping and a snapshot of
the session. It starts a resume only when the session is idle, the queue raw-empty, no manual
send is in preflight, a marker is owed and no resume is in flight; at the failed-attempt cap it
forfeits instead (R21). Applying its answer and planning again yields :class:`Nothing`: the
sweep is idempotent, which ``tests/stateful`` checks as a property.

Everything here is pure: frozen values in, frozen values out. The session shell does the awaits.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

import msgspec

from agent_session._phases import Phase
from message_queue import Correlation, SendOptions
from stream_manager import ModelFallbackProgress, StartCause

if TYPE_CHECKING:
    from collections.abc import Mapping

#: How many consumed cuts are remembered for the owner's claim (R33; any bound >= 4 would do).
CONSUMED_CUTS_BOUND = 16
#: Failed-before-start resume attempts before the marker is forfeited (R21); the engine's own
#: cap is ``EngineConfig.resume_attempt_cap``.
RESUME_FAILED_ATTEMPT_CAP = 3

#: R9: option keys a resume may replay; per-dispatch ones (external prompt ids, delegated tool
#: names, edit ids, file parts, queue mode) never travel with a resume.
RETRY_SAFE_EXTRA: frozenset[str] = frozenset(
    {
        "reasoning_mode",
        "tool_policy",
        "additional_system_instructions",
        "max_output_tokens",
        "provider_options",
        "experiments",
        "disable_workspace_agents",
        "allow_agent_set_goal",
    }
)


class EndedHow(StrEnum):
    """How an owed continuation ended (the trace's ``continuation-ended.how``)."""

    CONSUMED = "consumed"
    WITHDRAWN = "withdrawn"
    FORFEITED = "forfeited"
    VOIDED = "voided"


class Marker(msgspec.Struct, frozen=True, kw_only=True):
    """ST-1: what a resume of the cut turn needs."""

    #: The cut stream's id.
    cut: str
    #: The model that ran the cut step (R15).
    model: str
    #: What the turn has left (ST-12); always at least 1 (R65).
    step_budget: int
    progress: ModelFallbackProgress
    options: SendOptions = msgspec.field(default_factory=SendOptions)
    correlation: Correlation | None = None
    goal_kind: str | None = None
    goal_id: str | None = None
    agent_initiated: bool = False
    #: ``pending ?? applied ?? original`` at the cut (R20).
    thinking_level: str | None = None
    #: The live scratchpad snapshot at the cut (R26).
    extra_system_context: str | None = None
    #: What its stream's ``stream-start`` says: ``resume``, ``recovery`` for a startup
    #: retry of a turn a crash interrupted (PS-4), ``retry`` for an auto-retry of a failed
    #: stream (AS-32: its endings are told ``retry-abandoned``, its start nothing more).
    cause: StartCause = StartCause.RESUME
    #: A durable cut record follows it (``False``: a startup retry's marker, rebuilt from the
    #: tail of the history and the envelope; its endings are told at once).
    durable: bool = True


def retry_safe(options: SendOptions | None) -> SendOptions:
    """R9: the cut stream's options, minus per-dispatch fields."""
    if options is None:
        return SendOptions()
    extra: Mapping[str, object] = {k: v for k, v in options.extra.items() if k in RETRY_SAFE_EXTRA}
    return SendOptions(
        model=options.model,
        thinking_level=options.thinking_level,
        agent_id=options.agent_id,
        extra=extra,
    )


class Continuation(msgspec.Struct, frozen=True, kw_only=True):
    """The session's continuation bookkeeping."""

    marker: Marker | None = None
    #: Resume attempts of the current marker that ended before a stream started (ST-11).
    failed_attempts: int = 0
    #: Resume attempts of the current marker, for the trace's ``attempt``.
    attempts: int = 0
    #: Cuts whose continuation already started, oldest first: what the owner's claim (R33, not
    #: built yet) would still accept once.
    consumed: tuple[str, ...] = ()
    resume_in_flight: bool = False


def owe(state: Continuation, marker: Marker) -> tuple[Continuation, Marker | None]:
    """ST-2/ST-3: record a new owed continuation; it replaces (and returns) any previous one."""
    if marker.step_budget <= 0:
        raise ValueError(f"R65: a zero-remainder cut owes nothing ({marker.cut})")
    previous = state.marker
    return msgspec.structs.replace(state, marker=marker, failed_attempts=0, attempts=0), previous


def consume(state: Continuation) -> tuple[Continuation, Marker | None]:
    """ST-4: a stream reached STREAMING; any marker is consumed and the counter resets."""
    marker = state.marker
    consumed = state.consumed
    if marker is not None:
        consumed = (*consumed, marker.cut)[-CONSUMED_CUTS_BOUND:]
    after = Continuation(consumed=consumed)
    return after, marker


def drop(state: Continuation) -> tuple[Continuation, Marker | None]:
    """ST-5/ST-6/ST-15: withdraw, forfeit or void the marker (the shell settles and aborts)."""
    marker = state.marker
    return msgspec.structs.replace(state, marker=None, failed_attempts=0, attempts=0), marker


def begin_resume(state: Continuation) -> Continuation:
    """ST-8: the sweep claimed the turn; a resume is now in flight."""
    return msgspec.structs.replace(state, resume_in_flight=True, attempts=state.attempts + 1)


def resume_failed(state: Continuation) -> Continuation:
    """ST-10: failed before its stream started; the marker stays owed (R4) and counts (R21)."""
    failed = state.failed_attempts + (1 if state.marker is not None else 0)
    return msgspec.structs.replace(state, resume_in_flight=False, failed_attempts=failed)


def resume_settled(state: Continuation) -> Continuation:
    """The in-flight resume ended (started, refused, withdrawn): no longer in flight."""
    return msgspec.structs.replace(state, resume_in_flight=False)


class SweepSnapshot(msgspec.Struct, frozen=True):
    """What the sweep reads of the session (ST-7's preconditions)."""

    disposed: bool
    phase: Phase
    queue_empty: bool
    manual_in_preflight: int = 0
    external_follow_ups: int = 0


class Nothing(msgspec.Struct, frozen=True):
    """The sweep does nothing (it runs again at the next idle transition)."""

    why: str


class StartResume(msgspec.Struct, frozen=True):
    """Claim the turn and resume it (ST-8)."""

    marker: Marker
    attempt: int


class ForfeitAtCap(msgspec.Struct, frozen=True):
    """R21: the failed-attempt cap is reached; forfeit instead of another attempt."""

    marker: Marker
    failed_attempts: int


SweepAction = Nothing | StartResume | ForfeitAtCap


def plan_sweep(state: Continuation, snapshot: SweepSnapshot, cap: int) -> SweepAction:
    """ST-7: decide what the idle sweep does, from plain state only."""
    marker = state.marker
    if marker is None:
        return Nothing("nothing owed")
    if snapshot.disposed:
        return Nothing("disposed")
    if snapshot.phase is not Phase.IDLE:
        return Nothing(f"phase is {snapshot.phase}")
    if not snapshot.queue_empty:
        return Nothing("the queue is not empty")
    if snapshot.manual_in_preflight or snapshot.external_follow_ups:
        return Nothing("a manual send is in preflight")
    if state.resume_in_flight:
        return Nothing("a resume is in flight")
    if state.failed_attempts >= cap:
        return ForfeitAtCap(marker, state.failed_attempts)
    return StartResume(marker, state.attempts + 1)


def apply_sweep(state: Continuation, action: SweepAction) -> Continuation:
    """The bookkeeping after the shell carried out ``action``."""
    if isinstance(action, StartResume):
        return begin_resume(state)
    if isinstance(action, ForfeitAtCap):
        return drop(state)[0]
    return state
