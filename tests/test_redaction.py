"""The redactor (``stream_manager.redaction``): every credential shape goes, ordinary text stays.

Every row of ``SHAPES`` is a case (its fake sample becomes its expected text), plus more
positive rows per shape and negative rows that must pass unchanged. Redaction is idempotent,
never raises, and is linear on hostile input (a size-bounded sanity case, no timing assert).
The log filter is installed on every turnkeeper logger the packages create.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import stream_manager
from stream_manager import REDACTED, redact
from stream_manager.redaction import LOGGERS, SHAPES, RedactingFilter

ROOT = Path(__file__).resolve().parent.parent

#: The part of each ``SHAPES`` sample that must be gone once redacted (the leak tests plant
#: the samples and look for these).
SECRETS: dict[str, str] = {
    "pem-private-key": "FAKE==",
    "authorization-header": "FAKE-token-0000",
    "cookie-header": "sid=FAKE0000",
    "url-credentials": "FAKEpass0000",
    "key-value": "fake pass 0000",
    "bearer": "FAKE0000token",
    "github": "ghp_FAKE",
    "gitlab": "glpat-FAKE",
    "aws-access-key-id": "AKIAFAKE",
    "slack-token": "xoxb-0000",
    "slack-webhook": "TFAKE/BFAKE",
    "stripe": "sk_live_FAKE",
    "openai-anthropic": "api03-FAKE",
    "google-api-key": "AIzaFAKE",
    "jwt": "eyJzdWIiOiJmYWtlIn0",
    "npm": "npm_FAKE",
    "pypi": "pypi-AgEIFAKE",
    "sendgrid": "SG.FAKE",
    "twilio": "SK0000000000",
    "huggingface": "hf_FAKE",
}

_FAKE40 = "FAKEfake" * 5  # 40 characters, like an AWS secret access key

#: More positive rows: (text, expected).
MORE: list[tuple[str, str]] = [
    ("Authorization: Basic ZmFrZTpmYWtl", "Authorization: Basic [redacted]"),
    ("authorization=Token FAKE0000", "authorization=Token [redacted]"),
    ("Authorization: FAKE0000", "Authorization: [redacted]"),
    ('{"Authorization": "Bearer FAKE.0000"}', '{"Authorization": "Bearer [redacted]"}'),
    ("Proxy-Authorization: Basic ZmFrZQ==", "Proxy-Authorization: Basic [redacted]"),
    ("got BEARER FAKE0000 back", "got BEARER [redacted] back"),
    ("bearer fakefakefakefakefakefake", "bearer [redacted]"),
    ("password=FAKE0000", "password=[redacted]"),
    ("DB_PASSWORD=FAKE0000 next", "DB_PASSWORD=[redacted] next"),
    ("passwd: FAKE0000", "passwd: [redacted]"),
    ("pwd=FAKE0000", "pwd=[redacted]"),
    ("secret = FAKE0000", "secret = [redacted]"),
    ("client_secret=FAKE0000&x=1", "client_secret=[redacted]&x=1"),
    ("?api_key=FAKE0000&page=2", "?api_key=[redacted]&page=2"),
    ("apikey: FAKE0000", "apikey: [redacted]"),
    ("X-Api-Key: FAKE0000", "X-Api-Key: [redacted]"),
    (
        '{"access_token":"FAKE0000","expires_in":3600}',
        '{"access_token":"[redacted]","expires_in":3600}',
    ),
    ("refresh_token='FAKE 0000'", "refresh_token='[redacted]'"),
    ("token=FAKE0000", "token=[redacted]"),
    ("auth: FAKE0000", "auth: [redacted]"),
    ("session=FAKE0000; path=/", "session=[redacted]; path=/"),
    ("sessionid=FAKE0000", "sessionid=[redacted]"),
    ("private_key: FAKE0000", "private_key: [redacted]"),
    ('"password": "fake \\" quoted"', '"password": "[redacted]"'),
    ('password: "unclosed fake value', 'password: "[redacted]'),
    ("Set-Cookie: sid=FAKE0000; HttpOnly", "Set-Cookie: [redacted]"),
    ('{"cookie": "sid=FAKE0000"}', '{"cookie": "[redacted]"}'),
    (f"aws_secret_access_key = {_FAKE40}", "aws_secret_access_key = [redacted]"),
    (f"AWS_SECRET_ACCESS_KEY={_FAKE40}", "AWS_SECRET_ACCESS_KEY=[redacted]"),
    (f'"SecretAccessKey": "{_FAKE40}"', '"SecretAccessKey": "[redacted]"'),
    ("https://user:FAKE0000@example.com/x", "https://user:[redacted]@example.com/x"),
    ("redis://:FAKE0000@cache:6379", "redis://:[redacted]@cache:6379"),
    ("git://me:FAKE@0000@host/r", "git://me:[redacted]@host/r"),
    (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nFAKE\n-----END OPENSSH PRIVATE KEY-----",
        "[redacted]",
    ),
    ("-----BEGIN PRIVATE KEY-----\nFAKE truncated", "[redacted]"),
    (
        '{"key": "-----BEGIN EC PRIVATE KEY-----\\nFAKE\\n-----END EC PRIVATE KEY-----"}',
        '{"key": "[redacted]"}',
    ),
    ("gho_" + "F" * 36, REDACTED),
    ("ghu_" + "F" * 36, REDACTED),
    ("ghs_" + "F" * 36, REDACTED),
    ("ghr_" + "F" * 36, REDACTED),
    ("github_pat_" + "FAKE_" * 12, REDACTED),
    ("ASIAFAKEFAKEFAKE0000", REDACTED),
    ("xoxp-0000-FAKEFAKE", REDACTED),
    (
        "xoxa-0000-FAKEFAKE xoxr-0000-FAKEFAKE xoxs-0000-FAKEFAKE",
        "[redacted] [redacted] [redacted]",
    ),
    ("rk_live_FAKEFAKE0000 sk_test_FAKEFAKE0000", "[redacted] [redacted]"),
    ("sk-proj-FAKEFAKEFAKE0000", REDACTED),
    ("sk-FAKEFAKEFAKE0000", REDACTED),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIwIn0.", REDACTED),
    ("twilio SKabcdef0123456789abcdef0123456789", "twilio [redacted]"),
    ("hooks.slack.com/workflows/FAKE/0000", "hooks.slack.com/[redacted]"),
]

#: Text that must pass unchanged: ids, codes, digests, paths, prose.
NEGATIVE: list[str] = [
    "",
    "s1/1/1/0",
    "s1/1/2/p0",
    "agent:r12",
    "op-start",
    "stream-error",
    "tool_error",
    "queued-message",
    "client:bash",
    "the token expired",
    "the model used 300 tokens",
    "max_tokens=100",
    "token_count: 5",
    "the bearer token was refused",
    "sessions: s1, s2",
    "session s1: 3 steps left",
    "recovery of session dev abandoned: its model is unknown",
    "author: someone",
    "OAuth: the flow failed",
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "da39a3ee5e6b4b0d3255bfef95601890afd80709",
    "/home/dev/project/src/main.py",
    "C:\\Users\\dev\\file.txt",
    "https://example.com:8080/path?q=1",
    "http://host/a@b",
    "mailto:someone@example.com",
    "model 'model' step 3 ended without a finish",
    "cancelled before it was dispatched; nothing ran",
    "task-sk-short",
    "sk-learn",
    "AKIA-not-a-key",
    "BEGIN RSA PUBLIC KEY",
    "-----BEGIN CERTIFICATE-----",
    "password",
    "password=",
    'password: ""',
    "password: [redacted]",
    "ünïcødé text ✓",
]


def test_every_shape_has_a_distinct_name_and_a_planted_secret() -> None:
    names = [shape.name for shape in SHAPES]
    assert len(set(names)) == len(names)
    assert set(SECRETS) == set(names)


@pytest.mark.parametrize("shape", SHAPES, ids=[shape.name for shape in SHAPES])
def test_each_shape_redacts_its_sample(shape: stream_manager.redaction.Shape) -> None:
    assert redact(shape.sample) == shape.expected
    assert SECRETS[shape.name] in shape.sample
    assert SECRETS[shape.name] not in redact(shape.sample)


@pytest.mark.parametrize(("text", "expected"), MORE)
def test_more_credential_shapes_are_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize("text", NEGATIVE)
def test_ordinary_text_passes_unchanged(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(
    "text", [s.sample for s in SHAPES] + [t for t, _ in MORE] + NEGATIVE, ids=repr
)
def test_redaction_is_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once) == once


def test_secrets_inside_longer_text_all_go() -> None:
    text = " | ".join(shape.sample for shape in SHAPES if "\n" not in shape.sample)
    text = text.replace("Cookie:", "cookie_")  # the cookie header takes the rest of its line
    out = redact(text)
    for name, secret in SECRETS.items():
        if name not in {"pem-private-key", "cookie-header"}:
            assert secret not in out, name


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_redaction_never_raises() -> None:
    assert redact(Unprintable()) == "<unprintable Unprintable>"
    assert (
        redact("lone \ud800 surrogate token=FAKE\udfff") == "lone \ud800 surrogate token=[redacted]"
    )
    assert redact(b"token=FAKE") == "b'token=[redacted]'"
    assert redact(None) == "None"
    assert redact(12) == "12"


@pytest.mark.parametrize(
    "hostile",
    [
        "a" * 200_000,
        "sk-" * 70_000,
        "password:" + " " * 200_000,
        "://a:" * 40_000,
        "-----BEGIN " + "A " * 100_000,
        "-----BEGIN RSA PRIVATE KEY-----" * 5_000,
        "eyJa." * 40_000,
        "bearer " * 30_000,
        "ghp_" * 50_000,
        '"password": "' + "\\\\" * 100_000,
        "token=x " * 25_000,
    ],
    ids=lambda s: repr(s[:12]),
)
def test_hostile_input_is_handled_in_one_pass(hostile: str) -> None:
    """No timing assert: the patterns are linear by construction (``make bench`` territory)."""
    out = redact(hostile)
    assert isinstance(out, str)
    assert redact(out) == out


def _turnkeeper_loggers_in_the_packages() -> set[str]:
    named = re.compile(r"""getLogger\(\s*["'](turnkeeper(?:\.\w+)*)["']""")
    found: set[str] = set()
    for package in ("agent_session", "stream_manager", "message_queue", "persistence"):
        for path in (ROOT / package).rglob("*.py"):
            found.update(named.findall(path.read_text(encoding="utf-8")))
    return found


def test_every_turnkeeper_logger_redacts_its_records() -> None:
    import agent_session  # noqa: F401  (creates the engine's loggers)

    created = _turnkeeper_loggers_in_the_packages()
    assert created, "the scan found no logger: the pattern is stale"
    assert created <= set(LOGGERS), f"add these to stream_manager.redaction.LOGGERS: {created}"
    for name in LOGGERS:
        filters = logging.getLogger(name).filters
        assert any(isinstance(f, RedactingFilter) for f in filters), name


def test_the_log_filter_redacts_message_args_and_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("turnkeeper.session")
    with caplog.at_level(logging.DEBUG, logger="turnkeeper"):
        log.warning("provider said %s", "Authorization: Bearer FAKE0000")
        try:
            raise RuntimeError("token=FAKE1111")
        except RuntimeError:
            log.exception("it failed with %r", {"password": "FAKE2222"})
        log.info("bad format %d", "token=FAKE3333")  # a broken call never raises either
    text = caplog.text
    for secret in ("FAKE0000", "FAKE1111", "FAKE2222", "FAKE3333"):
        assert secret not in text
    assert "provider said Authorization: Bearer [redacted]" in text
    assert "RuntimeError: token=[redacted]" in text  # the traceback is kept, redacted
