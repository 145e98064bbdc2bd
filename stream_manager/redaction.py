"""Redaction of values that look like credentials (``docs/trace.md``, "Redaction").

Receipts hold no arguments or outputs by construction, and events carry ids, codes and short
sentences. As a second line of defence, every string that leaves the engine as text (a trace
line, a printout, a receipt's explanation, a turnkeeper log record, the message of a
``stream-error`` event a host observer receives) passes through :func:`redact`, so a key or
token that reached a message (a provider's error quoting a header, a hand-edited row quoted in
a recovery report) never reaches a file, a terminal or a log.

:data:`SHAPES` is the table of credential shapes: each row names a shape, gives its pattern, a
sample (obviously fake) and what the sample becomes. The patterns are joined into one regular
expression; ``tests/test_redaction.py`` runs every row, plus text that must pass unchanged.
Only the groups named ``secret...`` of a match are replaced with ``[redacted]`` (a row without
one replaces the whole match), so ``Authorization: Bearer`` and a URL's scheme, user and host
stay readable.

Every pattern is safe on hostile input: a token's start is anchored by a look-behind (it cannot
start inside a run of its own characters), prefixes are bounded, and no quantified group nests
another, so one pass over a string is linear in its length.
"""

from __future__ import annotations

import functools
import logging
import re
import traceback
from typing import Final, NamedTuple

__all__ = [
    "LIBRARY_LOGGERS",
    "LOGGERS",
    "REDACTED",
    "SHAPES",
    "RedactingFilter",
    "Shape",
    "quiet_logs",
    "redact",
    "redact_logs",
]

#: What a credential becomes.
REDACTED: Final = "[redacted]"


class Shape(NamedTuple):
    """One row of the table: a credential shape, its pattern and a worked example."""

    name: str
    #: A regular expression; its groups named ``secret...`` are what is replaced.
    pattern: str
    #: An obviously fake example of the shape in context.
    sample: str
    #: ``sample`` once redacted.
    expected: str


# The families the shapes claim, declared once (``tests/test_redaction.py`` holds a positive and
# a negative row for each name). In a key name, ``_`` stands for ``_``, ``-`` or nothing, so
# ``api_key`` covers ``api-key``, ``apikey`` and ``API_KEY``.
#: Keys that are identifiers, never words of prose: their value goes after a bare space too,
#: when it looks like a credential (a digit in it, or 20 characters).
SPACED_KEYS: Final = (
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
#: The key-value shape's keys: a value after ``=`` or ``:``, or after a space behind a flag's
#: dashes (``--password VALUE``, ``-api-key VALUE``); a name before any name it contains.
KEYS: Final = (
    *SPACED_KEYS,
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
#: The schemes an ``Authorization`` header's value may start with (kept readable).
AUTH_SCHEMES: Final = ("bearer", "basic", "token", "digest", "negotiate", "apikey")
AUTH_HEADERS: Final = ("authorization", "proxy-authorization")
COOKIE_HEADERS: Final = ("set-cookie", "cookie")

# Building blocks. Each row's pattern starts with a literal character or a character class and
# checks the character before it with a look-behind only then (``X(?<!B.)``), which lets the
# regular expression engine skip a row at a glance wherever its first character is absent.
# No quantified group nests another.
_WORD = "[A-Za-z0-9]"  # a key name starts a word (``DB_PASSWORD`` and ``x-api-key`` still do)
_TOKEN = "[A-Za-z0-9_-]"  # a header name does not start inside a run of token characters
# A provider token may be glued behind an id's ``-`` or ``_`` (``x_ghp_...``, ``u-eyJ...``), not
# behind a letter or a digit (``task-sk-...`` and ``desk-...`` are words); each such token's
# body either has a bounded length or excludes the characters its start needs, so starting
# inside a run of token characters cannot rescan that run.
_GLUE = "[A-Za-z0-9]"


def _words(alternatives: tuple[str, ...] | str, before: str = _WORD) -> str:
    """Case-insensitive words (each led by a letter) not right after ``before``.

    ``_`` in a word stands for ``_``, ``-`` or nothing (``api_key``: ``api-key``, ``APIKEY``).
    """
    words = alternatives.split("|") if isinstance(alternatives, str) else list(alternatives)
    by_first: dict[str, list[str]] = {}  # in order; one look-behind per first letter
    for word in words:
        by_first.setdefault(word[0].lower(), []).append(word[1:].replace("_", "[_-]?"))
    firsts = "".join(sorted(f"{first}{first.upper()}" for first in by_first))
    rest = "|".join(f"(?<={first})(?:{'|'.join(tails)})" for first, tails in by_first.items())
    return f"[{firsts}](?<!{before}.)(?i:{rest})"


_SEP = r"""["']?[ \t]*[:=][ \t]*"""  # ``key=``, ``key: ``, ``"key": ``
# A value: double-quoted (escapes, spaces; an unclosed quote runs to the end of the line),
# single-quoted, or bare up to a space or a delimiter. ``[redacted]`` is left as it is.
_BARE = r"""[^\s"',;&)}\]<>]"""
_VALUE = (
    r"""(?:"(?P<secret_dq>(?:[^"\\\r\n]|\\.)*)"?"""
    r"""|'(?P<secret_sq>[^'\r\n]*)'?"""
    rf"""|(?!\[redacted\])(?P<secret>{_BARE}+))"""
)
# A bare value after a space that looks like a credential: a digit within its first 200
# characters, or 20 characters (``the access_token expired`` keeps its word).
_CREDENTIAL_LIKE = r"""(?=[^\s0-9"',;&)}\]<>]{0,200}[0-9]|""" + _BARE + "{20})"

#: The credential shapes, tried in this order at each position of a string.
SHAPES: Final[tuple[Shape, ...]] = (
    Shape(
        "pem-private-key",
        r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----(?:(?!-----END)[\s\S])*"
        r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----)?",
        "key:\n-----BEGIN RSA PRIVATE KEY-----\nFAKEFAKE\nFAKE==\n-----END RSA PRIVATE KEY-----\n",
        "key:\n[redacted]\n",
    ),
    Shape(
        "authorization-header",
        _words(AUTH_HEADERS, _TOKEN)
        + _SEP
        + rf"""["']?(?:(?i:{"|".join(AUTH_SCHEMES)})[ \t]+)?"""
        + r"""(?P<secret>[^\s"',;]+)""",
        "401: Authorization: Bearer FAKE-token-0000",
        "401: Authorization: Bearer [redacted]",
    ),
    Shape(
        "cookie-header",
        _words(COOKIE_HEADERS, _TOKEN) + r"[ \t]*:[ \t]*(?!\[redacted\])(?P<secret>\S[^\r\n]*)",
        "sent Cookie: sid=FAKE0000; theme=dark\nnext line",
        "sent Cookie: [redacted]\nnext line",
    ),
    Shape(
        "url-credentials",
        r"://[^\s:/?#@]*:(?P<secret>[^\s/?#]+)@",
        "cannot reach postgres://app:FAKEpass0000@db.example:5432/x",
        "cannot reach postgres://app:[redacted]@db.example:5432/x",
    ),
    Shape(
        "key-value",
        _words(KEYS) + _SEP + _VALUE,
        'bad config {"password": "fake pass 0000", "user": "me"}',
        'bad config {"password": "[redacted]", "user": "me"}',
    ),
    Shape(
        "key-flag",
        "-(?<![A-Za-z0-9_-].)-?" + _words(KEYS) + r"[ \t]+(?!-)" + _VALUE,
        "mysql -u app --password FAKEpass0000 db",
        "mysql -u app --password [redacted] db",
    ),
    Shape(
        "spaced-key",
        _words(SPACED_KEYS, "[A-Za-z0-9-]") + rf"[ \t]+(?P<secret>{_CREDENTIAL_LIKE}{_BARE}+)",
        "aws_secret_access_key FAKEfakeFAKEfake/FAKEfake0000",
        "aws_secret_access_key [redacted]",
    ),
    Shape(
        "bearer",
        _words("bearer", _TOKEN)
        + r"(?:[ \t]*[:=][ \t]*|[ \t]+)"
        + r"(?P<secret>(?=[A-Za-z]{0,200}[0-9._~+/=-]|[A-Za-z]{20})[A-Za-z0-9._~+/=-]+)",
        "retry with bearer FAKE0000token",
        "retry with bearer [redacted]",
    ),
    Shape(
        "github",
        rf"g(?<!{_GLUE}.)(?:h[pousr]_[A-Za-z0-9]{{30,}}|ithub_pat_[A-Za-z0-9_]{{30,}})",
        "push failed for ghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000",
        "push failed for [redacted]",
    ),
    Shape(
        "gitlab",
        rf"g(?<!{_GLUE}.)lpat-[A-Za-z0-9_-]{{20,}}",
        "token glpat-FAKEFAKEFAKEFAKE0000 expired",
        "token [redacted] expired",
    ),
    Shape(
        "aws-access-key-id",
        r"A(?:KIA|SIA)[A-Z0-9]{16}(?![A-Za-z0-9])",  # fixed length: glued to any prefix too
        "key AKIAFAKEFAKEFAKE0000 denied",
        "key [redacted] denied",
    ),
    Shape(
        "slack-token",
        rf"x(?<!{_GLUE}.)ox[abprs]-[A-Za-z0-9-]{{10,}}",
        "slack said no to xoxb-0000-FAKE-FAKEFAKE",
        "slack said no to [redacted]",
    ),
    Shape(
        "slack-webhook",
        r"hooks\.slack\.com/(?P<secret_hook>(?:services|workflows|triggers)/[A-Za-z0-9_/-]+)",
        "posting to https://hooks.slack.com/services/TFAKE/BFAKE/FAKEFAKE failed",
        "posting to https://hooks.slack.com/[redacted] failed",
    ),
    Shape(
        "stripe",
        rf"[rs](?<!{_GLUE}.)k_(?:live|test)_[A-Za-z0-9]{{10,}}",
        "charge with sk_live_FAKEFAKEFAKE0000 refused",
        "charge with [redacted] refused",
    ),
    Shape(
        "openai-anthropic",
        rf"s(?<!{_GLUE}.)k-[A-Za-z0-9_-]{{10,}}",
        "invalid key sk-ant-api03-FAKEFAKEFAKE0000",
        "invalid key [redacted]",
    ),
    Shape(
        "google-api-key",
        rf"A(?<!{_GLUE}.)Iza[A-Za-z0-9_-]{{35}}",
        "quota for AIzaFAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE000 hit",
        "quota for [redacted] hit",
    ),
    Shape(
        "jwt",
        # Glued behind ``-``/``_``, its first part is alphanumeric: a failed try stops at the
        # next ``-`` or ``_``, where the next glued start begins.
        r"e(?:(?<![A-Za-z0-9_-].)yJ[A-Za-z0-9_-]{4,}|(?<=[_-].)yJ[A-Za-z0-9]{4,})"
        r"\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",
        "expired: eyJhbGciOiJub25lIn0.eyJzdWIiOiJmYWtlIn0.FAKEsig",
        "expired: [redacted]",
    ),
    Shape(
        "npm",
        rf"n(?<!{_GLUE}.)pm_[A-Za-z0-9]{{30,}}",
        "publish as npm_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000",
        "publish as [redacted]",
    ),
    Shape(
        "pypi",
        rf"p(?<!{_GLUE}.)ypi-AgEI[A-Za-z0-9_-]{{20,}}",
        "upload with pypi-AgEIFAKEFAKEFAKEFAKEFAKE0000 failed",
        "upload with [redacted] failed",
    ),
    Shape(
        "sendgrid",
        rf"S(?<!{_GLUE}.)G\.[A-Za-z0-9_-]{{16,}}\.[A-Za-z0-9_-]{{16,}}",
        "mail key SG.FAKEFAKEFAKEFAKE00.FAKEFAKEFAKEFAKEFAKE00 rejected",
        "mail key [redacted] rejected",
    ),
    Shape(
        "twilio",
        r"S(?<![A-Za-z0-9].)K[0-9a-fA-F]{32}(?![A-Za-z0-9])",
        "sid SK00000000000000000000000000000000 bad",
        "sid [redacted] bad",
    ),
    Shape(
        "huggingface",
        rf"h(?<!{_GLUE}.)f_[A-Za-z0-9]{{30,}}",
        "download with hf_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE00",
        "download with [redacted]",
    ),
)


def _compile(shapes: tuple[Shape, ...]) -> tuple[re.Pattern[str], tuple[str, ...]]:
    """One alternation of every shape, each shape's ``secret...`` groups made unique."""
    branches: list[str] = []
    secrets: list[str] = []
    for index, shape in enumerate(shapes):
        body = shape.pattern
        for name in re.findall(r"\(\?P<(secret\w*)>", shape.pattern):
            body = body.replace(f"(?P<{name}>", f"(?P<s{index}_{name}>")
            secrets.append(f"s{index}_{name}")
        branches.append(body)
    return re.compile("|".join(branches)), tuple(secrets)


_PATTERN, _SECRETS = _compile(SHAPES)
#: Strings up to this length are memoised (traces repeat the same ids and sentences).
_MEMO_LENGTH = 256


def _replace(match: re.Match[str]) -> str:
    """The match with its secret groups redacted; the whole match for a shape without any."""
    spans = [span for span in map(match.span, _SECRETS) if span[0] >= 0]
    if not spans:
        return REDACTED
    text, start = match.group(), match.start()
    pieces: list[str] = []
    kept = 0
    for begin, end in spans:
        if begin < end:  # an empty value (``password=""``) has nothing to hide
            pieces += (text[kept : begin - start], REDACTED)
            kept = end - start
    pieces.append(text[kept:])
    return "".join(pieces)


@functools.lru_cache(maxsize=4096)
def _redact_short(text: str) -> str:
    return _PATTERN.sub(_replace, text)


def redact(value: object) -> str:
    """``value`` as text, with anything that looks like a credential replaced.

    Never raises: a value whose ``str`` fails becomes a placeholder naming its type, and a
    string the patterns cannot be run on (memory) becomes ``[redacted]`` as a whole.
    """
    try:
        text = value if type(value) is str else str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"
    try:
        if len(text) <= _MEMO_LENGTH:
            return _redact_short(text)
        return _PATTERN.sub(_replace, text)
    except Exception:
        return REDACTED


class RedactingFilter(logging.Filter):
    """A logger filter that redacts each record's message, traceback and stack in place.

    The message is formatted once (``msg % args``) and redacted; a traceback is formatted,
    redacted and kept as ``exc_text`` (``exc_info`` is dropped so no handler formats the raw
    exception again). The record is always let through.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact ``record``; always ``True``."""
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: keep its parts, redacted, for the reader
            message = f"{redact(record.msg)} {redact(record.args)}"
        record.msg, record.args = redact(message), None
        if record.exc_info:
            if not record.exc_text:
                try:
                    record.exc_text = "".join(traceback.format_exception(*record.exc_info))
                except Exception:
                    record.exc_text = "<traceback unavailable>"
            record.exc_info = None
        if record.exc_text:
            record.exc_text = redact(record.exc_text.rstrip("\n"))
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


#: turnkeeper's own loggers. A logger filter sees only records logged on that very logger,
#: never its children's, so each one gets the filter (``tests/test_redaction.py`` checks that
#: every ``getLogger("turnkeeper...")`` in the packages is listed here).
LOGGERS: Final = (
    "turnkeeper",
    "turnkeeper.cleanup",
    "turnkeeper.delegation",
    "turnkeeper.engine",
    "turnkeeper.operations",
    "turnkeeper.mcp",
    "turnkeeper.persistence",
    "turnkeeper.session",
    "turnkeeper.stream",
)

#: The libraries' loggers a turnkeeper process writes through. ``persistence`` keeps aiosqlite's
#: below DEBUG and strips its records' arguments (``persistence/_logging.py``) before this filter
#: runs; psycopg's (the PostgreSQL store's driver) pass the same filter; the MCP SDK's are
#: covered by ``stream_manager.mcp`` when it is imported.
LIBRARY_LOGGERS: Final = ("aiosqlite", "psycopg")

_FILTER = RedactingFilter()


def redact_logs(names: tuple[str, ...] = LOGGERS + LIBRARY_LOGGERS) -> None:
    """Install the redacting filter on each logger of ``names`` (idempotent)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(_FILTER)


def quiet_logs(names: tuple[str, ...]) -> None:
    """Keep each logger of ``names`` at ``WARNING`` unless the host gave it a level already."""
    for name in names:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def cover_library_logs(roots: tuple[str, ...]) -> None:
    """Keep a library's loggers below DEBUG and redact every record of theirs (idempotent).

    A client library's DEBUG and INFO records quote what it sends whole (a request's body, a
    streamed event, a session id), so its root loggers stay at ``WARNING`` unless the host gave
    them a level; a filter sees only its own logger's records, so each of ``roots`` and every
    logger below them that exists now gets one (call again where a library makes loggers late).
    """
    quiet_logs(roots)
    below = tuple(
        name
        for name in list(logging.root.manager.loggerDict)
        if any(name.startswith(f"{root}.") for root in roots)
    )
    redact_logs((*roots, *below))
