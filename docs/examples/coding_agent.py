"""A coding-agent host on turnkeeper, against a real model (``docs/models.md``).

Run it twice on the same database: the first run is killed right after a turn was cut (the
cut is durable), the second run recovers that turn and finishes it::

    export OPENAI_API_KEY=sk-...   TURNKEEPER_MODEL=openai:gpt-4.1-mini   # any pydantic-ai name
    python docs/examples/coding_agent.py agent.db --crash   # dies after the cut
    python docs/examples/coding_agent.py agent.db           # the restart recovers the turn

With ``TURNKEEPER_BASE_URL`` set it talks to that OpenAI-compatible server instead (the test
``tests/models/test_example_host.py`` runs it against a scripted one).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

from agent_session import (
    AgentSession,
    ContinuationOwed,
    Engine,
    EngineConfig,
    EngineEvent,
    Recovered,
    ResumeAttempted,
)
from message_queue import DispatchMode, EntryKind
from persistence import SqliteStore
from stream_manager import FunctionTool, OperationStarted, ToolCallStarted
from stream_manager.models import PydanticAIModel

WORKSPACE = Path(os.environ.get("AGENT_WORKSPACE", ".")).resolve()


async def read_file(path: str) -> str:
    """Read a text file of the workspace."""
    return (WORKSPACE / path).read_text(encoding="utf-8")[:20_000]


async def shell(command: str) -> str:
    """Run a shell command in the workspace and return its exit code and output."""
    done = await anyio.run_process(["sh", "-c", command], cwd=WORKSPACE, check=False)
    return f"exit {done.returncode}\n{done.stdout.decode(errors='replace')[-4_000:]}"


def build_model() -> PydanticAIModel:
    """The model: ``TURNKEEPER_MODEL`` (a pydantic-ai name), at ``TURNKEEPER_BASE_URL`` if set."""
    name = os.environ.get("TURNKEEPER_MODEL", "openai:gpt-4.1-mini")
    base_url = os.environ.get("TURNKEEPER_BASE_URL")
    printing = lambda text: print(text, end="", flush=True)  # noqa: E731
    return PydanticAIModel(name, model_id="agent", base_url=base_url, on_text_delta=printing)


class Host:
    """What a user does while the agent works: follow up, stop, wait for a build."""

    def __init__(self, crash: bool) -> None:
        self.crash = crash
        self.recovered = False
        self.task = ""
        self.session: AgentSession | None = None

    def __call__(self, event: EngineEvent) -> None:
        """React to the engine's events, synchronously (an engine observer)."""
        self.recovered = self.recovered or isinstance(event, Recovered)
        session = self.session
        if session is None:
            return
        if isinstance(event, ToolCallStarted) and event.tool == "read_file":
            session.send("Also: how long is it?")  # a follow-up queued while the model streams
        elif isinstance(event, OperationStarted) and event.tool == "shell":
            if "test" in self.task:
                session.stop()  # the user stops a long test run: the call is cancelled
            else:  # the build tool reports back when the call ends: the turn is cut there
                session.enqueue(
                    "build watcher: done",
                    kind=EntryKind.WAKE,
                    entry="build",
                    mode=DispatchMode.TOOL_END,
                )
        elif isinstance(event, ContinuationOwed) and self.crash and "Build" in self.task:
            print(f"\n[host] turn {event.cut} cut with {event.remaining} steps owed; crashing")
            os._exit(3)  # the process dies: the cut is already durable
        elif isinstance(event, ResumeAttempted):
            print(f"\n[host] recovered turn {event.cut}: {event.outcome}")

    async def turn(self, text: str) -> None:
        """Send ``text`` and wait until the session is idle again."""
        assert self.session is not None
        self.task = text
        print(f"\n> {text}")
        self.session.send(text)
        await self.session.wait_idle()


async def main(db: str, crash: bool) -> None:
    """Run the three turns on ``db``, or, after a crash, let the restart recover the cut one."""
    host = Host(crash)
    model = build_model()
    engine = Engine(
        store=SqliteStore(db),
        models={"agent": model},
        tools={"read_file": FunctionTool(read_file), "shell": FunctionTool(shell, deadline_s=30)},
        config=EngineConfig(max_stream_steps=12),
        observers=[host],
    )
    async with model, engine:  # recovery runs here: an owed turn of a crashed run resumes now
        host.session = await engine.open_session("dev", model="agent")
        await engine.wait_idle()
        if host.recovered:  # the restart after a crash: the cut turn was resumed and answered
            print("\n[host] recovered; nothing is owed")
            return
        await host.turn("What is this project? Read README.md.")
        await host.turn("Run the test suite.")
        await host.turn("Build it and tell me when it is done.")
    print("\n[host] done; nothing is owed")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], "--crash" in sys.argv[2:])
