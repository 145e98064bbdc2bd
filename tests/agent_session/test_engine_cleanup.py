"""Bounded cleanup at the engine's exit (``docs/architecture.md``).

A host store whose commits hang for ever must not hang ``Engine.__aexit__``: the shielded stop
of a running call is cut short after the grace interval plus the cleanup bound of virtual
time, a warning names it, and nothing of the cut work is told.
"""

from __future__ import annotations

import logging

import anyio
import pytest

from agent_session import Engine, EngineConfig, EngineEvent
from agent_session.harness.virtual_time import VirtualTime
from persistence import UsageError
from stream_manager import (
    CLEANUP_S,
    ReceiptWritten,
    ScriptedModel,
    ToolCallPart,
    ToolContext,
    ToolKind,
    ToolResultPart,
    VirtualClock,
)
from tests.agent_session.support import T_, HookTool, X
from tests.store_kit import HangingStore

BOUND_S = 7.0  # the tests' cleanup bound (the default is CLEANUP_S)
GRACE_S = 3.0  # the tests' cancel grace (the default is 5 s)
CONFIG = EngineConfig(max_stream_steps=8, cleanup_s=BOUND_S, cancel_grace_s=GRACE_S)


def _engine(clock: VirtualClock, store: HangingStore, tool: object) -> Engine:
    model = ScriptedModel("M", [T_("bash"), X()], clock=clock)
    return Engine(
        store=store,
        models={"M": model},
        tools={"bash": tool},  # type: ignore[dict-item]
        clock=clock,
        config=CONFIG,
    )


async def test_cleanup_bound_lets_the_engine_exit_past_a_store_that_hangs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock()
    store = HangingStore()
    tool = HookTool("bash", before=lambda call: store.hang(), gate=anyio.Event())
    engine = _engine(clock, store, tool)
    events: list[EngineEvent] = []
    engine.add_observer(events.append)
    time = VirtualTime(clock)
    async with anyio.create_task_group() as driver, engine:
        session = await engine.open_session("s1", model="M")
        session.send("go")
        await time.quiet()
        assert len(tool.calls) == 1  # the call runs; every commit from now on hangs
        told = len(events)
        driver.start_soon(time.advance)  # it runs once the exit below waits: time moves

    # The engine's exit returned (without the bound it never does: a hang).
    assert clock.now() == GRACE_S + BOUND_S
    assert [e for e in events[told:] if isinstance(e, ReceiptWritten)] == []  # nothing told
    assert [r.getMessage() for r in caplog.records if r.name == "turnkeeper.cleanup"] == [
        f"cleanup bound: stopping operation s1/1/1/0 did not finish within "
        f"{GRACE_S + BOUND_S:g} s; cut short"
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name.endswith("cleanup"))


class _CancelSeen:
    """A client tool that runs until cancelled and records the cancellation's message."""

    name = "bash"
    kind = ToolKind.CLIENT

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class() as cancelled:
            self.seen.append(str(cancelled))
            raise
        raise AssertionError("unreachable")


async def test_the_engine_cancels_its_tasks_with_its_reason() -> None:
    clock = VirtualClock()
    tool = _CancelSeen()
    store = HangingStore()  # never hangs here
    time = VirtualTime(clock)
    async with _engine(clock, store, tool) as engine:
        session = await engine.open_session("s1", model="M")
        session.send("go")
        await time.quiet()

    assert len(tool.seen) == 1
    assert "reason: the engine is shutting down" in tool.seen[0]


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_an_engine_config_without_a_positive_cleanup_bound_is_refused(value: float) -> None:
    with pytest.raises(UsageError, match=r"^EngineConfig\.cleanup_s must be a positive number"):
        EngineConfig(cleanup_s=value)


def test_the_cleanup_bound_defaults_to_the_one_constant() -> None:
    assert EngineConfig().cleanup_s == CLEANUP_S == 10.0
