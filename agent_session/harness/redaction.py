"""Redaction of values that look like credentials (``docs/trace.md``).

Receipts hold no arguments or outputs by construction, and events carry ids, codes and short
explanations; as a second line of defence every traced or printed string passes through
:func:`redact`, so a key or token that reached a message (a model error, a hand-edited row
quoted in a recovery report) never reaches a trace file or a terminal.
"""

from __future__ import annotations

import re

_SECRET = re.compile(
    r"(?i)(bearer\s+\S+|sk-[A-Za-z0-9_-]{6,}|(?:api[_-]?key|token|password|passwd|secret|"
    r"cookie|authorization)\s*[=:]\s*\S+)"
)


def redact(value: object) -> str:
    """``value`` as text, with anything that looks like a credential replaced."""
    return _SECRET.sub("[redacted]", str(value))
