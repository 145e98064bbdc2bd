"""Redaction for the harness: :func:`stream_manager.redact`, re-exported.

The table of credential shapes lives in ``stream_manager/redaction.py`` so every package can
use it (``docs/trace.md``, "Redaction").
"""

from __future__ import annotations

from stream_manager.redaction import REDACTED, redact

__all__ = ["REDACTED", "redact"]
