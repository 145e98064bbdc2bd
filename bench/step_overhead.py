"""Engine overhead per model step, in memory: the ScriptedModel and a no-op client tool.

A turn of N steps is N-1 tool-call steps and one text step, run by ``StreamManager.start_stream``
on a fresh manager and a fresh ScriptedModel (scripts are consumed). Only the ``start_stream``
call is timed; building the script, the model and the manager is not. Every figure is the median,
over several runs, of the run's time divided by N. The target (issue 3): under 60 µs per step
with no observer attached. The figure with a no-op observer is printed for information.
"""

from __future__ import annotations

import statistics
import time

import anyio
from rich.console import Console
from rich.table import Table

from stream_manager import (
    ChatMessage,
    Ended,
    Observer,
    Role,
    ScriptedModel,
    ScriptStep,
    ScriptToolCall,
    StreamEvent,
    StreamManager,
    StreamRequest,
    ToolCallPart,
    ToolContext,
    ToolKind,
    ToolResultPart,
    VirtualClock,
)

SIZES = (10, 100)
RUNS = 9
WARMUP = 3
TARGET_US = 60.0
_TOOL_STEP = ScriptStep(tool_calls=(ScriptToolCall(tool="noop"),))
_TEXT_STEP = ScriptStep(text="done")
_MESSAGES = (ChatMessage(role=Role.USER, text="go"),)


class NoopTool:
    """A client tool that does nothing and succeeds."""

    name = "noop"
    kind = ToolKind.CLIENT

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        return ToolResultPart(call_id=call.call_id, name=call.name, output={"ok": True})


def noop_observer(event: StreamEvent) -> None:
    """An observer that ignores every event (the cost of being observed at all)."""


async def _one_run(steps: int, observers: tuple[Observer, ...]) -> float:
    """µs per step of one fresh turn of ``steps`` steps."""
    clock = VirtualClock()
    model = ScriptedModel("M", [_TOOL_STEP] * (steps - 1) + [_TEXT_STEP], clock=clock, record=False)
    manager = StreamManager(
        models={"M": model},
        tools={"noop": NoopTool()},
        clock=clock,
        max_stream_steps=steps,
        observers=observers,
    )
    request = StreamRequest(session="s", model="M", messages=_MESSAGES)
    start = time.perf_counter_ns()
    outcome = await manager.start_stream(request)
    elapsed = time.perf_counter_ns() - start
    if not isinstance(outcome, Ended) or outcome.steps != steps:
        raise AssertionError(f"the benchmark turn did not run {steps} steps: {outcome!r}")
    return elapsed / steps / 1_000


async def _measure(steps: int, observers: tuple[Observer, ...]) -> list[float]:
    for _ in range(WARMUP):
        await _one_run(steps, observers)
    return [await _one_run(steps, observers) for _ in range(RUNS)]


def per_step_us(steps: int, observers: tuple[Observer, ...] = ()) -> list[float]:
    """µs per step of each of ``RUNS`` runs (after warm-up runs), inside one event loop."""
    return anyio.run(_measure, steps, observers)


def main() -> int:
    """Measure, print the table and the target verdict; 0 when the target is met."""
    console = Console(width=110)
    table = Table(title=f"step loop: µs per model step, in memory (median of {RUNS} runs)")
    table.add_column("turn")
    table.add_column("no observer", justify="right")
    table.add_column("min / max", justify="right")
    table.add_column(f"target < {TARGET_US:.0f} µs", justify="center")
    table.add_column("no-op observer (info)", justify="right")
    met = True
    for steps in SIZES:
        bare = per_step_us(steps)
        observed = per_step_us(steps, (noop_observer,))
        median = statistics.median(bare)
        ok = median < TARGET_US
        met = met and ok
        table.add_row(
            f"{steps} steps",
            f"{median:.1f}",
            f"{min(bare):.1f} / {max(bare):.1f}",
            "met" if ok else "MISSED",
            f"{statistics.median(observed):.1f}",
        )
    console.print(table)
    console.print(
        f"A turn of N steps is N-1 tool-call steps (one no-op client tool each) and a text step; "
        f"{WARMUP} warm-up runs precede the {RUNS} measured ones."
    )
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
