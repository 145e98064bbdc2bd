"""The scenario library in docs/scenarios passes under ``turnkeeper run``, deterministically.

Every file there is an example users copy from, so every one must pass, on SQLite and in
memory, and the trace of the whole library must be the same bytes on a second run. An op that
is not built yet (``goal``) is refused with exit 2 and named, never run half-way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_session.cli import main

LIBRARY = Path(__file__).resolve().parents[2] / "docs" / "scenarios"
FILES = sorted(LIBRARY.glob("*.toml"))


def test_the_library_is_there() -> None:
    assert len(FILES) >= 15, f"expected the scenario library in {LIBRARY}"
    assert (LIBRARY / "README.md").is_file()


def test_the_readme_lists_every_file() -> None:
    readme = (LIBRARY / "README.md").read_text("utf-8")
    listed = {line.split("`")[1] for line in readme.splitlines() if line.startswith("| `")}
    assert listed == {path.name for path in FILES}


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_scenario_passes_on_sqlite(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith("PASS"), out


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_scenario_passes_in_memory(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--memory", str(path)])
    assert code == 0, capsys.readouterr().out


@pytest.mark.parametrize("store", [(), ("--memory",)], ids=["sqlite", "memory"])
def test_the_library_trace_is_byte_identical_across_runs(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    first, second = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    files = [str(path) for path in FILES]
    assert main(["run", *store, *files, "--trace", str(first)]) == 0
    assert main(["run", *store, *files, "--trace", str(second)]) == 0
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes().count(b"\n") > 400
