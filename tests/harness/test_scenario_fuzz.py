"""Fuzzing scenario documents: every input ends in exit 0, 1, 2 or 3, in bounded time.

Structure-aware: the skeletons are the library scenarios (``docs/scenarios``) parsed to
plain data; hypothesis then mutates them: a leaf replaced by another type, a huge or negative
number, a lone surrogate, an empty or very long string; a key misspelt; tool args nested
deep; the whole written as JSON, or the library's TOML text with bytes replaced (invalid
UTF-8, broken syntax). Each document goes through ``turnkeeper run``'s own coroutine under a
real-time guard: any exit code other than 0-3, a traceback, an exception or a hang fails.

``make test`` runs a bounded, derandomized sample (the ``ci`` profile);
``TURNKEEPER_FUZZ=full`` (``make fuzz``) runs 2000 examples of each.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tomllib
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_session.harness.commands import run_command

LIBRARY = Path(__file__).resolve().parents[2] / "docs" / "scenarios"
FULL = os.environ.get("TURNKEEPER_FUZZ") == "full"
EXAMPLES = 2000 if FULL else 300
#: Real seconds one input may take (a run takes milliseconds): past it, a hang.
GUARD_S = 30.0
#: Outcomes by exit code over the session, printed at its end (``-s``) for the report.
OUTCOMES: Counter[str] = Counter()

#: A failing document can be 100 kB: hypothesis then warns about the size of its report.
LARGE_REPRS = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
fuzz_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@cache
def skeletons() -> tuple[tuple[str, bytes], ...]:
    paths = sorted(LIBRARY.glob("*.toml"))
    assert len(paths) >= 15
    return tuple((path.stem, path.read_bytes()) for path in paths)


def parsed(index: int) -> Any:
    return tomllib.loads(skeletons()[index][1].decode())


def leaves(value: Any) -> list[tuple[Any, ...]]:
    """Every position in ``value`` (tables and arrays too) down to 40 levels, depth first."""
    found: list[tuple[Any, ...]] = []
    stack: list[tuple[tuple[Any, ...], Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        found.append(path)
        if len(path) >= 40:
            continue
        if isinstance(item, dict):
            stack.extend(((*path, key), child) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend(((*path, i), child) for i, child in reversed(list(enumerate(item))))
    return found


def replace(document: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    parent = document
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = new
    return document


def _at(document: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        document = document[part]
    return document


def rename(document: Any, path: tuple[Any, ...], new_key: str) -> Any:
    parent = document
    for part in path[:-1]:
        parent = parent[part]
    if isinstance(parent, dict) and path and path[-1] in parent:
        parent[new_key] = parent.pop(path[-1])
    return document


surrogates = st.sampled_from(["\ud800", "\udfff", "a\udc80b"])
odd_strings = st.one_of(
    st.just(""),
    st.just(" "),
    surrogates,
    st.text(max_size=20),
    st.integers(1, 3).map(lambda n: "x" * (10**n * 70)),  # long strings, up to 70 000 chars
)
odd_numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**63 - 1, 2**63, -(2**63) - 1, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
)
same_ints = st.one_of(
    st.sampled_from([0, 1, 2, 999, 10**6, 10**12, 2**53, 2**63 - 1]),
    st.integers(0, 10**7),
)
same_strings = st.one_of(st.text(max_size=10), st.just("x" * 100_000), st.just("  "))
odd_values = st.one_of(
    odd_strings,
    odd_numbers,
    st.booleans(),
    st.none(),
    # a fresh empty list and table each time: ``st.just([])`` hands out one shared object, which
    # a later mutation of the document writes into (hypothesis then sees flaky data generation)
    st.builds(list),
    st.builds(dict),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


def nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return value


@st.composite
def json_documents(draw: st.DrawFn) -> bytes:
    """A library scenario as JSON, mutated a few times."""
    document = parsed(draw(st.integers(0, len(skeletons()) - 1)))
    for _ in range(draw(st.integers(1, 4))):
        positions = leaves(document)
        path = draw(st.sampled_from(positions))
        how = draw(st.sampled_from(["same", "same", "value", "key", "deep", "drop"]))
        current = _at(document, path)
        if how == "same" and isinstance(current, int) and not isinstance(current, bool):
            # a valid type, an extreme value: durations, delays, limits, counts
            document = replace(document, path, draw(same_ints))
        elif how == "same" and isinstance(current, str):
            document = replace(document, path, draw(same_strings))
        elif how in ("same", "value"):
            document = replace(document, path, draw(odd_values))
        elif how == "key" and path and isinstance(path[-1], str):
            misspelt = draw(st.sampled_from([path[-1] + "s", path[-1][:-1], path[-1].upper()]))
            document = rename(document, path, misspelt or "_")
        elif how == "deep":
            depth = draw(st.sampled_from([3, 40, 63, 64, 65, 200, 3000]))
            document = replace(document, path, {"args": nested(depth)} if path else document)
            calls = [p for p in positions if p[-2:-1] == ("tool_calls",)]
            if calls:
                call = draw(st.sampled_from(calls))
                with contextlib.suppress(KeyError, IndexError, TypeError):
                    replace(document, (*call, "args"), {"a": nested(depth)})
        elif how == "drop" and path:
            parent = document
            with contextlib.suppress(KeyError, IndexError, TypeError):
                for part in path[:-1]:
                    parent = parent[part]
                del parent[path[-1]]
    try:
        text = json.dumps(document, allow_nan=True)
    except (RecursionError, ValueError):
        text = json.dumps({"name": "x", "description": "[" * 5000})
    return text.encode("utf-8", "surrogatepass")


@st.composite
def toml_documents(draw: st.DrawFn) -> bytes:
    """A library scenario's TOML text with a few bytes replaced, inserted or cut."""
    raw = bytearray(draw(st.sampled_from(skeletons()))[1])
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(raw)))
        patch = draw(
            st.one_of(
                st.binary(min_size=1, max_size=4),
                st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"[[", b"{", b"\\ud800", b'"']),
            )
        )
        if draw(st.booleans()):
            raw[at : at + len(patch)] = patch
        else:
            raw[at:at] = patch
    return bytes(raw)


def run_cli(path: Path) -> tuple[int, str]:
    """``turnkeeper run PATH --memory --json`` in-process, under the hang guard."""
    out, err = io.StringIO(), io.StringIO()

    async def guarded() -> int:
        with anyio.fail_after(GUARD_S):
            return await run_command([str(path)], None, True, None, True)

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = anyio.run(guarded)
    return code, err.getvalue() + out.getvalue()


def check(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    code, output = run_cli(path)
    OUTCOMES[f"exit {code}"] += 1
    assert code in (0, 1, 2, 3), (code, output[:2000])
    assert "Traceback" not in output, output[:2000]
    if code == 2:  # refused: one FILE: $.path: reason line per problem, each short
        lines = output.splitlines()
        assert lines, "a refusal says why"
        assert all(line.startswith(f"{path}: $") for line in lines), output[:2000]
        assert all(len(line) < 1000 for line in lines), max(len(line) for line in lines)


@LARGE_REPRS
@fuzz_settings
@given(data=json_documents())
def test_any_json_scenario_document_ends_with_an_exit_code(tmp_path: Path, data: bytes) -> None:
    check(tmp_path / "fuzz.json", data)


@LARGE_REPRS
@fuzz_settings
@given(data=toml_documents())
def test_any_toml_scenario_bytes_end_with_an_exit_code(tmp_path: Path, data: bytes) -> None:
    check(tmp_path / "fuzz.toml", data)


def test_zz_fuzz_outcomes_by_exit_code() -> None:
    """Not a check: the outcome classes of this session's fuzzing, for ``pytest -s``."""
    print("scenario fuzz outcomes:", dict(sorted(OUTCOMES.items())))
