"""``run`` and ``demo`` print nothing that looks like a credential (``docs/trace.md``).

A planted token of three shapes (a GitHub token, an AWS access key id, a JWT) as an unknown
key, inside a value long enough to be cut short, and in a scenario's name never reaches
stdout or stderr, the ``--json`` summary included; the rest of each line still says what
was wrong. Values are redacted before they are cut: a token cut in half no longer matches its
shape, so cutting first would leave its first half readable.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_session.cli import main

GITHUB = "ghp_" + "Q7xJ2m4N8p3R" * 3  # 36 characters after the prefix
AWS = "AKIA" + "Q7XJ2M4N8P3R5T6V"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwbGFudGVkIn0.c2lnbmF0dXJlLXBsYW50ZWQ"
SECRETS = (GITHUB, AWS, JWT)

BASIC = {
    "name": "basic",
    "models": [{"id": "m"}],
    "tools": [{"name": "bash"}],
    "sessions": [{"id": "s1", "model": "m"}],
    "scripts": {"m": {"steps": [{"tool_calls": [{"tool": "bash"}]}, {"text": "done"}]}},
    "actions": [{"at": "start", "do": {"op": "send", "session": "s1", "text": "go"}}],
}


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], data: object, *flags: str) -> str:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    main(["run", "--memory", *flags, str(path)])
    captured = capsys.readouterr()
    return captured.out + captured.err


def assert_no_secret(output: str) -> None:
    for secret in SECRETS:
        for start in range(0, len(secret) - 8, 4):  # no piece of it either
            assert secret[start : start + 8] not in output, (secret, output)


@pytest.mark.parametrize("secret", SECRETS)
def test_an_unknown_key_that_is_a_credential_is_redacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], secret: str
) -> None:
    output = run(tmp_path, capsys, {**BASIC, secret: 1})
    assert_no_secret(output)
    assert "unknown key '[redacted]'" in output


def test_a_long_key_is_redacted_before_it_is_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = "k" * 69 + "-" + GITHUB  # the cut at 80 characters falls inside the token
    output = run(tmp_path, capsys, {**BASIC, key: 1})
    assert_no_secret(output)
    assert "unknown key" in output


@pytest.mark.parametrize("secret", SECRETS)
def test_a_long_value_is_redacted_before_it_is_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], secret: str
) -> None:
    value = "x" * 20 + " " + secret + " and more"  # echoed cut to 37 characters
    output = run(tmp_path, capsys, {**BASIC, "engine": {"max_stream_steps": value}})
    assert_no_secret(output)
    assert "$.engine.max_stream_steps: should be an integer, got 'xxxxxxxxxx" in output


@pytest.mark.parametrize("flags", [(), ("--json",)])
def test_a_scenario_name_is_redacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...]
) -> None:
    data = {**BASIC, "name": f"deploy with {AWS} and {GITHUB} and {JWT}"}
    output = run(tmp_path, capsys, data, *flags)
    assert_no_secret(output)
    assert "deploy with [redacted] and [redacted] and [redacted]" in output


def test_a_failing_scenario_name_is_redacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = {**BASIC, "name": f"deploy {GITHUB}", "expect": {"streams": {"s1": 7}}}
    output = run(tmp_path, capsys, data)
    assert_no_secret(output)
    assert "FAIL" in output
    assert "deploy [redacted]" in output


def test_demo_redacts_what_it_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / f"{AWS}.db"
    assert main(["demo", "--db", str(db), "--plain"]) == 0
    captured = capsys.readouterr()
    assert_no_secret(captured.out + captured.err)
    assert "store: " in captured.out
