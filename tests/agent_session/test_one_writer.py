"""Decide, persist, tell: the machine decides every durable write; one writer performs it.

``agent_session._writer`` is the only module of ``agent_session`` that calls a store's
``commit``: the send pipeline, the launcher, the session shell and the engine reach the store
through it, and the turn machine's ``Commit`` effects are how a session asks for a write. The
test reads the source, so a new ``commit`` call anywhere else fails the build. (The harness's
store fakes, ``agent_session/harness``, implement the store port: they are stores, not writers.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import agent_session

ROOT = Path(agent_session.__file__).parent
WRITER = ROOT / "_writer.py"


def _commit_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "commit"
    ]


def test_only_the_writer_calls_commit() -> None:
    engine_modules = [p for p in ROOT.glob("*.py") if p != WRITER]
    assert len(engine_modules) > 10  # the package's modules, not an empty glob
    calls = {f"{path.name}:{line}" for path in engine_modules for line in _commit_calls(path)}
    assert calls == set(), f"commit called outside agent_session/_writer.py: {sorted(calls)}"
    assert _commit_calls(WRITER), "the writer no longer commits: the test reads the wrong place"


def test_the_check_sees_a_commit_call(tmp_path: Path) -> None:
    """The check itself: a module that commits is found (so an empty result means none)."""
    module = tmp_path / "m.py"
    module.write_text("async def f(s, b):\n    await s._store.commit(b)\n", encoding="utf-8")
    assert _commit_calls(module) == [2]
