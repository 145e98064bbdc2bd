"""One engine process of the multi-process PostgreSQL tests (``test_pg_processes.py``).

``python -m tests.pg_worker URL SESSION FIFO [--lease S]`` opens an engine on
``PostgresStore(URL)``, opens ``SESSION`` and sends it one message whose turn calls the tool
``bash``. The tool reads ``FIFO`` (a named pipe the test holds): it returns once the test
writes a line to it, and not before, so the test decides when the call ends. The process
reports on standard output, one line each, flushed: ``tool-started`` (the call's receipt is
durable and the tool runs), then ``lease-lost`` when a write of the session was fenced
(LS-3), or ``answered`` when the turn ended with the model's answer. It then closes the
engine and exits 0; ``SIGTERM`` closes it at once (a clean shutdown: its leases go back).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading
from pathlib import Path

import anyio

from agent_session import Engine, EngineConfig, EngineEvent
from agent_session._events import SessionBroken
from persistence.postgres import PostgresStore
from stream_manager import (
    ScriptedModel,
    ScriptStep,
    ScriptToolCall,
    StreamEnded,
    SystemClock,
    ToolCallPart,
    ToolContext,
    ToolKind,
    ToolResultPart,
)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class PipeTool:
    """A client tool that answers once a line can be read from ``fifo``."""

    kind = ToolKind.CLIENT

    def __init__(self, fifo: Path) -> None:
        self.name = "bash"
        self._fifo = fifo

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        say("tool-started")
        loop = asyncio.get_running_loop()
        answered = anyio.Event()
        lines: list[str] = []

        def read() -> None:  # a daemon thread: a process that closes never waits for it
            lines.append(self._fifo.read_text().strip())
            loop.call_soon_threadsafe(answered.set)

        threading.Thread(target=read, daemon=True).start()
        await answered.wait()
        return ToolResultPart(call_id=call.call_id, name=call.name, output=lines[0] or "ok")


async def main(url: str, session_id: str, fifo: Path, lease: float) -> None:
    done = anyio.Event()

    def observe(event: EngineEvent) -> None:
        if isinstance(event, SessionBroken):
            say("lease-lost" if "LeaseLost" in event.error else f"broken {event.error}")
            done.set()
        elif isinstance(event, StreamEnded) and event.session == session_id:
            say("answered")
            done.set()

    clock = SystemClock()
    steps = [
        ScriptStep(tool_calls=(ScriptToolCall(tool="bash"),)),
        ScriptStep(text="the worker's answer"),
    ]
    engine = Engine(
        store=PostgresStore(url, lease=lease),
        models={"M": ScriptedModel("M", steps, clock=clock)},
        tools={"bash": PipeTool(fifo)},
        clock=clock,
        config=EngineConfig(max_stream_steps=6, auto_retry=False, claim_every_s=3_600.0),
        observers=[observe],
    )
    async with engine, anyio.create_task_group() as tasks:

        async def on_sigterm() -> None:  # a clean close: the engine ends, its leases go back
            with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    done.set()
                    return

        tasks.start_soon(on_sigterm)
        session = await engine.open_session(session_id, model="M")
        await session.send("build it")
        await done.wait()
        tasks.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("session")
    parser.add_argument("fifo", type=Path)
    parser.add_argument("--lease", type=float, default=2.0)
    args = parser.parse_args()
    anyio.run(main, args.url, args.session, args.fifo, args.lease)
