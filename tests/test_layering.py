"""The direction of imports (``docs/architecture.md``) and the purity of the message queue.

``agent_session`` -> ``stream_manager`` -> ``message_queue`` -> ``persistence``: a package may
import those below it, never one above. ``message_queue`` is pure: nothing that does I/O, reads
a clock or draws randomness may be imported there.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["persistence", "message_queue", "stream_manager", "agent_session"]
IMPURE = frozenset(
    {
        "anyio",
        "asyncio",
        "trio",
        "aiosqlite",
        "sqlite3",
        "time",
        "datetime",
        "random",
        "secrets",
        "uuid",
        "os",
        "io",
        "socket",
        "subprocess",
        "threading",
        "pathlib",
        "shutil",
        "tempfile",
    }
)
PURE_PACKAGES = frozenset({"message_queue"})


def imported_roots(path: Path) -> set[str]:
    """The top-level module names a file imports (absolute imports only)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def package_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", LAYERS)
def test_no_upward_import(package: str) -> None:
    above = set(LAYERS[LAYERS.index(package) + 1 :])
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_roots(path) & above)
        for path in package_files(package)
        if imported_roots(path) & above
    }
    assert not offenders, f"{package} imports a package above it: {offenders}"


@pytest.mark.parametrize("package", sorted(PURE_PACKAGES))
def test_pure_package_has_no_io_clock_or_randomness(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_roots(path) & IMPURE)
        for path in package_files(package)
        if imported_roots(path) & IMPURE
    }
    assert not offenders, f"{package} must stay pure: {offenders}"


def test_layering_check_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import agent_session\nfrom time import monotonic\n", encoding="utf-8")
    assert imported_roots(bad) == {"agent_session", "time"}


def _project_modules() -> list[str]:
    names = []
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_no_class_is_spread_across_modules_by_inheritance() -> None:
    """A module holds whole classes: no class extends one of ours from another module.

    Exceptions are the one exception (an error tree is shared on purpose); a class too big
    for its file is cut into collaborators, never split into a base in one file and its
    subclass in another.
    """
    import importlib
    import inspect

    ours = tuple(f"{package}." for package in LAYERS) + tuple(LAYERS)
    spread = [
        f"{name}.{cls_name} extends {base.__module__}.{base.__name__}"
        for name in _project_modules()
        for cls_name, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass)
        if cls.__module__ == name
        for base in cls.__bases__
        if base.__module__.startswith(ours)
        and base.__module__ != name
        and not issubclass(base, BaseException)
    ]
    assert not spread, spread
