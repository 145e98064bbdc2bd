"""Per-step overhead in memory, turnkeeper beside its peers (issue item 2).

The same turn runs through every system: the model returns one call of a no-op tool for N-1
steps, then text. turnkeeper's side is ``bench.step_overhead``'s harness (StreamManager,
ScriptedModel, no-op client tool, no observer); the peers' sides are in ``bench._peers``
(pydantic-ai's FunctionModel; a LangGraph model node and ToolNode on a fake chat model; the
Agents SDK on a scripted Model). Runs are interleaved in one event loop: each round runs one
turn of every system, in an order rotated every round, so drift (thermal, other load) hits all
of them alike. Every figure is the median of the measured rounds, after warm-up rounds.

Targets: turnkeeper under 60 µs per step, and at least 20x faster than the fastest peer.
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable

import anyio
from rich.console import Console
from rich.table import Table

from bench import _peers
from bench.step_overhead import _one_run

SIZES = (10, 100)
RUNS = 7
WARMUP = 2
TARGET_US = 60.0
TARGET_RATIO = 20.0
TURNKEEPER = "turnkeeper"


async def _turnkeeper_turn(steps: int) -> float:
    return await _one_run(steps, ())


async def _rounds(
    systems: dict[str, Callable[[int], Awaitable[float]]],
) -> dict[tuple[str, int], list[float]]:
    samples: dict[tuple[str, int], list[float]] = {}
    names = list(systems)
    for steps in SIZES:
        for round_ in range(WARMUP + RUNS):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                figure = await systems[name](steps)
                if round_ >= WARMUP:
                    samples.setdefault((name, steps), []).append(figure)
    return samples


def measure() -> tuple[dict[tuple[str, int], list[float]], list[str], dict[str, str]]:
    """Samples per (system, N), the systems measured, and each peer's version or absence."""
    systems: dict[str, Callable[[int], Awaitable[float]]] = {TURNKEEPER: _turnkeeper_turn}
    versions: dict[str, str] = {}
    for peer, turn in _peers.IN_MEMORY.items():
        version = peer.version()
        versions[peer.name] = version or "not installed"
        if version is not None:
            systems[f"{peer.name} {version}"] = turn
    return anyio.run(_rounds, systems), list(systems), versions


def _print_split(console: Console, small: float, large: float) -> None:
    """What dominates a miss: turnkeeper's turn split into a fixed cost and a per-step cost."""
    few, many = SIZES[0], SIZES[-1]
    per_step = (large * many - small * few) / (many - few)
    fixed = small * few - per_step * few
    console.print(
        f"turnkeeper's turn, from N={few} and N={many}: about {fixed:,.0f} µs fixed per turn "
        f"(start and end of the stream) plus {per_step:,.1f} µs per step; the fixed part is "
        f"{fixed / few:,.1f} µs of each step at N={few}."
    )


def main() -> int:
    """Measure, print the table and the target verdicts; 0 when turnkeeper meets both."""
    samples, names, versions = measure()
    console = Console(width=110)
    table = Table(
        title=f"per-step overhead in memory: µs per model step (median of {RUNS} interleaved runs)"
    )
    table.add_column("system")
    for steps in SIZES:
        table.add_column(f"N={steps} µs/step", justify="right")
        table.add_column(f"N={steps} / turnkeeper", justify="right")
    medians = {key: statistics.median(values) for key, values in samples.items()}
    for name in names:
        row = [name]
        for steps in SIZES:
            figure = medians[name, steps]
            row += [f"{figure:,.1f}", f"{figure / medians[TURNKEEPER, steps]:,.1f}x"]
        table.add_row(*row)
    console.print(table)
    met = True
    for steps in SIZES:
        own = medians[TURNKEEPER, steps]
        peers = [medians[name, steps] for name in names if name != TURNKEEPER]
        ok = own < TARGET_US
        verdict = f"N={steps}: turnkeeper {own:.1f} µs/step, target < {TARGET_US:.0f}: "
        verdict += "met" if ok else "MISSED"
        if peers:
            ratio = min(peers) / own
            ok_ratio = ratio >= TARGET_RATIO
            ok = ok and ok_ratio
            verdict += f"; fastest peer / turnkeeper {ratio:.2f}x, target >= {TARGET_RATIO:.0f}x: "
            verdict += "met" if ok_ratio else "MISSED"
        else:
            verdict += "; no peer installed, ratio target not measured"
        met = met and ok
        console.print(verdict)
    if not met:
        _print_split(console, medians[TURNKEEPER, SIZES[0]], medians[TURNKEEPER, SIZES[-1]])
    missing = [name for name, version in versions.items() if version == "not installed"]
    if missing:
        console.print(f"not installed (pip install -e '.[bench]'): {', '.join(missing)}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
