"""Recovery, the LangGraph half (issue 6 item 6): reopen a checkpoint DB and resume every thread.

The turnkeeper half opens a store holding N sessions with owed cuts and brings every one back
to a resumed stream start; this module times the same for LangGraph over ``AsyncSqliteSaver``.

* **The graph** is the one of every other bench (``bench._peers.langgraph_builder``: a model node
  on ``GenericFakeChatModel``, a ``ToolNode`` with the no-op tool, ``tools_condition``), compiled
  with ``AsyncSqliteSaver`` as ``bench.durable`` does (``durability="sync"``) and with
  ``interrupt_before=["tools"]``.
* **Seeding** (:func:`seed_langgraph`, not timed) leaves every thread interrupted mid-turn: the
  model has emitted a tool call, the thread's last checkpoint names ``tools`` as its next node
  and nothing of it has run. One template thread runs the real graph (``ainvoke`` with
  ``durability="sync"``); its rows (every checkpoint of the thread and every pending write) are
  then copied under the other thread ids in one SQLite transaction. Nothing in those rows names
  the thread (the checkpoint blobs, the metadata and the task ids do not carry ``thread_id``),
  so each copy is byte for byte what running the graph for that thread id would have stored,
  apart from the message and checkpoint ids, which repeat across threads (they are per thread
  in LangGraph). Running the graph 10,000 times instead would take about 90 s (9 ms a thread here).
* **Recovery** (:func:`langgraph_recover`, timed) is what a new process does: it opens a new
  ``AsyncSqliteSaver`` on the file, compiles the graph once, and for every thread loads its
  state (``aget_state``: the latest checkpoint and its pending writes, deserialised, and the
  next tasks computed) and resumes it (``astream(None, config, stream_mode="tasks")``) until
  the resumed run announces its first task (the ``tools`` node starting): the resumed stream's
  start. The stream is then closed, so the tool never runs and nothing more is written.

  The host is assumed to know its thread ids: LangGraph has no query for "threads whose last
  checkpoint has next nodes", and finding them (listing every checkpoint) is not timed, which
  favours LangGraph. Python's imports are not timed either; opening the saver (connect, setup)
  and compiling the graph are.

  Threads are resumed one after another by default (``CONCURRENCY = 1``); ``concurrency=k``
  runs k anyio tasks pulling thread ids from a shared iterator. The saver has one aiosqlite
  connection behind one lock, and every step of a resume is Python on the GIL, so lanes can
  only overlap LangGraph's own work with the saver's queries: on the reference machine (2
  cores) 2, 4 and 8 lanes were within run-to-run noise of one lane (interleaved medians
  1.19-1.34 ms per thread), so one lane, the plain way to use it, is the figure. ``__main__``
  prints one lane and ``CHECK_CONCURRENCY`` lanes so the choice can be checked.

Run ``python -m bench.recovery_peer`` for the figures at 1,000 and 10,000 threads.
"""

from __future__ import annotations

import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import aclosing, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from bench import _peers

#: The scripted turn's length (``bench._peers.langgraph_builder``); only its first steps run.
STEPS = 10
#: Threads resumed at once by :func:`langgraph_recover` (see the module's docstring).
CONCURRENCY = 1
#: The lanes ``__main__`` also measures, to check that more lanes do not help.
CHECK_CONCURRENCY = 4
SIZES = (1_000, 10_000)
TEMPLATE = "t0"
_CHECKPOINT_COLUMNS = (
    "checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata"
)
_WRITE_COLUMNS = "checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value"


@dataclass(frozen=True, slots=True)
class PeerRecovery:
    """One recovery's figures.

    ``total_s`` is the wall time from opening the saver to the last thread's resumed start.
    ``load_ms_per_thread`` and ``resume_ms_per_thread`` are the mean time of one thread's
    ``aget_state`` and of its resume up to the first task; with ``concurrency`` above 1 they are
    latencies that overlap, so they add up to more than ``total_s``.
    """

    threads: int
    concurrency: int
    total_s: float
    open_ms: float
    load_ms_per_thread: float
    resume_ms_per_thread: float

    @property
    def ms_per_thread(self) -> float:
        """Wall time per thread, opening included: ``total_s`` over the threads."""
        return self.total_s * 1_000 / self.threads


def available() -> bool:
    """Whether LangGraph and its SQLite checkpointer are installed."""
    return bool(_peers.LANGGRAPH.version() and _peers.LANGGRAPH_SQLITE.version())


def thread_id(index: int) -> str:
    """The id of the seeded thread number ``index`` (``t0`` .. ``t{threads-1}``)."""
    return f"t{index}"


def _config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "recursion_limit": 2 * STEPS + 5}


def _app(saver: Any) -> Any:  # Any: a compiled langgraph graph, untyped here
    builder = _peers.langgraph_builder(STEPS)
    return builder.compile(checkpointer=saver, interrupt_before=["tools"])


def _check_owed(state: Any, thread: str, model_steps: int) -> None:
    """The thread stops before ``tools`` with the history of ``model_steps`` model steps."""
    messages = state.values.get("messages", [])
    if tuple(state.next) != ("tools",) or len(messages) != 2 * model_steps:
        raise AssertionError(
            f"LangGraph thread {thread} is not owed its tool step: next={state.next!r},"
            f" {len(messages)} messages"
        )


async def seed_langgraph(path: Path, threads: int, *, model_steps: int = 1) -> None:
    """Leave ``threads`` threads in ``path``, each interrupted before its tool node.

    Every thread has run ``model_steps`` model steps (and the ``model_steps - 1`` tool steps
    between them) and stops after the model's last tool call, before ``tools``. The template
    thread ``t0`` runs the real graph; the others are copies of its rows (module docstring).
    """
    if threads < 1:
        raise ValueError("seed at least one thread")
    if not 1 <= model_steps < STEPS:
        raise ValueError(f"model_steps must be in [1, {STEPS})")
    saver_module = _peers._m("langgraph.checkpoint.sqlite.aio")
    async with saver_module.AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        app = _app(saver)
        config = _config(TEMPLATE)
        await app.ainvoke(_peers.langgraph_input(), config, durability="sync")
        for _ in range(model_steps - 1):
            await app.ainvoke(None, config, durability="sync")
        _check_owed(await app.aget_state(config), TEMPLATE, model_steps)
    _copy_thread(path, TEMPLATE, [thread_id(index) for index in range(1, threads)])


def _copy_thread(path: Path, template: str, copies: list[str]) -> None:
    """Copy every checkpoint and write of ``template`` under each id of ``copies``."""
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TEMP TABLE copies (thread_id TEXT PRIMARY KEY)")
        db.executemany("INSERT INTO copies VALUES (?)", [(copy,) for copy in copies])
        for table, columns in (("checkpoints", _CHECKPOINT_COLUMNS), ("writes", _WRITE_COLUMNS)):
            db.execute(
                f"INSERT INTO {table} (thread_id, {columns})"  # the names are fixed
                f" SELECT copies.thread_id, {columns} FROM copies CROSS JOIN {table}"
                f" WHERE {table}.thread_id = ?",
                (template,),
            )


async def langgraph_recover(
    path: Path, threads: int, *, concurrency: int = CONCURRENCY, model_steps: int = 1
) -> PeerRecovery:
    """Time a new saver on ``path`` loading and resuming threads ``t0`` .. ``t{threads-1}``.

    Each thread: ``aget_state`` (checked: next is ``tools``), then ``astream(None, ...)`` in
    ``stream_mode="tasks"`` until its first chunk, the ``tools`` task starting; the stream is
    then closed. ``concurrency`` threads are in flight at once (1: strictly one after another).
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    saver_module = _peers._m("langgraph.checkpoint.sqlite.aio")
    load_s = resume_s = 0.0

    async def recover(app: Any, thread: str) -> None:
        nonlocal load_s, resume_s
        config = _config(thread)
        start = time.perf_counter()
        state = await app.aget_state(config)
        loaded = time.perf_counter()
        _check_owed(state, thread, model_steps)
        stream = app.astream(None, config, stream_mode="tasks", durability="sync")
        async with aclosing(stream):
            first = await anext(aiter(stream), None)
            resumed = time.perf_counter()
        if not isinstance(first, dict) or first.get("name") != "tools" or "input" not in first:
            raise AssertionError(f"LangGraph thread {thread} resumed with {first!r}")
        load_s += loaded - start
        resume_s += resumed - loaded

    async def lane(app: Any, indices: Iterator[int]) -> None:
        for index in indices:  # shared by every lane: each takes the next thread
            await recover(app, thread_id(index))

    start = time.perf_counter()
    async with saver_module.AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        await saver.setup()
        app = _app(saver)
        opened = time.perf_counter()
        indices = iter(range(threads))
        async with anyio.create_task_group() as group:
            for _ in range(min(concurrency, threads)):
                group.start_soon(lane, app, indices)
        total = time.perf_counter() - start
    return PeerRecovery(
        threads=threads,
        concurrency=concurrency,
        total_s=total,
        open_ms=(opened - start) * 1_000,
        load_ms_per_thread=load_s * 1_000 / threads,
        resume_ms_per_thread=resume_s * 1_000 / threads,
    )


async def _run(threads: int, concurrency: int) -> tuple[float, PeerRecovery]:
    with tempfile.TemporaryDirectory(prefix="turnkeeper-recovery-") as name:
        path = Path(name) / "langgraph.db"
        start = time.perf_counter()
        await seed_langgraph(path, threads)
        seeded = time.perf_counter() - start
        return seeded, await langgraph_recover(path, threads, concurrency=concurrency)


def main() -> int:
    """Seed and recover 1,000 and 10,000 threads, at ``CONCURRENCY`` and ``CHECK_CONCURRENCY``."""
    if not available():
        print("LangGraph (langgraph, langgraph-checkpoint-sqlite): not installed")
        return 0
    for threads in SIZES:
        for concurrency in sorted({CONCURRENCY, CHECK_CONCURRENCY}):
            seeded, figures = anyio.run(_run, threads, concurrency)
            print(
                f"LangGraph AsyncSqliteSaver, {threads:,} threads, {concurrency} at a time:"
                f" recovered in {figures.total_s:.2f} s = {figures.ms_per_thread:.3f} ms/thread"
                f" (open {figures.open_ms:.1f} ms; per thread: load"
                f" {figures.load_ms_per_thread:.3f} ms, resume to first task"
                f" {figures.resume_ms_per_thread:.3f} ms); seeded in {seeded:.2f} s (not timed)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
