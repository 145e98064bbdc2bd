"""The demo's timeline: each engine event printed as it happens, and a one-line verdict."""

from __future__ import annotations

from rich.text import Text

from agent_session._events import EngineEvent
from agent_session.harness.console import PipeConsole
from agent_session.harness.runner import RunResult
from agent_session.harness.scenario import Scenario
from agent_session.harness.trace import event_name
from stream_manager import redact

#: Events the timeline leaves out (they are in the trace).
_QUIET = frozenset({"tool-call-start", "tool-call-end", "phase"})
_STYLE = {
    "stream-start": "bold green",
    "stream-end": "green",
    "step": "cyan",
    "op-start": "cyan",
    "queued": "yellow",
    "withdrawn": "bold yellow",
    "dequeued": "yellow",
    "entry-canceled": "yellow",
    "stop": "magenta",
    "owed": "bold magenta",
    "continuation-ended": "bold magenta",
    "resume": "bold green",
    "persisted": "dim",
    "stream-abort": "red",
    "stream-error": "bold red",
    "launch-refused": "red",
}
_SKIP_FIELDS = frozenset({"session"})


class Timeline:
    """An engine observer that prints a line per event (``plain``: no colours, no markup)."""

    def __init__(self, *, plain: bool) -> None:
        self._console = PipeConsole(
            no_color=plain, highlight=False, force_terminal=None if not plain else False
        )
        #: The reader of the output went away (``| head``): the demo runs on, silently.
        self.closed = False
        self.seen: list[str] = []

    def _print(self, text: Text) -> None:
        if self.closed:
            return
        try:
            self._console.print(text)
        except BrokenPipeError:
            self.closed = True  # an observer must not stop the engine it watches

    def header(self, scenario: Scenario, db: str, *, kind: str = "SQLite, WAL") -> None:
        """Print what is about to run: the scenario, and the store (``db`` as shown)."""
        self._print(Text(redact(f"turnkeeper demo: {scenario.name}"), style="bold"))
        self._print(Text(redact(f"store: {db} ({kind})"), style="dim"))

    def __call__(self, event: EngineEvent) -> None:
        """Print one event."""
        name = event_name(event)
        self.seen.append(name)
        if name in _QUIET:
            return
        fields = " ".join(
            f"{key.rstrip('_')}={_show(getattr(event, key))}"
            for key in event.__struct_fields__
            if key not in _SKIP_FIELDS
        )
        line = Text()
        line.append(f"{name:<19}", style=_STYLE.get(name, ""))
        line.append(fields)
        self._print(line)

    def footer(self, ok: bool, sentence: str) -> None:
        """Print the verdict."""
        style = "bold green" if ok else "bold red"
        verdict_line = ("verdict: " if ok else "verdict: FAILED: ") + redact(sentence)
        self._print(Text(verdict_line, style=style))


def _show(value: object) -> str:
    if isinstance(value, tuple | list):
        return "[" + ",".join(redact(v) for v in value) + "]"
    return redact(value)


def verdict(result: RunResult) -> tuple[bool, str]:
    """Whether the stranded turn was resumed and answered, in one sentence."""
    if result.error is not None:
        return False, result.error
    if result.failures:
        return False, "; ".join(result.failures)
    resumed = [line for line in result.trace if line["event"] == "resume"]
    started = [line for line in resumed if line["outcome"] == "started"]
    if not started:
        return False, "the stranded turn was never resumed"
    budget = next(
        (
            line["budget"]
            for line in result.trace
            if line["event"] == "stream-start" and line["cause"] == "resume"
        ),
        None,
    )
    events, virtual = len(result.trace), result.virtual_ms
    return True, (
        f"the turn cut for a withdrawn wake was resumed under its {budget} remaining steps "
        f"and answered; nothing is owed ({events} events, {virtual} virtual ms)"
    )
