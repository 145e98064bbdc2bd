"""The kill -9 loop: many sessions on one SQLite file, killed at random points, restarted, checked.

A *child* (``python -m agent_session.harness.killloop child DIR RUN SEED SESSIONS``) runs an
:class:`~agent_session.Engine` with startup recovery on ``DIR/store.db`` and, for each of
``SESSIONS`` sessions, a host task that sends user messages (``await session.send(...)``: a
message counts as sent once its :class:`~agent_session.Delivery` says it is safe, and is then
appended, fsync'd, to ``DIR/sent.log``), queues wakes and withdraws them. Its model calls the
``work`` tool once per user message (the arguments name the message's text, so a retried turn
asks for the same call) and then answers; the tool appends every execution, fsync'd, to
``DIR/exec.log`` before it does anything. The child writes one byte to its stdout per engine
event.

The *parent* (:func:`run_loop`) starts a child, counts its events and sends it ``SIGKILL`` at a
seeded random count, ``kills`` times; then a last child sends nothing and runs until every
session is settled (startup recovery first). Then it reads the store and counts:

- lost: messages in ``sent.log`` neither in a user row (a batch's row joins its adds' texts
  with newlines) nor in the store's durable queue (must be 0);
- duplicated: messages in more than one user row, or in one and queued (must be 0);
- unanswered: sessions whose history ends on a user row, a ``[CONTINUE]`` sentinel or a
  partial row with no abandon marker naming why (must be 0); abandoned: those with one;
- duplicate executions: a tool call (session and arguments) executed again while no
  ``indeterminate`` receipt stood for an earlier execution of it (must be 0).

``python -m agent_session.harness.killloop [--sessions N] [--kills K] [--seed S] [--json]``
prints the figures; exit 0 when all four are 0, 1 otherwise, 3 on a harness error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import anyio

from agent_session._engine import Engine
from agent_session._rows import decode_body
from agent_session._session import AgentSession
from agent_session.ports import EngineConfig
from message_queue import decode_entry
from persistence import (
    CorruptRecord,
    OperationRecord,
    OpState,
    RowKind,
    SqliteStore,
    UsageError,
)
from stream_manager import (
    FunctionModel,
    ModelRequest,
    ScriptStep,
    ScriptToolCall,
    ToolCallPart,
    ToolContext,
    ToolKind,
    ToolResultPart,
)

MODULE = "agent_session.harness.killloop"
#: Messages each session's host sends in one child run (its follow-ups arrive while busy).
MESSAGES_PER_RUN = 4
#: Real seconds one child may run before the parent calls it hung (a harness error).
CHILD_TIMEOUT_S = 120.0


# ------------------------------------------------------------------ the child


def _append(path: Path, line: str) -> None:
    """Append ``line`` and fsync: it is on disk before the caller goes on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def _answer(request: ModelRequest) -> ScriptStep:
    """A user message: call ``work`` on its text; a tool result: answer."""
    last = request.messages[-1]
    if last.tool_results:
        return ScriptStep(text=f"done ({len(request.messages)} messages seen)")
    job = last.text.replace("\n", " | ")
    return ScriptStep(tool_calls=(ScriptToolCall(tool="work", args={"job": job}),))


class _WorkTool:
    """Logs each execution durably, then takes a little real time (where kills land)."""

    def __init__(self, log: Path, rng: random.Random) -> None:
        self._log = log
        self._rng = rng

    @property
    def name(self) -> str:
        """The name the model calls it by."""
        return "work"

    @property
    def kind(self) -> ToolKind:
        """A client tool: the engine runs it as an operation."""
        return ToolKind.CLIENT

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        job = str(call.args.get("job", "")) if isinstance(call.args, dict) else ""
        _append(self._log, json.dumps([context.op_id, context.session, job]))
        await anyio.sleep(self._rng.random() * 0.004)
        return ToolResultPart(call_id=call.call_id, name=call.name, output=f"worked on {job}")


async def _host(session: AgentSession, run: int, sent: Path, rng: random.Random) -> None:
    """Send follow-ups (mostly while busy), queue wakes and withdraw them."""
    for n in range(MESSAGES_PER_RUN):
        text = f"run {run} {session.id} message {n}"
        delivery = await session.send(text)
        if delivery.safe:
            _append(sent, json.dumps([session.id, text]))
        if session.busy and rng.random() < 0.5:
            wake = f"wake-{run}-{n}"
            session.enqueue(f"wake {run}/{n}", kind="wake", entry=wake)
            await anyio.sleep(rng.random() * 0.002)
            if session.busy:
                with contextlib.suppress(UsageError):  # it ran already: nothing to withdraw
                    session.withdraw(wake)
        await anyio.sleep(rng.random() * 0.006)


async def _child(folder: Path, run: int, seed: int, sessions: int) -> None:
    rng = random.Random(seed * 1_000 + run)
    sends = run >= 0  # the last run (-1) only recovers and settles
    out = sys.stdout.fileno()

    def tick(_: object) -> None:
        os.write(out, b".")

    engine = Engine(
        store=SqliteStore(folder / "store.db"),
        models={"m": FunctionModel("m", _answer)},
        tools={"work": _WorkTool(folder / "exec.log", rng)},
        config=EngineConfig(max_stream_steps=4, tool_deadline_s=30.0),
        observers=(tick,),
    )
    async with engine:
        opened = [await engine.open_session(f"s{i:02d}", model="m") for i in range(sessions)]
        if sends:
            async with anyio.create_task_group() as group:
                for session in opened:
                    group.start_soon(_host, session, run, folder / "sent.log", rng)
        await engine.wait_idle()


def child_main(args: Sequence[str]) -> int:
    """``child DIR RUN SEED SESSIONS``: one child run (``RUN`` -1: recover and settle only)."""
    folder, run, seed, sessions = args
    anyio.run(_child, Path(folder), int(run), int(seed), int(sessions))
    return 0


# ------------------------------------------------------------------ the parent


@dataclass
class LoopReport:
    """What a loop did and found."""

    sessions: int
    kills: int
    seed: int
    #: Children killed before they ended by themselves, and those that ended first.
    killed: int = 0
    ended_first: int = 0
    events_at_kill: list[int] = field(default_factory=list)
    sent: int = 0
    lost: int = 0
    duplicated: int = 0
    unanswered: int = 0
    abandoned: int = 0
    executions: int = 0
    duplicate_executions: int = 0
    #: Re-executions after an earlier one's receipt was indeterminate (the guard's business).
    reran_after_indeterminate: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    error: str | None = None

    def ok(self) -> bool:
        """Nothing lost, duplicated, unanswered or run twice, and no harness error."""
        bad = self.lost + self.duplicated + self.unanswered + self.duplicate_executions
        return self.error is None and bad == 0


def _start(folder: Path, run: int, seed: int, sessions: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", MODULE, "child", str(folder), str(run), str(seed)]
    return subprocess.Popen([*command, str(sessions)], stdout=subprocess.PIPE)


def _kill_at(child: subprocess.Popen[bytes], target: int) -> int | None:
    """Count the child's events; SIGKILL it at ``target``. The count, or ``None`` if it ended."""
    assert child.stdout is not None
    seen = 0
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while seen < target:
        chunk = os.read(child.stdout.fileno(), target - seen)
        if not chunk:
            child.wait()
            child.stdout.close()
            return None
        seen += len(chunk)
        if time.monotonic() > deadline:
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    return seen


def run_loop(folder: Path, *, sessions: int, kills: int, seed: int) -> LoopReport:
    """Kill a child ``kills`` times at seeded random points, settle, check the store."""
    started = time.monotonic()
    report = LoopReport(sessions=sessions, kills=kills, seed=seed)
    rng = random.Random(seed)
    for run in range(kills):
        child = _start(folder, run, seed, sessions)
        seen = _kill_at(child, rng.randint(20, 60 * sessions))
        if seen is None:
            report.ended_first += 1
            if child.returncode != 0:
                report.error = f"child run {run} exited with status {child.returncode}"
                return report
        else:
            report.killed += 1
            report.events_at_kill.append(seen)
    last = _start(folder, -1, seed, sessions)
    assert last.stdout is not None
    try:
        last.stdout.read()
        code = last.wait(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        last.kill()
        code = -1
    finally:
        last.stdout.close()
    if code != 0:
        report.error = f"the settling run exited with status {code}"
        return report
    anyio.run(_check, folder, report)
    report.seconds = time.monotonic() - started
    return report


def _lines(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _holds(row_text: str, text: str) -> bool:
    return text in row_text.split("\n")


async def _check(folder: Path, report: LoopReport) -> None:
    """Count lost, duplicated, unanswered, abandoned and duplicate executions."""
    rows: dict[str, list[str]] = {}  # session -> its user rows' texts
    queued: Counter[tuple[str, str]] = Counter()
    async with SqliteStore(folder / "store.db", readonly=True) as store:
        for record in await store.sessions():
            loaded = await store.load(record.id, envelopes=False)
            if loaded is None:
                continue
            rows[record.id] = [decode_body(r).text for r in loaded.rows if r.kind is RowKind.USER]
            last = next((r for r in reversed(loaded.rows) if r.kind is not RowKind.SYSTEM), None)
            if last is not None and last.kind in (RowKind.USER, RowKind.SENTINEL, RowKind.PARTIAL):
                if loaded.abandon is not None and loaded.abandon.reason:
                    report.abandoned += 1
                else:
                    report.unanswered += 1
                    report.problems.append(f"{record.id} ends unanswered on {last.row_id}")
        for entry in (await store.queued()).records:
            try:
                state = decode_entry(entry.body, f"{entry.session}/{entry.entry_id}")
            except CorruptRecord as error:
                report.problems.append(str(error))
                continue
            queued.update((entry.session, add.text) for add in state.messages)
        receipts = {r.op_id: r for r in (await store.receipts()).records}
    for session, text in _lines(folder / "sent.log"):
        report.sent += 1
        count = sum(_holds(row, text) for row in rows.get(session, ())) + queued[session, text]
        if count == 0:
            report.lost += 1
            report.problems.append(f"lost: {session} {text!r}")
        elif count > 1:
            report.duplicated += 1
            report.problems.append(f"duplicated {count} times: {session} {text!r}")
    _check_executions(_lines(folder / "exec.log"), receipts, report)


def _check_executions(
    executions: list[list[str]], receipts: Mapping[str, OperationRecord], report: LoopReport
) -> None:
    earlier: dict[tuple[str, str], list[str]] = {}
    for op, session, job in executions:
        report.executions += 1
        before = earlier.setdefault((session, job), [])
        if before:
            states = [receipts[o].state for o in before if o in receipts]
            if any(state is OpState.INDETERMINATE for state in states) and op not in before:
                report.reran_after_indeterminate += 1
            else:
                report.duplicate_executions += 1
                seen = ", ".join(f"{o} {receipts[o].state.value}" for o in before if o in receipts)
                report.problems.append(f"{op} ran {session} {job!r} again after {seen}")
        before.append(op)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=24, help="sessions (default 24)")
    parser.add_argument("--kills", type=int, default=60, help="kill -9s (default 60)")
    parser.add_argument("--seed", type=int, default=24, help="the loop's seed (default 24)")
    parser.add_argument("--dir", type=Path, help="keep the files here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The loop's command line (and, as ``child``, one child run)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["child"]:
        return child_main(args[1:])
    options = _parser().parse_args(args)
    with tempfile.TemporaryDirectory(prefix="turnkeeper-killloop-") as scratch:
        folder = options.dir or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        report = run_loop(folder, sessions=options.sessions, kills=options.kills, seed=options.seed)
    if options.json:
        print(json.dumps(asdict(report)))
    else:
        print_report(report)
    if report.error is not None:
        return 3
    return 0 if report.ok() else 1


def print_report(report: LoopReport) -> None:
    """The figures, then each problem."""
    print(
        f"kill -9 loop: {report.sessions} sessions, {report.kills} runs ({report.killed} killed, "
        f"{report.ended_first} ended first), seed {report.seed}: {report.sent} messages sent, "
        f"{report.lost} lost, {report.duplicated} duplicated, {report.unanswered} unanswered, "
        f"{report.abandoned} abandoned, {report.executions} tool executions, "
        f"{report.duplicate_executions} duplicate executions "
        f"({report.reran_after_indeterminate} re-run after indeterminate), {report.seconds:.1f} s"
    )
    for problem in report.problems[:40]:
        print(f"  {problem}")
    if report.error is not None:
        print(f"  HARNESS ERROR {report.error}")


if __name__ == "__main__":
    sys.exit(main())
