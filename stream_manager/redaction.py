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
    "LOGGERS",
    "REDACTED",
    "SHAPES",
    "RedactingFilter",
    "Shape",
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


# Building blocks. Each row's pattern starts with a literal character or a character class and
# checks the character before it with a look-behind only then (``X(?<!B.)``), which lets the
# regular expression engine skip a row at a glance wherever its first character is absent.
# No quantified group nests another.
_WORD = "[A-Za-z0-9]"  # a key name starts a word (``DB_PASSWORD`` and ``x-api-key`` still do)
_TOKEN = "[A-Za-z0-9_-]"  # a token does not start inside a run of token characters


def _words(alternatives: str, before: str = _WORD) -> str:
    """Case-insensitive words (``|``-separated, each led by a letter) not right after ``before``."""
    words = alternatives.split("|")
    firsts = "".join(sorted({w[0].lower() + w[0].upper() for w in words}))
    rest = "|".join(f"(?<={w[0]}){w[1:]}" for w in words)
    return f"[{firsts}](?<!{before}.)(?i:{rest})"


_SEP = r"""["']?[ \t]*[:=][ \t]*"""  # ``key=``, ``key: ``, ``"key": ``
_KEYS = (
    "aws[_-]?secret[_-]?access[_-]?key|secret[_-]?access[_-]?key|aws[_-]?secret[_-]?key"
    "|client[_-]?secret|api[_-]?key|access[_-]?token|refresh[_-]?token|id[_-]?token"
    "|auth[_-]?token|private[_-]?key|session[_-]?id|session|set-cookie|cookie"
    "|password|passwd|passphrase|pwd|secret|token|auth"
)
# A value: double-quoted (escapes, spaces; an unclosed quote runs to the end of the line),
# single-quoted, or bare up to a space or a delimiter. ``[redacted]`` is left as it is.
_VALUE = (
    r"""(?:"(?P<secret_dq>(?:[^"\\\r\n]|\\.)*)"?"""
    r"""|'(?P<secret_sq>[^'\r\n]*)'?"""
    r"""|(?!\[redacted\])(?P<secret>[^\s"',;&)}\]<>]+))"""
)

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
        _words("authorization|proxy-authorization", _TOKEN)
        + _SEP
        + r"""["']?(?:(?i:bearer|basic|token|digest|negotiate|apikey)[ \t]+)?"""
        + r"""(?P<secret>[^\s"',;]+)""",
        "401: Authorization: Bearer FAKE-token-0000",
        "401: Authorization: Bearer [redacted]",
    ),
    Shape(
        "cookie-header",
        _words("set-cookie|cookie", _TOKEN)
        + r"[ \t]*:[ \t]*(?!\[redacted\])(?P<secret>\S[^\r\n]*)",
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
        _words(_KEYS) + _SEP + _VALUE,
        'bad config {"password": "fake pass 0000", "user": "me"}',
        'bad config {"password": "[redacted]", "user": "me"}',
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
        r"g(?<![A-Za-z0-9_].)(?:h[pousr]_[A-Za-z0-9]{30,}|ithub_pat_[A-Za-z0-9_]{30,})",
        "push failed for ghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000",
        "push failed for [redacted]",
    ),
    Shape(
        "gitlab",
        r"g(?<![A-Za-z0-9_-].)lpat-[A-Za-z0-9_-]{20,}",
        "token glpat-FAKEFAKEFAKEFAKE0000 expired",
        "token [redacted] expired",
    ),
    Shape(
        "aws-access-key-id",
        r"A(?<![A-Za-z0-9].)(?:KIA|SIA)[A-Z0-9]{16}(?![A-Za-z0-9])",
        "key AKIAFAKEFAKEFAKE0000 denied",
        "key [redacted] denied",
    ),
    Shape(
        "slack-token",
        r"x(?<![A-Za-z0-9_-].)ox[abprs]-[A-Za-z0-9-]{10,}",
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
        r"[rs](?<![A-Za-z0-9_].)k_(?:live|test)_[A-Za-z0-9]{10,}",
        "charge with sk_live_FAKEFAKEFAKE0000 refused",
        "charge with [redacted] refused",
    ),
    Shape(
        "openai-anthropic",
        r"s(?<![A-Za-z0-9_-].)k-[A-Za-z0-9_-]{10,}",
        "invalid key sk-ant-api03-FAKEFAKEFAKE0000",
        "invalid key [redacted]",
    ),
    Shape(
        "google-api-key",
        r"A(?<![A-Za-z0-9_-].)Iza[A-Za-z0-9_-]{35}",
        "quota for AIzaFAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE000 hit",
        "quota for [redacted] hit",
    ),
    Shape(
        "jwt",
        r"e(?<![A-Za-z0-9_-].)yJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",
        "expired: eyJhbGciOiJub25lIn0.eyJzdWIiOiJmYWtlIn0.FAKEsig",
        "expired: [redacted]",
    ),
    Shape(
        "npm",
        r"n(?<![A-Za-z0-9_].)pm_[A-Za-z0-9]{30,}",
        "publish as npm_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000",
        "publish as [redacted]",
    ),
    Shape(
        "pypi",
        r"p(?<![A-Za-z0-9_-].)ypi-AgEI[A-Za-z0-9_-]{20,}",
        "upload with pypi-AgEIFAKEFAKEFAKEFAKEFAKE0000 failed",
        "upload with [redacted] failed",
    ),
    Shape(
        "sendgrid",
        r"S(?<![A-Za-z0-9_-].)G\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}",
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
        r"h(?<![A-Za-z0-9_].)f_[A-Za-z0-9]{30,}",
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
    "turnkeeper.engine",
    "turnkeeper.operations",
    "turnkeeper.persistence",
    "turnkeeper.session",
    "turnkeeper.stream",
)

_FILTER = RedactingFilter()


def redact_logs(names: tuple[str, ...] = LOGGERS) -> None:
    """Install the redacting filter on each logger of ``names`` (idempotent)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(_FILTER)
