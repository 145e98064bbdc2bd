"""The shape of an owner id (``host/pid/random``): what a take accepts as a live owner."""

from __future__ import annotations

import re

#: An owner id as this code mints it, for PostgreSQL's ``~`` (any other is damage: LS-7).
OWNER_PATTERN = r"^[^/[:space:]]+/[0-9]+/[0-9a-f]{12}$"
#: The same shape, for Python.
OWNER = re.compile(r"[^/\s]+/[0-9]+/[0-9a-f]{12}")
