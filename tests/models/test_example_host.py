"""docs/examples/coding_agent.py against the scripted OpenAI-compatible server, in two runs.

The first run is killed right after a cut (exit 3); the second recovers the cut turn.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

from agent_session.harness.openai_fixture import FixtureServer, TextReply, ToolCall, ToolCallsReply
from persistence import SqliteStore

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "coding_agent.py"


def calls(name: str, arguments: str, call_id: str) -> ToolCallsReply:
    return ToolCallsReply(calls=(ToolCall(id=call_id, name=name, arguments=arguments),))


async def test_the_example_host_crashes_after_a_cut_and_the_restart_recovers_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "README.md").write_text("# demo\nA tiny project.\n", encoding="utf-8")
    db = tmp_path / "agent.db"
    replies = (
        calls("read_file", '{"path": "README.md"}', "c1"),
        TextReply(chunks=("It is two ", "lines long.")),
        calls("shell", '{"command": "sleep 30"}', "c2"),
        calls("shell", '{"command": "echo built"}', "c3"),
        TextReply(chunks=("The build ", "finished.")),
    )
    async with FixtureServer(replies) as server:
        env = {
            **os.environ,
            "TURNKEEPER_BASE_URL": server.base_url,
            "TURNKEEPER_MODEL": "fixture-model",
            "AGENT_WORKSPACE": str(tmp_path),
            "PYTHONPATH": str(EXAMPLE.parents[2]),
        }
        first = await anyio.run_process(
            [sys.executable, str(EXAMPLE), str(db), "--crash"], env=env, check=False
        )
        out = first.stdout.decode()
        assert first.returncode == 3, first.stderr.decode()[-2000:]
        assert "It is two lines long." in out
        assert "cut with" in out
        second = await anyio.run_process(
            [sys.executable, str(EXAMPLE), str(db)], env=env, check=False
        )
        out2 = second.stdout.decode()
        assert second.returncode == 0, second.stderr.decode()[-2000:]
        assert "The build finished." in out2
        assert "recovered; nothing is owed" in out2
        assert server.pending == 0
        resumed = server.requests[-1]["messages"]
        assert resumed[-1]["content"] == "[CONTINUE]"
    async with SqliteStore(db) as store:
        states = sorted((r.capability.name, r.state) for r in (await store.receipts()).records)
    assert ("read_file", "completed") in states
    assert ("shell", "cancelled") in states  # the user's Stop
    assert ("shell", "completed") in states
