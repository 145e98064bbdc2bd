"""``turnkeeper run`` and ``turnkeeper demo``: scenario files in, exit codes out.

Exit codes (``docs/cli.md``): 0 every expectation held; 1 an expectation failed; 2 an
invalid scenario or usage, or a ``--db`` store another process owns (nothing ran); 3 the
engine failed or did not reach quiescence. ``--db`` is a SQLite path or a PostgreSQL URL
(``db_url``); the checks of a file (its kind, a ``--trace`` that is one of its files) are for
a path only.
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
from importlib.resources import as_file, files
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

import anyio
import msgspec

from agent_session.harness.db_url import is_url, postgres_store, scrubbed, shown
from agent_session.harness.loader import ScenarioError, load_scenario, shorten
from agent_session.harness.runner import SUPPORTED_OPS, RunResult, run_scenario
from agent_session.harness.scenario import Scenario
from agent_session.harness.targets import DEMO_LABEL, trace_conflict
from agent_session.harness.timeline import Timeline, verdict
from agent_session.harness.trace import encode_line
from persistence import (
    DamagedStore,
    ForeignStore,
    MemoryStore,
    MigrationRequired,
    NotATurnkeeperStore,
    SqliteStore,
    Store,
    StoreLocked,
    TurnkeeperError,
    UnsupportedSchemaVersion,
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
            problems.extend(map(redact, error.problems))
            continue
        scenarios.append(scenario)
    return scenarios, problems


def writable_target(path: str, option: str) -> str | None:
    """Why ``path`` cannot be written as a file, or ``None``: checked before anything runs."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        return f"{option} {path}: is a directory"
    if target.exists() and not target.is_file():
        return f"{option} {path}: not a regular file"
    if not folder.is_dir():
        return f"{option} {path}: no such folder {str(folder)!r}"
    if target.exists() and not os.access(target, os.W_OK):
        return f"{option} {path}: not writable"
    if not target.exists() and not os.access(folder, os.W_OK | os.X_OK):
        return f"{option} {path}: cannot create a file in {str(folder)!r}"
    return None


#: The first bytes of every SQLite database file.
_SQLITE_HEADER: Final = b"SQLite format 3\x00"


def store_target(path: str) -> str | None:
    """Why ``--db PATH`` cannot be a store, or ``None``: the store itself checks the rest."""
    problem = writable_target(path, "--db")
    if problem is not None:
        return problem
    target = Path(path)
    try:
        with target.open("rb") as file:
            header = file.read(len(_SQLITE_HEADER))
    except FileNotFoundError:
        return None  # a new store
    except OSError as error:
        return f"--db {path}: cannot read it: {error.strerror or error}"
    if header and header != _SQLITE_HEADER:
        return f"--db {path}: not a turnkeeper store (not a SQLite file); left untouched"
    return None


def _refuse(command: str, problems: list[str | None]) -> int | None:
    found = [line for line in problems if line is not None]
    for line in found:
        print(redact(f"turnkeeper {command}: {line}"), file=sys.stderr)
    return 2 if found else None


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
    file = None if is_url(db) else db  # a URL is no file: nothing of it to check or keep
    refused = _refuse(
        "run",
        [
            None if file is None else store_target(file),
            None if trace in (None, "-") else writable_target(trace, "--trace"),
            None if trace in (None, "-") else trace_conflict(trace, db=file, inputs=paths),
        ],
    )
    if refused is not None:
        return refused
    report = sys.stderr if trace == "-" else sys.stdout
    traced: list[bytes] = []
    worst = 0
    for path, scenario in zip(paths, scenarios, strict=True):
        try:
            result = await _run_one(scenario, db, memory)
        except TurnkeeperError as error:  # the store could not be opened: nothing ran
            print(f"turnkeeper run: {shorten(_said(error, db), 300)}", file=sys.stderr)
            return 2
        lines = [encode_line(line) + b"\n" for line in result.trace]
        if trace == "-":
            sys.stdout.buffer.writelines(lines)
            sys.stdout.buffer.flush()
        traced.extend(lines)
        _report(path, result, as_json, report)
        worst = max(worst, result.exit_code, key=_severity)
    if trace is not None and trace != "-":
        try:
            await anyio.to_thread.run_sync(write_private, trace, b"".join(traced))
        except OSError as error:
            say(f"turnkeeper run: --trace {trace}: {error.strerror or error}")
            return 2
    return worst


def write_private(path: str, data: bytes) -> None:
    """Write a trace file, created ``0600`` (an existing file keeps its mode, and is replaced)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with open(fd, "wb") as out:
        out.write(data)


def say(line: str) -> None:
    """Print a line to stderr, redacted (every line ``run`` and ``demo`` print is)."""
    print(redact(line), file=sys.stderr)


def _said(error: BaseException | str, db: str | None) -> str:
    """An error as a line shows it: redacted, without the password of a ``--db`` URL."""
    return redact(scrubbed(str(error), db))


def _severity(code: int) -> int:
    return {0: 0, 1: 1, 3: 2, 2: 3}.get(code, 4)


async def _run_one(scenario: Scenario, db: str | None, memory: bool) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="turnkeeper-") as scratch:
        store: Store
        if memory:
            store = MemoryStore()
        elif db is not None and is_url(db):
            store = postgres_store(db)
        else:
            store = SqliteStore(db if db is not None else Path(scratch) / "run.db")
        return await _locked_or(run_scenario(scenario, store))


async def _locked_or(run: Awaitable[RunResult]) -> RunResult:
    """The run's result; the store's own error when it could not be opened.

    Once the run is under way every engine failure is its result (exit 3): what escapes is
    the first engine's open (a locked store, not a store, no such folder: exit 2). The engine
    opens the store inside the run's task group, which wraps what it raises.
    """
    try:
        return await run
    except BaseExceptionGroup as group:
        refused, rest = group.split(TurnkeeperError)
        if refused is None or rest is not None:
            raise
        first: BaseException = refused
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


def _report(path: str, result: RunResult, as_json: bool, out: IO[str]) -> None:
    if as_json:
        summary = {
            "scenario": redact(path),
            "name": redact(result.name),
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
        out.write(redact(f"ERROR {path}: {result.error}") + "\n")
    elif result.failures:
        out.write(redact(f"FAIL  {path}: {result.name}") + "\n")
        out.writelines(f"      {redact(failure)}\n" for failure in result.failures)
    else:
        out.write(redact(f"PASS  {path}: {result.name} ({len(result.trace)} events)") + "\n")


async def demo_command(db: str, trace: str | None, plain: bool) -> int:
    """``turnkeeper demo``: the built-in incident on a fresh store, with a timeline.

    A SQLite file an earlier demo made is replaced; a PostgreSQL URL must name an empty
    database (:func:`_fresh_postgres`). Anything else is refused, left as it was.
    """
    url = is_url(db)
    refused = _refuse(
        "demo",
        [
            None if url else writable_target(db, "--db"),
            None if trace is None else writable_target(trace, "--trace"),
            None if trace is None else trace_conflict(trace, db=None if url else db, inputs=()),
        ],
    )
    if refused is not None:
        return refused
    problem = await (_fresh_postgres(db) if url else _fresh_sqlite(db))
    if problem is not None:
        print(f"turnkeeper demo: {problem}", file=sys.stderr)
        return 2
    with as_file(files("agent_session.harness") / "incident.toml") as incident:
        scenario = load_scenario(incident, supported_ops=SUPPORTED_OPS)
    timeline = Timeline(plain=plain)
    timeline.header(scenario, shown(db), kind="PostgreSQL" if url else "SQLite, WAL")
    try:
        store = postgres_store(db) if url else SqliteStore(db, label=DEMO_LABEL)
        result = await _locked_or(run_scenario(scenario, store, observers=(timeline,)))
    except TurnkeeperError as error:  # another process took it since the removal, ...
        print(f"turnkeeper demo: {shorten(_said(error, db), 300)}", file=sys.stderr)
        return 2
    if trace is not None:
        trace_bytes = b"".join(encode_line(line) + b"\n" for line in result.trace)
        try:
            await anyio.to_thread.run_sync(write_private, trace, trace_bytes)
        except OSError as error:
            say(f"turnkeeper demo: --trace {trace}: {error.strerror or error}")
            return 2
    ok, sentence = verdict(result)
    timeline.footer(ok, sentence)
    if timeline.closed:
        raise BrokenPipeError(errno.EPIPE, "the reader of the timeline went away")
    return 0 if ok else (result.exit_code or 3)


async def _fresh_sqlite(db: str) -> str | None:
    """Remove a store an earlier demo made at ``db``; why not (a line to print), or ``None``.

    Only a store carrying the demo's label goes, under the store's lock: never another file
    or a live one.
    """
    try:
        await SqliteStore.remove(Path(db), label=DEMO_LABEL)
    except StoreLocked as error:
        return redact(error)
    except ForeignStore:
        return (
            f"{redact(db)} is a turnkeeper store that turnkeeper demo did not make; refusing "
            "to replace it (choose another --db, or remove it yourself)"
        )
    except TurnkeeperError as error:  # not a store, a damaged one, another version
        return f"{redact(error)}; refusing to replace it"
    return None


#: Why ``demo`` refuses a PostgreSQL database that holds a store.
_ONLY_EMPTY = (
    "turnkeeper demo runs only on an empty database and never deletes or writes over rows it "
    "did not make (give it a fresh database or schema, or drop this one yourself)"
)


async def _fresh_postgres(url: str) -> str | None:
    """Why the demo may not run at ``url`` (a line to print), or ``None``: it is empty.

    Checked on a read-only open, which writes nothing: a turnkeeper store of any version is
    refused, even one an earlier demo made (nothing marks its rows as the demo's). A database
    with no turnkeeper store may be empty (the demo creates the schema) or another
    application's, which the run's own open then refuses, untouched.
    """
    try:
        view = postgres_store(url, readonly=True)
        await view.open()
    except NotATurnkeeperStore:
        return None
    except (MigrationRequired, UnsupportedSchemaVersion, DamagedStore) as error:
        return f"{_said(error, url)}; refusing to use it: {_ONLY_EMPTY}"
    except TurnkeeperError as error:  # it does not connect, no psycopg
        return _said(error, url)
    try:
        listed = await view.sessions()
    except TurnkeeperError as error:
        return f"{_said(error, url)}; refusing to use it: {_ONLY_EMPTY}"
    finally:
        await view.close()
    count = len(listed) + len(listed.corrupt)
    held = f"{count} session{'' if count == 1 else 's'}"
    return f"{_said(shown(url), url)} already holds a turnkeeper store ({held}); {_ONLY_EMPTY}"
