"""The scan of a scenario file's raw text before it is parsed: one linear pass.

A parser recurses once per level of ``[`` and ``{`` (a few thousand levels overflow the stack),
and ``tomllib`` spends time and memory quadratic in the length of a dotted key (a key of ``k``
parts records ``k`` prefixes of it, of up to ``k`` parts each): a file of long dotted keys
takes gigabytes. Both are refused here, before the parser sees the text, from what the text
itself shows: how deeply brackets nest outside strings and comments, and how many parts a table
header and a dotted key have.

The tokens are matched by one regular expression whose alternatives cannot backtrack
(possessive loops over disjoint alternatives) and cannot fail once they have started: an
unterminated string runs to the end of its line (``"``, ``'``) or of the text (``\"\"\"``,
``'''``) and is one token, so no character is looked at more than twice (a dotted run is
matched, then its parts counted), however the quotes and backslashes fall. The parser then
says what is wrong with such a file.

The bounds refuse only what the check of the parsed document (nesting deeper than
:data:`~agent_session.harness.loader.MAX_DEPTH`) refuses too: a key's parts, the parts of the
table header above it and each bracket open around it are each at least a level of the
document.
"""

from __future__ import annotations

import re
from typing import Final

#: A basic or literal string on one line; an unterminated one runs to the end of the line.
_QUOTED: Final = r"\"(?:[^\"\\\n]++|\\[^\n]?)*+\"?|'[^'\n]*+'?"
#: One part of a dotted key: a bare word or a quoted string.
_PART: Final = rf"[A-Za-z0-9_-]++|{_QUOTED}"
_PARTS: Final = re.compile(_PART)
_TOML: Final = re.compile(
    r"(?P<long>\"\"\"(?:[^\"\\]++|\\.?|\"(?!\"\"))*+(?:\"{3,5}|\Z)"
    r"|'''(?:[^']++|'(?!''))*+(?:'{3,5}|\Z))"
    rf"|(?P<run>(?:{_PART})(?:[ \t]*+\.[ \t]*+(?:{_PART}))*+)"
    r"|(?P<comment>#[^\n]*+)|(?P<open>\[\[?|\{)|(?P<close>\]\]?|\})|(?P<comma>,)|(?P<newline>\n)",
    re.DOTALL,
)
_JSON: Final = re.compile(r"\"(?:[^\"\\]++|\\.?)*+\"?|(?P<open>[\[{])|(?P<close>[\]}])", re.DOTALL)


class TooDeep(Exception):
    """The text nests deeper than allowed; ``where`` says where (``"line N: "``)."""

    def __init__(self, where: str) -> None:
        self.where = where
        super().__init__(where)


def check_json(text: str, max_depth: int) -> None:
    """Refuse JSON text whose arrays and objects nest deeper than ``max_depth``.

    Raises:
        TooDeep: They do; ``where`` names the line.
    """
    depth = 0
    for match in _JSON.finditer(text):
        if match.lastgroup == "open":
            depth += 1
            if depth > max_depth:
                raise TooDeep(_line(text, match.start()))
        elif match.lastgroup == "close":
            depth = max(0, depth - 1)


def check_toml(text: str, max_depth: int) -> None:
    """Refuse TOML text that nests deeper than ``max_depth``: brackets, headers, dotted keys.

    A key is a run of parts (bare words or quoted strings) joined by dots at a key's place: the
    start of a line outside brackets, or right after ``{`` or ``,`` in an inline table. A run
    right after a ``[`` or ``[[`` that starts a line is a table header. A key's level is at
    least the header's parts, plus the brackets open around it, plus its own parts.

    Raises:
        TooDeep: A key, a header or the brackets nest deeper; ``where`` names the line.
    """
    brackets: list[str] = []  # the open ``[`` and ``{``, innermost last
    header = 0  # the parts of the current table header
    key_place = True  # the next run is a key (a line's start, or after ``{`` or ``,``)
    in_header = False  # the next run is a table header's
    for match in _TOML.finditer(text):
        kind, token = match.lastgroup, match.group()
        level = 0
        if kind == "run" and (key_place or in_header):
            parts = len(_PARTS.findall(token)) if "." in token else 1
            level = parts if in_header else header + len(brackets) + parts
            header = parts if in_header else header
        elif kind == "open" and key_place and not brackets and token[0] == "[":
            in_header, key_place = True, False
            continue
        elif kind == "open":
            brackets.extend(token)
            level = len(brackets)
        elif kind == "close":
            del brackets[len(brackets) - len(token) :]
        if level > max_depth:
            raise TooDeep(_line(text, match.start()))
        in_header = False
        key_place = (kind == "newline" and not brackets) or (
            kind in ("open", "comma") and bool(brackets) and brackets[-1] == "{"
        )


def _line(text: str, at: int) -> str:
    return f"line {text.count(chr(10), 0, at) + 1}: "
