"""The checkout stands alone: nothing in it reads the spec folder that sits beside it.

Two checks. A cheap one: no file of the checkout (tracked, or new and not ignored) names that
folder's relative path. A real one: the checkout's files are copied to a temporary folder with
nothing beside it, and the scenario library, the loader's library check and the rule coverage
run there, with this interpreter. The copy takes the working tree as it is (uncommitted work
included, deleted files left out), so the check holds for what is about to be committed. Only
a couple of the library's scenarios run in the copy, to keep this quick; the whole library runs
in ``tests/scenarios/test_library.py`` here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The spec folder's path relative to a checkout, built so this file does not contain it.
SPEC_BESIDE = "/".join(("..", "shared"))

#: What runs in the copy: the library's own checks, two scenarios (one per store), the
#: refusal of an op not built yet, the loader over every library file, the rule coverage.
LIBRARY_TESTS = "tests/scenarios/test_library.py::"
IN_THE_COPY = (
    f"{LIBRARY_TESTS}test_the_library_is_there",
    f"{LIBRARY_TESTS}test_the_readme_lists_every_file",
    f"{LIBRARY_TESTS}test_scenario_passes_in_memory[withdrawn-wake]",
    f"{LIBRARY_TESTS}test_scenario_passes_on_sqlite[crash-mid-turn]",
    f"{LIBRARY_TESTS}test_scenario_passes_on_sqlite[delegated-handle-stopped]",
    "tests/harness/test_loader.py::test_every_library_scenario_loads",
    "tests/test_rules.py",
)


def checkout_files() -> list[str]:
    """The checkout's files: tracked or untracked-but-not-ignored, as they are on disk."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing tells the checkout's files from the rest")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({name for name in listed.split("\0") if name and (ROOT / name).is_file()})


def test_no_file_names_the_spec_folder_beside_the_checkout() -> None:
    files = checkout_files()
    assert "tests/test_standalone.py" in files
    naming = [name for name in files if SPEC_BESIDE.encode() in (ROOT / name).read_bytes()]
    assert naming == [], f"these files name {SPEC_BESIDE}: {naming}"


def test_the_library_and_the_rules_pass_in_a_copy_with_nothing_beside_it(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "turnkeeper"
    for name in checkout_files():
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["turnkeeper"]
    assert not (copy / "shared").exists()

    imported = subprocess.run(
        [sys.executable, "-c", "import agent_session; print(agent_session.__file__)"],
        cwd=copy,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(imported).is_relative_to(copy), f"the copy imported {imported}"

    ran = subprocess.run(
        [sys.executable, "-m", "pytest", *IN_THE_COPY, "-q", "-p", "no:cacheprovider"],
        cwd=copy,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "passed" in ran.stdout, ran.stdout
    assert "skipped" not in ran.stdout, ran.stdout
