"""The embedding example in README.md runs as written (in a temp directory)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_embedding_example_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "README.md should hold exactly one python example"
    code = blocks[0]
    assert len([line for line in code.splitlines() if line.strip()]) <= 20
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(README.parent)}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "<AgentSession s1 idle>" in done.stdout  # settled: nothing owed, queued or running
    assert (tmp_path / "agent.db").exists()
