"""The crash-point sweep: kill a scenario at every durable boundary and more, recover, check.

Every durable write emits a ``persisted`` event right after its commit: each one is a point
where a crash may strike. So is every ``stream-start`` (the stream runs, its turn unanswered),
``op-start`` (a tool call about to run, its ``requested`` receipt durable), ``step`` (mid-stream,
between model steps) and ``queued`` (a message told queued): the *kill points*
(:data:`KILL_EVENTS`). For a scenario, the sweep first runs it unkilled (SQLite) to count its
events of each kind; then, for each kind E and each n in 1..N_E (or a sample of them), one
*trial*:

1. A child process runs the scenario on a fresh SQLite file (``run_scenario`` with an observer).
   Inside the emission of the n-th event named E (observers run synchronously, right after
   what the event tells) it writes the events so far to a file and sends itself ``SIGKILL``.
   The trial checks that the child died by ``SIGKILL``: runs are deterministic, so a child that
   ends normally (it reached fewer than n such events) is a harness error, not a pass.
2. A process that never opened that file recovers it: ``PRAGMA integrity_check``, a read-only
   look at the store as the kill left it, then an :class:`~agent_session.Engine` with startup
   recovery on, the scenario's tools and ``[engine]`` table, a ``VirtualClock`` and every model
   id answering any request with text, driven to quiescence the way
   the harness drives a run; then a second look at the store.
3. :func:`~agent_session.harness.crashcheck.check_trial` judges the child's events and what the
   recovery saw (the invariants and their classes are listed there).

Processes: with ``fork`` (the default where it is safe), the sweep process never opens a store
and never starts a thread; it forks one trial process per trial (up to ``--jobs`` at once),
which forks the killed child first (while it is still single-threaded: no aiosqlite thread may
be alive across a fork), then recovers and reports its result through a pipe. With ``--spawn``
(or where fork is not available) the killed child is ``python -m
agent_session.harness.crashpoints child ...`` and the sweep process recovers, one trial at a time.

``python -m agent_session.harness.crashpoints [--sample N] [--events E,...] [--jobs J] [--spawn]
[--json] FILES...`` prints per scenario its trials, kill points and violations by class, then the
trials and violations by kill point kind (*boundary*: ``persisted WHAT`` or the event's name) and
by invariant, and a total; exit 0 when nothing is violated, 1 on a violation, 2 for an invalid
scenario, 3 on a harness error.
"""

from __future__ import annotations

import argparse
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import anyio
import msgspec

from agent_session._events import EngineEvent
from agent_session.harness.commands import load_all
from agent_session.harness.crashcheck import (
    CLASSES,
    EventData,
    Finding,
    check_trial,
)
from agent_session.harness.crashrecovery import recover
from agent_session.harness.runner import run_scenario
from agent_session.harness.scenario import Scenario
from persistence import (
    SqliteStore,
)

#: A killed child that reached fewer than k boundaries ends with this status.
EXIT_FEWER = 10
#: A killed child whose run raised (its traceback is on stderr).
EXIT_CHILD_FAILED = 11
#: A trial process whose trial raised.
EXIT_TRIAL_FAILED = 12
#: Real seconds after which a hung child or trial is ended by ``SIGALRM`` (a harness error).
CHILD_ALARM_S = 120
TRIAL_ALARM_S = 300

#: The events a trial may kill at: every durable write, and the points between them where a
#: turn is mid-stream (a step, a tool call's part, its receipt, the loop's stop), mid-tool (an
#: operation about to run), mid-queue (told queued, taken off, withdrawn, cancelled) or
#: mid-continuation (owed, a resume's outcome, an ending), mid-retry (scheduled, abandoned),
#: mid-compaction, and every phase move.
KILL_EVENTS: tuple[str, ...] = (
    "persisted",
    "stream-start",
    "step",
    "tool-call-start",
    "op-start",
    "tool-call-end",
    "receipt",
    "stop",
    "stream-end",
    "queued",
    "dequeued",
    "withdrawn",
    "entry-canceled",
    "owed",
    "resume",
    "continuation-ended",
    "retry-scheduled",
    "retry-abandoned",
    "compaction",
    "phase",
)

#: This module, as ``python -m`` names it (``__name__`` is ``__main__`` there).
MODULE = "agent_session.harness.crashpoints"

_encoder = msgspec.json.Encoder()


class TrialResult(msgspec.Struct, kw_only=True):
    """One trial: the kill point (the k-th event named ``event``), what it was, the findings."""

    k: int
    event: str = "persisted"
    #: A ``persisted`` event's ``what``; empty for the other kinds.
    what: str = ""
    #: What the event names: a write's id, the stream, the operation, the entry.
    id: str = ""
    findings: list[Finding] = msgspec.field(default_factory=list)
    #: A harness error: the child did not die by SIGKILL, a process failed.
    error: str | None = None


class Baseline(msgspec.Struct, kw_only=True):
    """The unkilled run: how many events of each kill kind it emits; an error unless it passed."""

    counts: dict[str, int] = msgspec.field(default_factory=dict)
    error: str | None = None

    @property
    def boundaries(self) -> int:
        """Its kill points, of every kind."""
        return sum(self.counts.values())


@dataclass
class ScenarioReport:
    """One scenario's sweep."""

    path: str
    name: str
    #: Its kill points (of every kind).
    boundaries: int = 0
    trials: list[TrialResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def violations(self) -> list[tuple[TrialResult, Finding]]:
        """Every finding, with its trial."""
        return [(trial, finding) for trial in self.trials for finding in trial.findings]

    def by_class(self) -> Counter[str]:
        """How many findings of each class."""
        return Counter(finding.cls for _, finding in self.violations())

    def harness_errors(self) -> list[str]:
        """The scenario's errors and its trials'."""
        return [
            *self.errors,
            *(f"{t.event} k={t.k}: {t.error}" for t in self.trials if t.error),
        ]


# ------------------------------------------------------------------ the killed child


def _write_events(path: Path, events: Sequence[EventData]) -> None:
    data = b"".join(_encoder.encode(event) + b"\n" for event in events)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def read_events(path: Path) -> list[dict[str, Any]]:
    """Events written by :func:`run_child` (one JSON object a line)."""
    if not path.exists():
        return []
    return [msgspec.json.decode(line) for line in path.read_bytes().splitlines() if line]


def boundary(trial: TrialResult) -> str:
    """The kind of a trial's kill point: ``persisted WHAT``, or the event's name."""
    return f"persisted {trial.what}" if trial.event == "persisted" else trial.event


def _names(event: EventData) -> str:
    """What a kill point names: the write's id, the stream (and step), the operation, the entry."""
    name = event.get("event")
    if name == "step":
        return f"{event.get('stream')}#{event.get('n')}"
    if name == "phase":
        return f"{event.get('session')} {event.get('from')}->{event.get('to')}"
    for key in ("id", "op", "call", "entry", "cut", "stream"):
        if key in event:
            return str(event[key])
    return str(event.get("session", ""))


def run_child(
    scenario: Scenario, db: Path, k: int, events_out: Path, kill_at: str = "persisted"
) -> int:
    """Run ``scenario`` on ``db``; at the k-th event named ``kill_at``, write the events and die.

    With ``k = 0`` the run is not killed: the events are written at its end and its exit code
    (``docs/cli.md``) returned. Otherwise returning at all means the run reached fewer than k
    boundaries (:data:`EXIT_FEWER`).
    """
    signal.alarm(CHILD_ALARM_S)
    logging.disable(logging.CRITICAL)
    events: list[EventData] = []
    seen = 0

    def observe(event: EngineEvent) -> None:
        nonlocal seen
        data: dict[str, Any] = msgspec.to_builtins(event)
        events.append(data)
        if data["event"] != kill_at:
            return
        seen += 1
        if seen != k:
            return
        try:
            _write_events(events_out, events)
        except BaseException:  # the engine would swallow it: fail the child here instead
            traceback.print_exc()
            os._exit(EXIT_CHILD_FAILED)
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(EXIT_CHILD_FAILED)  # never reached: SIGKILL to oneself lands before kill returns

    result = anyio.run(_run, scenario, db, observe)
    if k > 0:
        return EXIT_FEWER
    _write_events(events_out, events)
    return result


async def _run(scenario: Scenario, db: Path, observe: Callable[[EngineEvent], None]) -> int:
    result = await run_scenario(scenario, SqliteStore(db), observers=(observe,))
    if result.error is not None:
        print(f"{scenario.name}: {result.error}", file=sys.stderr)
    return result.exit_code


def _launch_fork(scenario: Scenario, db: Path, k: int, events_out: Path, kill_at: str) -> int:
    """Fork the killed child; its exit code as ``subprocess`` gives it (``-9``: SIGKILL)."""
    pid = _fork()
    if pid == 0:
        code = EXIT_CHILD_FAILED
        try:
            code = run_child(scenario, db, k, events_out, kill_at)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _launch_spawn(path: str, db: Path, k: int, events_out: Path, kill_at: str) -> int:
    """Run the killed child as ``python -m agent_session.harness.crashpoints child ...``."""
    command = [
        *(sys.executable, "-m", MODULE, "child", path, str(db), str(k), str(events_out), kill_at)
    ]
    return subprocess.run(command, check=False).returncode


def _fork() -> int:
    """``os.fork``, refused while another thread is alive (its locks would be copied held)."""
    if threading.active_count() != 1:
        names = ", ".join(t.name for t in threading.enumerate())
        raise RuntimeError(f"refusing to fork with threads alive: {names}")
    sys.stdout.flush()
    sys.stderr.flush()
    return os.fork()


def _describe_exit(code: int, k: int, kill_at: str) -> str:
    if code == EXIT_FEWER:
        return f"the child ended normally before its {kill_at} event {k} (runs are deterministic)"
    if code < 0:
        return f"the child died by {signal.Signals(-code).name}, not SIGKILL"
    return f"the child exited with status {code}"


# ------------------------------------------------------------------ trials


@dataclass(frozen=True)
class _Job:
    """One unit of work: a baseline (``k = 0``) or a trial, in a directory of its own."""

    #: Its position in the batch of jobs run together.
    index: int
    #: Its scenario's position in the sweep.
    owner: int
    path: str
    scenario: Scenario
    k: int
    workdir: Path
    #: The kill point's event name (a trial kills at its k-th one).
    kill_at: str = "persisted"


def _launch(job: _Job, db: Path, events_out: Path, spawn: bool) -> int:
    if spawn:
        return _launch_spawn(job.path, db, job.k, events_out, job.kill_at)
    return _launch_fork(job.scenario, db, job.k, events_out, job.kill_at)


def run_baseline(job: _Job, spawn: bool) -> Baseline:
    """Run the scenario unkilled on a fresh SQLite file and count its kill points by kind."""
    job.workdir.mkdir(parents=True)
    events_out = job.workdir / "events.jsonl"
    try:
        code = _launch(job, job.workdir / "run.db", events_out, spawn)
        events = read_events(events_out)
    finally:
        shutil.rmtree(job.workdir, ignore_errors=True)
    counts = Counter(str(event.get("event")) for event in events)
    found = {name: counts[name] for name in KILL_EVENTS if counts[name]}
    if code != 0:
        return Baseline(counts=found, error=f"the unkilled run fails: exit {code}")
    return Baseline(counts=found)


def run_trial(job: _Job, spawn: bool) -> TrialResult:
    """Kill a run at its ``job.k``-th ``job.kill_at`` event, recover its store here, check."""
    job.workdir.mkdir(parents=True)
    db, events_out = job.workdir / "run.db", job.workdir / "events.jsonl"
    try:
        code = _launch(job, db, events_out, spawn)
        events = read_events(events_out)
        result = TrialResult(k=job.k, event=job.kill_at)
        if events and events[-1].get("event") == job.kill_at:
            result.id = _names(events[-1])
            if job.kill_at == "persisted":
                result.what = str(events[-1].get("what"))
        if code != -signal.SIGKILL:
            result.error = _describe_exit(code, job.k, job.kill_at)
            return result
        facts = anyio.run(recover, job.scenario, db)
        result.findings = check_trial(events, facts)
        return result
    finally:
        shutil.rmtree(job.workdir, ignore_errors=True)


def _in_fork(job: _Job) -> bytes:
    """What a trial process reports: its baseline or trial result, as JSON."""
    signal.alarm(TRIAL_ALARM_S)
    if job.k == 0:
        return _encoder.encode(run_baseline(job, spawn=False))
    return _encoder.encode(run_trial(job, spawn=False))


def _run_forked(jobs: Sequence[_Job], width: int) -> list[tuple[bytes, int]]:
    """Run each job in a forked process, ``width`` at once; each one's output and exit code."""
    results: list[tuple[bytes, int]] = [(b"", 0)] * len(jobs)
    waiting = deque(jobs)
    chunks: dict[int, list[bytes]] = {}
    with selectors.DefaultSelector() as selector:
        while waiting or selector.get_map():
            while waiting and len(selector.get_map()) < width:
                job = waiting.popleft()
                read_end, write_end = os.pipe()
                pid = _fork()
                if pid == 0:  # the trial process
                    os.close(read_end)
                    _serve(job, write_end)
                os.close(write_end)
                chunks[job.index] = []
                selector.register(read_end, selectors.EVENT_READ, (job.index, pid))
            for key, _ in selector.select():
                index, pid = key.data
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    chunks[index].append(chunk)
                    continue
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                results[index] = (b"".join(chunks.pop(index)), os.waitstatus_to_exitcode(status))
    return results


def _serve(job: _Job, write_end: int) -> NoReturn:
    code = EXIT_TRIAL_FAILED
    try:
        view = memoryview(_in_fork(job))
        while view:
            view = view[os.write(write_end, view) :]
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _failed(job: _Job, why: str) -> Baseline | TrialResult:
    if job.k == 0:
        return Baseline(error=why)
    return TrialResult(k=job.k, event=job.kill_at, error=why)


def _decoded(job: _Job, data: bytes, code: int) -> Baseline | TrialResult:
    if code != 0 or not data:
        return _failed(job, f"its process exited with status {code}")
    if job.k == 0:
        return msgspec.json.decode(data, type=Baseline)
    return msgspec.json.decode(data, type=TrialResult)


def _run_jobs(jobs: Sequence[_Job], *, spawn: bool, width: int) -> list[Baseline | TrialResult]:
    """Each job's result: forked ``width`` at once, or (``spawn``) one after the other here."""
    if not spawn:
        outputs = _run_forked(jobs, width)
        return [_decoded(job, data, code) for job, (data, code) in zip(jobs, outputs, strict=True)]
    results: list[Baseline | TrialResult] = []
    for job in jobs:
        try:
            results.append(run_baseline(job, True) if job.k == 0 else run_trial(job, True))
        except Exception as error:
            results.append(_failed(job, f"{type(error).__name__}: {error}"))
    return results


def select_boundaries(boundaries: int, sample: int | None) -> list[int]:
    """Every boundary, or at most ``sample`` of them spread evenly (the first and last too)."""
    if sample is None or sample >= boundaries:
        return list(range(1, boundaries + 1))
    if sample <= 1:
        return [boundaries]
    step = (boundaries - 1) / (sample - 1)
    return sorted({1 + round(i * step) for i in range(sample)})


def fork_is_safe() -> bool:
    """Fork is available and this process runs no other thread."""
    return hasattr(os, "fork") and threading.active_count() == 1


@dataclass
class Sweep:
    """A whole sweep: its scenarios' reports, how its trials ran, how long it took."""

    reports: list[ScenarioReport]
    mode: str
    seconds: float


def sweep(
    paths: Sequence[str],
    scenarios: Sequence[Scenario],
    *,
    sample: int | None = None,
    jobs: int | None = None,
    spawn: bool = False,
    kill_at: Sequence[str] = KILL_EVENTS,
) -> Sweep:
    """Sweep every scenario's kill points (all, or ``sample`` of each kind per scenario).

    ``kill_at``: the event names to kill at (:data:`KILL_EVENTS` by default).

    Trials fork, ``jobs`` at once (default: one per CPU), unless ``spawn`` is asked for or this
    process cannot fork safely: then each killed child is a new interpreter, one at a time.
    """
    started = time.monotonic()
    spawn = spawn or not fork_is_safe()
    width = 1 if spawn else max(1, jobs or os.cpu_count() or 1)
    reports = [ScenarioReport(path=p, name=s.name) for p, s in zip(paths, scenarios, strict=True)]
    scratch = Path(tempfile.mkdtemp(prefix="turnkeeper-crash-"))
    try:
        baselines = [
            _Job(i, i, p, s, 0, scratch / f"s{i}-base")
            for i, (p, s) in enumerate(zip(paths, scenarios, strict=True))
        ]
        trials: list[_Job] = []
        found_all = _run_jobs(baselines, spawn=spawn, width=width)
        for job, found in zip(baselines, found_all, strict=True):
            assert isinstance(found, Baseline)
            report = reports[job.owner]
            if found.error is not None:
                report.errors.append(found.error)
            for index, name in enumerate(kill_at):
                counted = found.counts.get(name, 0)
                report.boundaries += counted
                for k in select_boundaries(counted, sample):
                    workdir = scratch / f"s{job.index}-e{index}-k{k}"
                    trials.append(
                        _Job(len(trials), job.owner, job.path, job.scenario, k, workdir, name)
                    )
        for job, done in zip(trials, _run_jobs(trials, spawn=spawn, width=width), strict=True):
            assert isinstance(done, TrialResult)
            reports[job.owner].trials.append(done)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    mode = "spawn, 1 at a time" if spawn else f"fork, {width} at a time"
    return Sweep(reports=reports, mode=mode, seconds=time.monotonic() - started)


# ------------------------------------------------------------------ the command line


def _classes(counts: Counter[str]) -> str:
    ordered = sorted(counts, key=lambda c: (CLASSES.index(c) if c in CLASSES else len(CLASSES), c))
    return ", ".join(f"{cls} {counts[cls]}" for cls in ordered)


def _violations_phrase(counts: Counter[str]) -> str:
    total = sum(counts.values())
    noun = "violation" if total == 1 else "violations"
    return f"{total} {noun}" + (f" ({_classes(counts)})" if total else "")


def by_boundary(done: Sweep) -> dict[str, tuple[int, int]]:
    """Per kind of kill point (:func:`boundary`): its trials and the violations they found."""
    counts: dict[str, tuple[int, int]] = {}
    for report in done.reports:
        for trial in report.trials:
            trials, found = counts.get(boundary(trial), (0, 0))
            counts[boundary(trial)] = (trials + 1, found + len(trial.findings))
    return dict(sorted(counts.items()))


def by_invariant(done: Sweep) -> dict[str, int]:
    """Every class of :data:`CLASSES` (and any other found), with its violations (0 too)."""
    total: Counter[str] = Counter()
    for report in done.reports:
        total.update(report.by_class())
    return {**dict.fromkeys(CLASSES, 0), **total}


def print_sweep(done: Sweep) -> None:
    """Per scenario: trials, kill points, violations by class, each one; then the totals."""
    reports = done.reports
    for report in reports:
        counts = report.by_class()
        print(
            f"{report.path}: {len(report.trials)} trials, {report.boundaries} kill points, "
            f"{_violations_phrase(counts)}"
        )
        for trial, finding in report.violations():
            where = f"{boundary(trial)} k={trial.k} {trial.id}"
            print(f"  {where}: {finding.cls}: {finding.reason}")
        for error in report.harness_errors():
            print(f"  HARNESS ERROR {error}")
    print("by boundary (trials, violations):")
    for kind, (trials, found) in by_boundary(done).items():
        print(f"  {kind}: {trials} trials, {found} violations")
    print("by invariant (violations):")
    for cls, found in by_invariant(done).items():
        print(f"  {cls}: {found}")
    total: Counter[str] = Counter()
    for report in reports:
        total.update(report.by_class())
    errors = sum(len(r.harness_errors()) for r in reports)
    print(
        f"total: {len(reports)} scenarios, {sum(len(r.trials) for r in reports)} trials, "
        f"{sum(r.boundaries for r in reports)} kill points, {_violations_phrase(total)}, "
        f"{errors} harness errors, {done.seconds:.1f} s ({done.mode})"
    )


def sweep_json(done: Sweep) -> bytes:
    """The sweep as one JSON document."""
    return _encoder.encode(
        {
            "scenarios": [
                {
                    "path": r.path,
                    "name": r.name,
                    "boundaries": r.boundaries,
                    "trials": len(r.trials),
                    "violations": [
                        {
                            "event": t.event,
                            "k": t.k,
                            "what": t.what,
                            "id": t.id,
                            "class": f.cls,
                            "reason": f.reason,
                        }
                        for t, f in r.violations()
                    ],
                    "errors": r.harness_errors(),
                }
                for r in done.reports
            ],
            "by_boundary": {
                kind: {"trials": trials, "violations": found}
                for kind, (trials, found) in by_boundary(done).items()
            },
            "by_invariant": by_invariant(done),
            "mode": done.mode,
            "seconds": round(done.seconds, 3),
        }
    )


def exit_code(done: Sweep) -> int:
    """3 on a harness error, else 1 on a violation, else 0."""
    if any(r.harness_errors() for r in done.reports):
        return 3
    return 1 if any(r.violations() for r in done.reports) else 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"should be at least 1, got {value}")
    return value


def _kill_events(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in KILL_EVENTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown kill event {', '.join(unknown) or '(none)'}: one of {', '.join(KILL_EVENTS)}"
        )
    return names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agent_session.harness.crashpoints",
        description="Kill each scenario at every kill point, recover, check the invariants.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="scenario files (TOML or JSON)")
    parser.add_argument(
        "--sample",
        type=_positive,
        metavar="N",
        help="at most N kill points of each kind per scenario, spread evenly (default: all)",
    )
    parser.add_argument(
        "--events",
        type=_kill_events,
        default=KILL_EVENTS,
        metavar="E,...",
        help=f"the events to kill at (default: {','.join(KILL_EVENTS)})",
    )
    parser.add_argument(
        "--jobs", type=_positive, metavar="J", help="forked trials at once (default: CPUs)"
    )
    parser.add_argument("--spawn", action="store_true", help="a new interpreter per killed child")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The sweep's command line (and, as ``child``, the spawned killed child)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["child"]:
        return _child_main(args[1:])
    options = _parser().parse_args(args)
    scenarios, problems = load_all(options.files)
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        return 2
    done = sweep(
        options.files,
        scenarios,
        sample=options.sample,
        jobs=options.jobs,
        spawn=options.spawn,
        kill_at=options.events,
    )
    if options.json:
        sys.stdout.buffer.write(sweep_json(done) + b"\n")
    else:
        print_sweep(done)
    return exit_code(done)


def _child_main(args: Sequence[str]) -> int:
    path, db, k, events_out, *kill_at = args
    scenarios, problems = load_all([path])
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    return run_child(scenarios[0], Path(db), int(k), Path(events_out), *kill_at[:1])


if __name__ == "__main__":
    sys.exit(main())
