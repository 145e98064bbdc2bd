"""Rule coverage and rule citations, against the catalogue in ``docs/rules.md``.

Every rule id the catalogue defines (``MQ-7``, ``ST-4``, ``R21``, ``OP-3`` ...) is matched to
the tests whose names carry it (``test_mq7_...``, ``test_r21_...``). The coverage table is
printed on every run (``pytest -s tests/test_rules.py`` shows it); a rule family, or a single
rule, that an issue has declared complete fails the run when one of its rules has no test.

Ids cited anywhere else must be defined by the catalogue: in test names, and in the Python
files (comments, docstrings, messages) of the packages and the tests, the docs and the README
files. A citation is ``SM|MQ|AS|ST|TD|PS|OP|LS`` + ``-`` + a number, or ``R`` + a number, as a
word of its own. Two exclusions, documented in ``docs/rules.md``: an id right after a letter
and a hyphen is part of a longer name (``S-OP-3``), and an id that is a whole quoted string
(``"R1"``) is a value (the queue tests name entries ``R1``, ``R2``), not a citation.

Nothing here reads outside the checkout.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
CATALOGUE = ROOT / "docs" / "rules.md"

#: The families, in the order the catalogue and the coverage table list them.
FAMILIES = ("SM", "MQ", "AS", "ST", "TD", "PS", "R", "OP", "LS")
#: How many rules each family has (195 in all): a row lost from the catalogue fails the run.
#: A new rule is added here and in ``docs/rules.md`` together.
FAMILY_SIZES = {
    "SM": 20,
    "MQ": 16,
    "AS": 37,
    "ST": 16,
    "TD": 11,
    "PS": 8,
    "R": 65,
    "OP": 12,
    "LS": 11,
}

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

#: Where the citation check looks: Python files under these folders ...
CITING_PACKAGES = ("agent_session", "stream_manager", "message_queue", "persistence", "bench")
#: ... and these docs.
DOC_SUFFIXES = (".md", ".toml")

_ID = r"(?:(?:SM|MQ|AS|ST|TD|PS|OP|LS)-\d+|R\d+)"
#: A catalogue row: ``| **MQ-7** | what it says | where |`` (ids without zero padding).
_ROW = re.compile(
    r"^\| \*\*(?P<id>(?:(?:SM|MQ|AS|ST|TD|PS|OP|LS)-|R)[1-9]\d*)\*\* \|"
    r"(?P<text>[^|]+)\|(?P<where>[^|]+)\|\s*$"
)
#: A rule citation (see the module docstring for the two exclusions).
_CITED = re.compile(r"(?<!\w)(?<![A-Za-z]-)" + _ID + r"\b")
_QUOTES = frozenset("\"'")
_PATH = re.compile(r"`([\w/.]+\.py)`")
_TEST_TAG = re.compile(r"(?:^|_)(sm|mq|as|st|td|ps|op|ls|r)(\d+)(?=_|$)")


@dataclass(frozen=True, slots=True)
class Rule:
    """One catalogue row."""

    id: str
    text: str
    where: str
    line: int

    @property
    def family(self) -> str:
        return family(self.id)

    @property
    def number(self) -> int:
        return int(self.id.removeprefix("R").split("-")[-1])

    @property
    def not_built(self) -> bool:
        return self.where.startswith("not built yet")

    @property
    def superseded(self) -> bool:
        return self.where.startswith("superseded by ")


def family(rule: str) -> str:
    return "R" if rule.startswith("R") else rule.split("-")[0]


def parse_catalogue(text: str) -> list[Rule]:
    """The catalogue's rules in the order it lists them.

    Raises:
        AssertionError: a row that starts like a rule and does not fit the format.
    """
    rules: list[Rule] = []
    in_code = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code or not line.startswith("| **"):
            continue
        match = _ROW.match(line)
        assert match is not None, f"docs/rules.md:{number}: not a catalogue row: {line[:80]!r}"
        rules.append(
            Rule(
                id=match["id"],
                text=match["text"].strip(),
                where=match["where"].strip(),
                line=number,
            )
        )
    return rules


def catalogue() -> list[Rule]:
    assert CATALOGUE.is_file(), "docs/rules.md is missing: the rule catalogue lives there"
    rules = parse_catalogue(CATALOGUE.read_text(encoding="utf-8"))
    assert len(rules) > 100, "docs/rules.md defines too few rules; has its format changed?"
    return rules


def rule_ids() -> set[str]:
    return {rule.id for rule in catalogue()}


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


def citing_files() -> list[Path]:
    """Every file whose rule citations must name catalogued rules."""
    files: list[Path] = []
    for folder in (*CITING_PACKAGES, "tests"):
        files.extend(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)
        files.extend((ROOT / folder).rglob("README.md"))
    files.extend(p for p in (ROOT / "docs").rglob("*") if p.suffix in DOC_SUFFIXES)
    files.append(ROOT / "README.md")
    return sorted(p for p in set(files) if p.is_file())


def citations(text: str) -> list[tuple[int, str]]:
    """``(line, id)`` for every rule citation in ``text``."""
    found: list[tuple[int, str]] = []
    for match in _CITED.finditer(text):
        start, end = match.span()
        before = text[start - 1] if start else ""
        if before in _QUOTES and text[end : end + 1] == before:
            continue  # a quoted value such as an entry named "R1"
        found.append((text.count("\n", 0, start) + 1, match.group()))
    return found


# ---------------------------------------------------------------- the catalogue


def test_catalogue_numbers_every_family_without_gaps() -> None:
    """Each family runs 1..n in order, once each: a lost, repeated or extra row shows up here."""
    rules = catalogue()
    assert {rule.family for rule in rules} == set(FAMILIES)
    for fam in FAMILIES:
        numbers = [rule.number for rule in rules if rule.family == fam]
        expected = list(range(1, FAMILY_SIZES[fam] + 1))
        assert numbers == expected, f"{fam} numbering in docs/rules.md: {numbers}"


def test_catalogue_places_exist() -> None:
    """Every module a row names exists, and a built rule names at least one."""
    problems = []
    for rule in catalogue():
        paths = _PATH.findall(rule.where)
        problems += [f"{rule.id}: {p}" for p in paths if not (ROOT / p).is_file()]
        if not (rule.not_built or rule.superseded or paths):
            problems.append(f"{rule.id}: names no module and is not marked 'not built yet'")
    assert not problems, f"docs/rules.md, Where column: {problems}"


# ---------------------------------------------------------------- coverage


def test_rule_coverage() -> None:
    rules = catalogue()
    tested = rules_with_tests()
    lines = []
    for fam in FAMILIES:
        ids = [r for r in rules if r.family == fam]
        have = [r.id for r in ids if r.id in tested]
        missing = [r.id for r in ids if r.id not in tested]
        not_built = sum(r.not_built for r in ids)
        lines.append(
            f"{fam:>2}: {len(have)}/{len(ids)} tested ({not_built} not built); "
            f"missing: {' '.join(missing)}"
        )
    print("\nrule coverage\n" + "\n".join(lines))

    required = [r for r in rules if r.family in COMPLETE_FAMILIES or r.id in COMPLETE_RULES]
    untested = [r.id for r in required if r.id not in tested]
    assert not untested, f"rules declared complete but without a named test: {untested}"
    unbuilt = [r.id for r in required if r.not_built]
    assert not unbuilt, f"rules declared complete but marked not built in docs/rules.md: {unbuilt}"


def test_rule_tags_name_real_rules() -> None:
    """A test named after a rule the catalogue does not have is a typo that hides a missing test."""
    rules = rule_ids()
    unknown = {rule: names for rule, names in rules_with_tests().items() if rule not in rules}
    assert not unknown, f"tests named after rules docs/rules.md does not define: {unknown}"


def test_cited_rules_are_defined() -> None:
    """Comments, docstrings and docs cite only rules the catalogue defines (``ST-4``, with no
    leading zero; a scenario's number is not a rule id)."""
    rules = rule_ids()
    files = citing_files()
    assert ROOT / "README.md" in files
    assert CATALOGUE in files
    unknown = [
        f"{path.relative_to(ROOT)}:{line}: {rule}"
        for path in files
        for line, rule in citations(path.read_text(encoding="utf-8"))
        if rule not in rules
    ]
    assert not unknown, "rule ids docs/rules.md does not define:\n" + "\n".join(unknown)


def test_citation_pattern() -> None:
    """What the citation check counts as a rule id, and what it leaves alone."""
    padded = "ST-0" + "4"  # spelled in two halves: this file is checked too
    text = f'see MQ-7, {padded} and R21; R37-R39\nS-OP-3, "R1", f"R65: no", test_r21_x, XR2, R2D2'
    assert citations(text) == [
        (1, "MQ-7"),
        (1, padded),
        (1, "R21"),
        (1, "R37"),
        (1, "R39"),
        (2, "R65"),
    ]
