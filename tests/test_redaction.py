"""The redactor (``stream_manager.redaction``): every credential shape goes, ordinary text stays.

Every row of ``SHAPES`` is a case (its fake sample becomes its expected text), plus more
positive rows per shape and negative rows that must pass unchanged. Redaction is idempotent,
never raises, and is linear on hostile input (a size-bounded sanity case, no timing assert).
The log filter is installed on every turnkeeper logger the packages create.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
from pathlib import Path

import pytest

import stream_manager
from stream_manager import REDACTED, redact
from stream_manager.redaction import LIBRARY_LOGGERS, LOGGERS, SHAPES, RedactingFilter

ROOT = Path(__file__).resolve().parent.parent

#: The part of each ``SHAPES`` sample that must be gone once redacted (the leak tests plant
#: the samples and look for these).
SECRETS: dict[str, str] = {
    "pem-private-key": "FAKE==",
    "authorization-header": "FAKE-token-0000",
    "cookie-header": "sid=FAKE0000",
    "url-credentials": "FAKEpass0000",
    "key-value": "fake pass 0000",
    "key-flag": "FAKEpass0000",
    "spaced-key": "/FAKEfake0000",
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
        "-eyJ" * 50_000,
        "u-eyJa.eyJ" * 20_000,
        "--password " * 20_000,
        "aws_secret_access_key " * 10_000,
        "x_ghp_" * 30_000,
        "keyAKIA" * 30_000,
        "-SG." * 50_000,
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


# --- Every claimed alternative, positive and negative -------------------------------------------
# Written out here, not read from the redactor: a name dropped from one of its tables (or from a
# pattern) fails a row below; ``test_each_table_of_the_redactor_is_claimed`` makes a name added
# there get its rows here.

#: The key-value shape's key names (``docs/trace.md``); ``_`` stands for ``_``, ``-`` or nothing.
CLAIMED_KEYS = (
    "aws_secret_access_key",
    "secret_access_key",
    "aws_secret_key",
    "client_secret",
    "api_key",
    "access_token",
    "refresh_token",
    "id_token",
    "auth_token",
    "private_key",
    "session_id",
    "session",
    "set_cookie",
    "cookie",
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "secret",
    "token",
    "auth",
)
#: Keys whose value goes after a space too (identifiers, not words of prose).
CLAIMED_SPACED_KEYS = (
    "aws_secret_access_key",
    "secret_access_key",
    "aws_secret_key",
    "client_secret",
    "api_key",
    "access_token",
    "refresh_token",
    "id_token",
    "auth_token",
    "private_key",
)
CLAIMED_SCHEMES = ("bearer", "basic", "token", "digest", "negotiate", "apikey")
CLAIMED_AUTH_HEADERS = ("authorization", "proxy-authorization")
CLAIMED_COOKIE_HEADERS = ("set-cookie", "cookie")


def _spellings(key: str) -> list[str]:
    """``api_key`` as written in code, in an environment, as a flag, in camel case."""
    words = key.split("_")
    return sorted({key, key.upper(), "-".join(words), "".join(w.title() for w in words)})


def _key_rows() -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for key in CLAIMED_KEYS:
        flag = key.replace("_", "-")
        rows += [(f"{s}=FAKE0000 next", f"{s}=[redacted] next") for s in _spellings(key)]
        rows += [
            (f'{{"{key}": "fake 0000"}}', f'{{"{key}": "[redacted]"}}'),
            (f"x {flag}: FAKE0000", f"x {flag}: [redacted]"),
            (f"run --{flag} FAKE0000 --json", f"run --{flag} [redacted] --json"),
            (f"run -{flag} 'fake 0000'", f"run -{flag} '[redacted]'"),
            (f"--{key} FAKE0000", f"--{key} [redacted]"),
            (f"--{flag.upper()} FAKE0000", f"--{flag.upper()} [redacted]"),
            (f'--{flag} "fake \\" 0000"', f'--{flag} "[redacted]"'),
        ]
    for key in CLAIMED_SPACED_KEYS:
        rows += [
            (f"{key} FAKE/0000+fake next", f"{key} [redacted] next"),
            (f"{key.upper()}\t{'F' * 24}", f"{key.upper()}\t[redacted]"),
            (f"{key.replace('_', '-')} FAKE/0000", f"{key.replace('_', '-')} [redacted]"),
        ]
    return rows


def _key_negative_rows() -> list[str]:
    rows: list[str] = []
    for key in CLAIMED_KEYS:
        flag = key.replace("_", "-")
        rows += [
            f"the {key} is missing",
            f"the {key} expired",
            f"{key}=",
            f"--{flag}",
            f"--{flag} --json",
            f"--{flag}-file /run/x",
            f"--no-{flag} 0000",
            f"{key}s 0000",  # another word
        ]
    return rows


def _header_rows() -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for header in CLAIMED_AUTH_HEADERS:
        for scheme in CLAIMED_SCHEMES:
            spelled = (scheme, scheme.title(), scheme.upper())
            rows += [(f"{header}: {s} FAKE0000", f"{header}: {s} [redacted]") for s in spelled]
            quoted = f'{{"{header.title()}": "{scheme} '
            rows.append((quoted + 'FAKE0000"}', quoted + '[redacted]"}'))
        rows.append((f"{header.upper()}=FAKE0000", f"{header.upper()}=[redacted]"))
    for header in CLAIMED_COOKIE_HEADERS:
        rows += [(f"{h}: sid=FAKE0000; x=1", f"{h}: [redacted]") for h in (header, header.title())]
    rows += [
        ("{'Authorization': 'Bearer FAKE0000'}", "{'Authorization': 'Bearer [redacted]'}"),
        ("{'authorization': 'FAKE0000'}", "{'authorization': '[redacted]'}"),
        ("bearer=FAKE0000", "bearer=[redacted]"),
        ("bearer: FAKE.0000", "bearer: [redacted]"),
    ]
    return rows


def _header_negative_rows() -> list[str]:
    rows = [f"the {scheme} scheme is not supported" for scheme in CLAIMED_SCHEMES]
    rows += [f"{header} failed" for header in CLAIMED_AUTH_HEADERS + CLAIMED_COOKIE_HEADERS]
    rows += [f"no {header} header sent" for header in CLAIMED_AUTH_HEADERS + CLAIMED_COOKIE_HEADERS]
    return rows


_JWT = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJmYWtlIn0.FAKEsig"
_GH = "FAKE" * 9

#: Tokens glued behind an id's prefix, and flags whose value follows a space.
GLUED: list[tuple[str, str]] = [
    (f"id u-{_JWT} x", "id u-[redacted] x"),
    (f"user-1234_{_JWT}", "user-1234_[redacted]"),
    (f"x_ghp_{_GH}", "x_[redacted]"),
    (f"ref-gho_{_GH}", "ref-[redacted]"),
    (f"a_github_pat_{_GH}", "a_[redacted]"),
    ("keyAKIAFAKEFAKEFAKE0000", "key[redacted]"),
    ("id_ASIAFAKEFAKEFAKE0000 x", "id_[redacted] x"),
    ("9AKIAFAKEFAKEFAKE0000", "9[redacted]"),
    ("ci_glpat-FAKEFAKEFAKEFAKE0000", "ci_[redacted]"),
    ("bot-xoxb-0000-FAKE-FAKEFAKE", "bot-[redacted]"),
    ("pay_sk_live_FAKEFAKEFAKE0000", "pay_[redacted]"),
    ("cfg_sk-proj-FAKEFAKEFAKE0000", "cfg_[redacted]"),
    ("k-AIzaFAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE000", "k-[redacted]"),
    ("u_npm_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000", "u_[redacted]"),
    ("t-pypi-AgEIFAKEFAKEFAKEFAKEFAKE0000", "t-[redacted]"),
    ("m_SG.FAKEFAKEFAKEFAKE00.FAKEFAKEFAKEFAKEFAKE00", "m_[redacted]"),
    ("tok_hf_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE00", "tok_[redacted]"),
    ("mysql -u root --password FAKE0000 db", "mysql -u root --password [redacted] db"),
    ("--api-key FAKE0000", "--api-key [redacted]"),
    ("--token  FAKE0000", "--token  [redacted]"),
    ('--password "fake 0000"', '--password "[redacted]"'),
    (f"aws_secret_access_key {_FAKE40}", "aws_secret_access_key [redacted]"),
    (f"AWS_SECRET_ACCESS_KEY\t{_FAKE40}\nregion x", "AWS_SECRET_ACCESS_KEY\t[redacted]\nregion x"),
    ("hooks.slack.com/triggers/FAKE/0000", "hooks.slack.com/[redacted]"),
    ("-----BEGIN PGP PRIVATE KEY BLOCK-----\nFAKE\n-----END PGP PRIVATE KEY BLOCK-----", REDACTED),
    ("rk_test_FAKEFAKE0000", REDACTED),
]

#: Near misses of the glued and spaced forms: ordinary words, ids and digests stay.
GLUED_NEGATIVE: list[str] = [
    "skip",
    "keyboard",
    "sklearn",
    "desk-lamp-controller-v2",
    "risk-assessment-report",
    "task-sk-short",
    "x_ghp_short",
    "keyAKIAFAKE",
    "keyAKIAFAKEFAKEFAKE0000X",
    "ticket-eyJ",
    "user_eyJhbGciOiJub25lIn0",
    "MSG.FAKEFAKEFAKEFAKE00.FAKEFAKEFAKEFAKEFAKE00",
    "myhf_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE00",
    "commit 5d41402abc4b2a76b9719d911017c592 and e3b0c44298fc1c149afbf4c8996fb924",
    "s1-u-1/2/3",
    "use --password-file to set one",
    "the api_key header was missing",
    "the access_token expired.",
]


@pytest.mark.parametrize(("text", "expected"), _key_rows() + _header_rows() + GLUED, ids=repr)
def test_every_claimed_key_scheme_and_glued_shape_is_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert redact(expected) == expected


@pytest.mark.parametrize("text", _key_negative_rows() + _header_negative_rows() + GLUED_NEGATIVE)
def test_near_misses_of_every_claimed_key_and_scheme_pass_unchanged(text: str) -> None:
    assert redact(text) == text


def test_each_table_of_the_redactor_is_claimed() -> None:
    from stream_manager import redaction

    assert redaction.KEYS == CLAIMED_KEYS
    assert redaction.SPACED_KEYS == CLAIMED_SPACED_KEYS
    assert redaction.AUTH_SCHEMES == CLAIMED_SCHEMES
    assert redaction.AUTH_HEADERS == CLAIMED_AUTH_HEADERS
    assert redaction.COOKIE_HEADERS == CLAIMED_COOKIE_HEADERS


def _record(**fields: object) -> logging.LogRecord:
    record = logging.LogRecord("turnkeeper.session", logging.ERROR, __file__, 1, "m", None, None)
    record.__dict__.update(fields)
    return record


@pytest.mark.parametrize(
    ("fields", "kept"),
    [
        ({"msg": "said token=FAKE0001"}, "msg"),
        ({"msg": "said %s", "args": ("token=FAKE0002",)}, "msg"),
        ({"msg": "said %(x)s", "args": {"x": "token=FAKE0003"}}, "msg"),
        ({"exc_text": "Traceback\nValueError: token=FAKE0004\n"}, "exc_text"),
        ({"stack_info": "Stack (most recent call last):\n  token=FAKE0005"}, "stack_info"),
    ],
    ids=["msg", "args", "mapping-args", "exc_text", "stack_info"],
)
def test_the_log_filter_redacts_each_part_of_a_record(fields: dict[str, object], kept: str) -> None:
    record = _record(**fields)
    assert RedactingFilter().filter(record) is True
    assert record.args is None
    assert "FAKE" not in f"{record.msg} {record.exc_text} {record.stack_info}"
    assert "token=[redacted]" in str(getattr(record, kept))


def test_the_log_filter_formats_exc_info_redacted_and_drops_the_exception() -> None:
    try:
        raise ValueError("token=FAKE0006")
    except ValueError:
        record = _record(exc_info=sys.exc_info())
    RedactingFilter().filter(record)
    assert record.exc_info is None
    assert record.exc_text is not None
    assert record.exc_text.endswith("ValueError: token=[redacted]")


def test_the_libraries_loggers_are_quiet_and_name_calls_only() -> None:
    from persistence._logging import CallNames

    aiosqlite = logging.getLogger("aiosqlite")
    kinds = [type(f) for f in aiosqlite.filters]
    assert kinds.index(CallNames) < kinds.index(RedactingFilter)  # arguments go before formatting
    record = logging.LogRecord(
        "aiosqlite",
        logging.DEBUG,
        __file__,
        1,
        "executing %s",
        (functools.partial(print, "owner-7f3a", "body"),),
        None,
    )
    CallNames().filter(record)
    assert record.getMessage() == "executing print"
    assert LIBRARY_LOGGERS == ("aiosqlite", "psycopg")
