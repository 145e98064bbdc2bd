"""Compaction of a long conversation and the follow-up that continues the turn (AS-36, AS-37).

Theory of operation
-------------------
Every model step reports its usage. When a step's input reaches ``compact_at`` of its model's
context window, the turn machine asks the stream to stop at that step's end (reason
``system``); the stream's partial row is committed as after any abort (B6). Then one
*compaction request* runs on the session's model: the history so far and the summary prompt,
one call, no stream and nothing of the turn's step budget (a :class:`CompactionPolicy` says
when and with which prompt). Its text becomes a ``summary`` row (B7); a request reads history
from the last summary row on, so everything before it is what the summary says.

The turn is not over: the summary row carries a *pending follow-up* (:class:`FollowUp`): the
steps the stopped stream left (R40: never a fresh ceiling), the model it ran and the fallback
progress (R38), the delegated correlation (R49) and the goal, and ``revalidate`` (every
follow-up is admitted like a resume, R44, R48). The machine owes the follow-up; the idle
sweep launches it like a resume. Its launch appends the follow-up row (``Continue``, carrying
the same retry options, so a crash after it is retried under them, PS-7) and clears the
pending follow-up on the summary row in the same commit (B8). A follow-up dropped before
that (a Stop, a superseding message, a refused admission, no steps left) goes through one
path: the owner is settled first, then the pending follow-up is cleared; one refused at its
launch boundary takes its row back (R51).

Persisted follow-ups are read by :func:`read_follow_up`, which never trusts a value: a
``step_budget`` that is not a non-negative integer drops the follow-up with a reason (R48,
R61), never runs it under a fresh ceiling.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

import msgspec

from agent_session._continuation import Marker
from agent_session._rows import turn_fields
from message_queue import Correlation, SendOptions
from persistence import UsageError
from stream_manager import (
    ChatMessage,
    ErrorType,
    ModelError,
    ModelFallbackProgress,
    Role,
    StartCause,
)

#: The prompt of a compaction request when the host gives none.
DEFAULT_PROMPT = (
    "Summarise the conversation so far for your own later use: the user's goal, what has been "
    "done, what was found, the files and commands involved, and what remains to do. Be concise "
    "and keep every detail needed to continue the work."
)
log = logging.getLogger("turnkeeper.session")

#: What the follow-up row says to the model.
FOLLOW_UP_TEXT = "Continue"


class CompactionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """When a stream is stopped for compaction, and what the compaction request asks."""

    #: Tokens of input a model takes; ``windows`` names a model's own.
    window: int = 200_000
    windows: Mapping[str, int] = msgspec.field(default_factory=dict)
    #: The share of the window whose crossing forces a compaction; 0 never compacts.
    at: float = 0.8
    prompt: str = DEFAULT_PROMPT

    def __post_init__(self) -> None:
        """Refuse a policy no compaction can keep (one line naming the field)."""
        if not 0 <= self.at <= 1:  # NaN too
            raise UsageError("EngineConfig.compact_at must be between 0 and 1")
        sizes: dict[str, object] = {"context_window": self.window, **self.windows}
        for name, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise UsageError(f"the context window of {name} must be a positive integer")
        if not self.prompt.strip():
            raise UsageError("EngineConfig.compaction_prompt must not be blank")

    def threshold(self, model: str) -> int | None:
        """The input tokens at which a step of ``model`` forces compaction (``None``: never)."""
        if self.at <= 0:
            return None
        return max(1, int(self.windows.get(model, self.window) * self.at))


class FollowUp(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """AS-37, R40: what the follow-up of a compacted turn runs under (persisted with it)."""

    step_budget: int
    model: str
    requested_model: str
    refused_models: tuple[str, ...] = ()
    chain: tuple[str, ...] = ()
    handle_id: str | None = None
    owner_session: str | None = None
    turn_id: str | None = None
    goal_kind: str | None = None
    goal_id: str | None = None
    #: Admission is asked again before it launches (always: R44, R48).
    revalidate: bool = True

    @property
    def progress(self) -> ModelFallbackProgress:
        """The fallback progress it carries (R38)."""
        return ModelFallbackProgress(
            requested_model=self.requested_model,
            refused_models=self.refused_models,
            chain=self.chain,
        )

    def marker(self, cut: str) -> Marker:
        """What the sweep launches for this follow-up of ``cut``: its remainder, model, chain.

        A live session adds the stopped stream's options, thinking level and scratchpad.
        """
        return Marker(
            cut=cut,
            model=self.model,
            step_budget=self.step_budget,
            progress=self.progress,
            options=SendOptions(model=self.model),
            correlation=self.correlation,
            goal_kind=self.goal_kind,
            goal_id=self.goal_id,
            cause=StartCause.FOLLOW_UP,
            durable=False,
        )

    @property
    def correlation(self) -> Correlation | None:
        """The delegated turn it continues (R49), when it has all three parts."""
        if self.handle_id and self.owner_session and self.turn_id:
            return Correlation(
                handle_id=self.handle_id, owner_session=self.owner_session, turn_id=self.turn_id
            )
        return None


def follow_up_of(
    remaining: int,
    model: str,
    progress: ModelFallbackProgress,
    correlation: Correlation | None,
    goal: tuple[str | None, str | None],
) -> FollowUp:
    """The follow-up a stream stopped for compaction with ``remaining`` steps owes."""
    return FollowUp(step_budget=remaining, **turn_fields(model, progress, correlation, goal))


class Complete(Protocol):
    """``StreamManager.complete_text``: one model call outside any stream, its text."""

    async def __call__(
        self, model: str, messages: tuple[ChatMessage, ...], *, purpose: str
    ) -> str: ...


async def summarise(
    complete: Complete,
    model: str,
    history: tuple[ChatMessage, ...],
    prompt: str,
    purpose: str,
) -> str:
    """The compaction request: ``history`` then ``prompt``, one call on ``model``, its text.

    AS-34 (a): a request that exceeds the context is tried once more on the newer half of the
    history (provider-side truncation, done here); a second failure is raised.

    Raises:
        ModelError: the call failed (the retry's failure, for a context-limit one).
        UnknownModel: no such model.
    """
    ask = ChatMessage(role=Role.USER, text=prompt)
    try:
        return await complete(model, (*history, ask), purpose=purpose)
    except ModelError as error:
        if error.type is not ErrorType.CONTEXT_EXCEEDED or len(history) < 2:
            raise
        log.info("compaction %s truncated: %s", purpose, error)
    newer = history[len(history) // 2 :]
    return await complete(model, (*newer, ask), purpose=f"{purpose}:truncated")


def encode_follow_up(follow_up: FollowUp) -> dict[str, object]:
    """The plain JSON object a row body stores for ``follow_up``."""
    encoded: dict[str, object] = msgspec.to_builtins(follow_up)
    return encoded


def read_follow_up(value: dict[str, object]) -> FollowUp | str:
    """A persisted follow-up, or why it cannot run (R48, R55, R61: dropped, never guessed).

    The budget must be a non-negative integer (``"5"``, ``-2``, ``1.5``, ``{}`` are refused:
    never read as absent, never a fresh ceiling); 0 means nothing is left to run.
    """
    if "step_budget" not in value:
        return "its follow-up names no step_budget"
    budget = value["step_budget"]
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        return f"its follow-up's step_budget {budget!r} is not a non-negative integer (R48)"
    try:
        follow_up = msgspec.convert(value, FollowUp)
    except msgspec.ValidationError as error:
        return f"its follow-up is malformed: {error}"
    parts = (follow_up.handle_id, follow_up.owner_session, follow_up.turn_id)
    if any(parts) and not all(parts):  # R55: half a correlation addresses no handle
        return "its follow-up's correlation is incomplete (R55)"
    if follow_up.step_budget == 0:
        return "its follow-up has no steps left (R48)"
    return follow_up
