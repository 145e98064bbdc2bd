"""Which SPEC.md rules have a test named after them.

Every rule id in ../shared/SPEC.md (``MQ-7``, ``ST-4``, ``R21``, ``OP-3`` ...) is matched to
the tests whose names carry it (``test_mq7_...``, ``test_r21_...``). The coverage table is
printed on every run (``pytest -s tests/test_rules.py`` shows it); a rule family, or a single
rule, that an issue has declared complete fails the run when one of its rules has no test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

#: Families whose every rule must have a named test (the issues that finished them).
COMPLETE_FAMILIES = frozenset({"MQ", "SM", "OP"})
#: Single rules finished ahead of their family: the queue side of R31, R62, R63 (issue 2); the
#: stream side of R5, R15, R16, R37-R39, R46, R59, R60, R65 (issue 3); AS-1..AS-31,
#: ST-1..ST-14 and the session's R rules of the walking skeleton (issue 4); PS-6 and R61, the
#: startup recovery of owed cuts (issue 6).
_SKELETON_R = (1, 2, 3, 4, 6, 7, 9, 11, 14, 15, 18, 19, 20, 21, 22, 25, 26, 27, 32, 34, 35)
_SKELETON_R_MORE = (42, 43, 45, 53, 56, 63, 64, 65)
COMPLETE_RULES = frozenset(
    {"R31", "R62", "R63", "R5", "R15", "R16", "R37", "R38", "R39", "R46", "R59", "R60", "R65"}
    | {f"AS-{n}" for n in range(1, 32)}
    | {f"ST-{n}" for n in range(1, 15)}
    | {f"R{n}" for n in (*_SKELETON_R, *_SKELETON_R_MORE)}
    | {"PS-6", "R61"}
)

_RULE = re.compile(r"\*\*((?:SM|MQ|AS|ST|TD|PS|OP)-\d+|R\d+)\*\*")
_TEST_TAG = re.compile(r"(?:^|_)(sm|mq|as|st|td|ps|op|r)(\d+)(?=_|$)")


def _spec_path() -> Path:
    for candidate in (ROOT.parent / "shared" / "SPEC.md", ROOT / "shared" / "SPEC.md"):
        if candidate.is_file():
            return candidate
    pytest.fail("../shared/SPEC.md is not beside this checkout: rule coverage cannot be checked")


def spec_rules(text: str) -> list[str]:
    """Rule ids in the order SPEC.md defines them (each bolded where it is stated)."""
    seen: dict[str, None] = {}
    for match in _RULE.finditer(text):
        seen.setdefault(match.group(1), None)
    return list(seen)


def rule_of(tag: str, number: str) -> str:
    return f"R{int(number)}" if tag == "r" else f"{tag.upper()}-{int(number)}"


def rules_with_tests() -> dict[str, list[str]]:
    """Rule id -> the test functions whose names carry it."""
    found: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test_"
            ):
                for tag, number in _TEST_TAG.findall(node.name[len("test_") :]):
                    found.setdefault(rule_of(tag, number), []).append(node.name)
    return found


def family(rule: str) -> str:
    return "R" if rule.startswith("R") else rule.split("-")[0]


def test_rule_coverage() -> None:
    rules = spec_rules(_spec_path().read_text(encoding="utf-8"))
    assert len(rules) > 100, "SPEC.md's rule ids were not found; has its format changed?"
    tested = rules_with_tests()
    lines = []
    for fam in ("SM", "MQ", "AS", "ST", "TD", "PS", "R", "OP"):
        ids = [r for r in rules if family(r) == fam]
        have = [r for r in ids if r in tested]
        missing = [r for r in ids if r not in tested]
        lines.append(f"{fam:>2}: {len(have)}/{len(ids)} tested; missing: {' '.join(missing)}")
    print("\nrule coverage\n" + "\n".join(lines))

    required = [r for r in rules if family(r) in COMPLETE_FAMILIES or r in COMPLETE_RULES]
    untested = [r for r in required if r not in tested]
    assert not untested, f"rules declared complete but without a named test: {untested}"


def test_rule_tags_name_real_rules() -> None:
    """A test named after a rule SPEC.md does not have is a typo that hides a missing test."""
    rules = set(spec_rules(_spec_path().read_text(encoding="utf-8")))
    unknown = {rule: names for rule, names in rules_with_tests().items() if rule not in rules}
    assert not unknown, f"tests named after rules SPEC.md does not define: {unknown}"
