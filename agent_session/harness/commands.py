"""``turnkeeper run`` and ``turnkeeper demo``: scenario files in, exit codes out.

Exit codes (``docs/cli.md``): 0 every expectation held; 1 an expectation failed; 2 an
invalid scenario or usage, or a ``--db`` store another process owns (nothing ran); 3 the
engine failed or did not reach quiescence.
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
from importlib.resources import as_file, files
from pathlib import Path
from typing import IO, TYPE_CHECKING

import anyio
import msgspec

from agent_session.harness.loader import ScenarioError, load_scenario
from agent_session.harness.runner import SUPPORTED_OPS, RunResult, run_scenario
from agent_session.harness.scenario import Scenario
from agent_session.harness.support import unsupported_features
from agent_session.harness.timeline import Timeline, verdict
from agent_session.harness.trace import encode_line
from persistence import (
    MemoryStore,
    NotATurnkeeperStore,
    SqliteStore,
    Store,
    StoreLocked,
    TurnkeeperError,
)
from stream_manager import redact

if TYPE_CHECKING:
    from collections.abc import Awaitable

_encoder = msgspec.json.Encoder()


def load_all(paths: list[str]) -> tuple[list[Scenario], list[str]]:
    """Load every scenario; the problems of all of them, or none."""
    scenarios: list[Scenario] = []
    problems: list[str] = []
    for path in paths:
        try:
            scenario = load_scenario(path, supported_ops=SUPPORTED_OPS)
        except ScenarioError as error:
            problems.extend(error.problems)
            continue
        unsupported = unsupported_features(scenario)
        problems.extend(f"{path}: {line}" for line in unsupported)
        scenarios.append(scenario)
    return scenarios, problems


async def run_command(
    paths: list[str], db: str | None, memory: bool, trace: str | None, as_json: bool
) -> int:
    """``turnkeeper run``: load every scenario first (none runs if one is invalid), then run."""
    scenarios, problems = load_all(paths)
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        return 2
    if db is not None and len(scenarios) > 1:
        print("turnkeeper run: --db takes one scenario; run them one at a time", file=sys.stderr)
        return 2
    report = sys.stderr if trace == "-" else sys.stdout
    traced: list[bytes] = []
    worst = 0
    for path, scenario in zip(paths, scenarios, strict=True):
        try:
            result = await _run_one(scenario, db, memory)
        except StoreLocked as error:  # --db names a store a live process owns: nothing ran
            print(f"turnkeeper run: {redact(error)}", file=sys.stderr)
            return 2
        lines = [encode_line(line) + b"\n" for line in result.trace]
        if trace == "-":
            sys.stdout.buffer.writelines(lines)
            sys.stdout.buffer.flush()
        traced.extend(lines)
        _report(path, result, as_json, report)
        worst = max(worst, result.exit_code, key=_severity)
    if trace is not None and trace != "-":
        await anyio.to_thread.run_sync(write_private, trace, b"".join(traced))
    return worst


def write_private(path: str, data: bytes) -> None:
    """Write a trace file, created ``0600`` (an existing file keeps its mode, and is replaced)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with open(fd, "wb") as out:
        out.write(data)


def _severity(code: int) -> int:
    return {0: 0, 1: 1, 3: 2, 2: 3}.get(code, 4)


async def _run_one(scenario: Scenario, db: str | None, memory: bool) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="turnkeeper-") as scratch:
        store: Store
        if memory:
            store = MemoryStore()
        else:
            store = SqliteStore(db if db is not None else Path(scratch) / "run.db")
        try:
            return await _locked_or(run_scenario(scenario, store))
        except StoreLocked:
            raise  # run_command reports it: nothing ran
        except TurnkeeperError as error:
            return RunResult(name=scenario.name, trace=[], error=f"{type(error).__name__}: {error}")


async def _locked_or(run: Awaitable[RunResult]) -> RunResult:
    """The run's result; :class:`StoreLocked` itself when the store's open was refused.

    The engine opens the store inside the run's task group, which wraps what it raises.
    """
    try:
        return await run
    except BaseExceptionGroup as group:
        locked, rest = group.split(StoreLocked)
        if locked is None or rest is not None:
            raise
        first: BaseException = locked
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


def _report(path: str, result: RunResult, as_json: bool, out: IO[str]) -> None:
    if as_json:
        summary = {
            "scenario": path,
            "name": result.name,
            "exit": result.exit_code,
            "passed": result.exit_code == 0,
            "failures": [redact(failure) for failure in result.failures],
            "error": None if result.error is None else redact(result.error),
            "events": len(result.trace),
            "virtual_ms": result.virtual_ms,
        }
        out.write(_encoder.encode(summary).decode() + "\n")
        return
    if result.error is not None:
        out.write(f"ERROR {path}: {redact(result.error)}\n")
    elif result.failures:
        out.write(f"FAIL  {path}: {result.name}\n")
        out.writelines(f"      {redact(failure)}\n" for failure in result.failures)
    else:
        out.write(f"PASS  {path}: {result.name} ({len(result.trace)} events)\n")


async def demo_command(db: str, trace: str | None, plain: bool) -> int:
    """``turnkeeper demo``: the built-in incident on a fresh SQLite file, with a timeline."""
    path = Path(db)
    try:
        await SqliteStore.remove(path)  # a previous demo store, never another file or a live one
    except NotATurnkeeperStore as error:
        print(f"turnkeeper demo: {redact(error)}; refusing to replace it", file=sys.stderr)
        return 2
    except StoreLocked as error:
        print(f"turnkeeper demo: {redact(error)}", file=sys.stderr)
        return 2
    with as_file(files("agent_session.harness") / "incident.toml") as incident:
        scenario = load_scenario(incident, supported_ops=SUPPORTED_OPS)
    timeline = Timeline(plain=plain)
    timeline.header(scenario, path)
    try:
        result = await _locked_or(run_scenario(scenario, SqliteStore(path), observers=(timeline,)))
    except StoreLocked as error:  # another process took it since the removal
        print(f"turnkeeper demo: {redact(error)}", file=sys.stderr)
        return 2
    if trace is not None:
        trace_bytes = b"".join(encode_line(line) + b"\n" for line in result.trace)
        await anyio.to_thread.run_sync(write_private, trace, trace_bytes)
    ok, sentence = verdict(result)
    timeline.footer(ok, sentence)
    if timeline.closed:
        raise BrokenPipeError(errno.EPIPE, "the reader of the timeline went away")
    return 0 if ok else (result.exit_code or 3)
