"""Per-operation cost of the message queue at 10, 1,000 and 100,000 queued entries.

Each queue holds its entries behind 10 withdrawn wakes at the head (5 in the 10-entry queue),
the worst case the live readers are asked to skip in practice. Every figure is the median,
over several repeats, of the mean cost of one operation in a batch. The target (issue 2):
``add``, ``dequeue_next`` and ``has_queued`` grow less than 2x from 1,000 to 100,000 entries.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from message_queue import (
    CancelToken,
    Correlation,
    DispatchMode,
    EntryKind,
    MessageQueue,
    NewMessage,
)

if TYPE_CHECKING:
    from collections.abc import Callable

SIZES = (10, 1_000, 100_000)
WITHDRAWN_AT_HEAD = 10
BATCH = 1_000
REPEATS = 7
C = Correlation(handle_id="h", owner_session="o", turn_id="t")


def build(size: int) -> tuple[MessageQueue, list[CancelToken]]:
    """A queue of ``size`` entries: 10 withdrawn wakes, then sealed live entries with tokens."""
    queue = MessageQueue()
    tokens = []
    withdrawn = min(WITHDRAWN_AT_HEAD, size // 2)
    for index in range(size):
        token = CancelToken()
        kind = EntryKind.WAKE if index < withdrawn else EntryKind.SYSTEM
        queue.add(NewMessage(text=f"m{index}", id=f"e{index}", kind=kind, cancel_token=token))
        tokens.append(token)
    for token in tokens[:withdrawn]:
        token.cancel("consumed")
    return queue, tokens[withdrawn:]


def per_op_ns(size: int, op: Callable[[MessageQueue, list[CancelToken], int], object]) -> float:
    """Median over repeats of the mean ns per call of ``op`` on a fresh queue of ``size``."""
    samples = []
    count = min(BATCH, size // 2)
    for _ in range(REPEATS):
        queue, tokens = build(size)
        start = time.perf_counter_ns()
        for index in range(count):
            op(queue, tokens, index)
        samples.append((time.perf_counter_ns() - start) / count)
    return statistics.median(samples)


def _add(queue: MessageQueue, tokens: list[CancelToken], index: int) -> object:
    return queue.add(NewMessage(text="new", kind=EntryKind.SYSTEM, sealed=True))


def _withdraw(queue: MessageQueue, tokens: list[CancelToken], index: int) -> object:
    return tokens[index % len(tokens)].cancel("withdrawn")


def _dequeue(queue: MessageQueue, tokens: list[CancelToken], index: int) -> object:
    return queue.dequeue_next() if not queue.is_empty else None


def _has_queued(queue: MessageQueue, tokens: list[CancelToken], index: int) -> object:
    return queue.has_queued(DispatchMode.TOOL_END)


def _next_mode(queue: MessageQueue, tokens: list[CancelToken], index: int) -> object:
    return queue.next_dispatch_mode()


def _next_is_wake(queue: MessageQueue, tokens: list[CancelToken], index: int) -> object:
    return queue.next_is_wake()


def _next_continues(queue: MessageQueue, tokens: list[CancelToken], index: int) -> object:
    return queue.next_continues(C)


OPS: dict[str, Callable[[MessageQueue, list[CancelToken], int], object]] = {
    "add": _add,
    "withdraw": _withdraw,
    "dequeue_next": _dequeue,
    "has_queued": _has_queued,
    "next_dispatch_mode": _next_mode,
    "next_is_wake": _next_is_wake,
    "next_continues": _next_continues,
}
TARGETED = ("add", "dequeue_next", "has_queued")


def main() -> int:
    """Measure, print the table and the target verdicts; 0 when every target is met."""
    console = Console(width=110)
    table = Table(title="message queue: ns per operation (median of 7 batches)")
    table.add_column("operation")
    for size in SIZES:
        table.add_column(f"{size:,} entries", justify="right")
    table.add_column("100k / 1k", justify="right")
    table.add_column("target < 2x", justify="center")
    met = True
    for name, op in OPS.items():
        figures = [per_op_ns(size, op) for size in SIZES]
        ratio = figures[2] / figures[1]
        verdict = "-"
        if name in TARGETED:
            verdict = "met" if ratio < 2 else "MISSED"
            met = met and ratio < 2
        table.add_row(name, *(f"{f:,.0f}" for f in figures), f"{ratio:.2f}x", verdict)
    console.print(table)
    console.print(
        "all_continue scans every live entry by definition (MQ-7) and is linear in the queue."
    )
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
