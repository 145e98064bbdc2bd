"""``turnkeeper inspect``'s durable queue: each session's queued entries, and the damaged ones.

The store keeps an entry's body opaque; this view decodes it (``message_queue.decode_entry``)
to show what a person needs: the entry id, kind, mode, how many adds it batched, whether it was
withdrawn, and its text (redacted, and clipped in text output). A stored entry the store calls
damaged, and a body that does not decode, are reported by their ``session/entry`` key with what
was wrong (the ``CorruptRecord`` message, naming the field); nothing is rewritten.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent_session.harness.redaction import redact
from message_queue import decode_entry
from persistence import CorruptRecord, QueueQuery, Store, StoreError, clip

if TYPE_CHECKING:
    from rich.console import Console

#: Where a finding is reported: ``(where, detail)`` (``inspection._Findings.add``).
Report = Callable[[str, str], None]


async def read_queue(
    store: Store, session: str | None, report: Report
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The queued entries and the damaged ones, as ``inspect --json`` shows them.

    Entries of ``session`` only, when given. Each damaged one (``{"entry": key, "detail":
    ...}``) is also reported through ``report``.
    """
    try:
        query = await store.queued(session)
    except StoreError as error:  # a damaged page under the queue
        report("queued entries", str(error))
        query = QueueQuery()
    entries: list[dict[str, Any]] = []
    damaged: list[dict[str, str]] = []

    def damage(key: str, detail: str) -> None:
        version = detail.startswith("queue_versions[")  # its key is the session
        where = (
            "skipped corrupt queue version of session"
            if version
            else "skipped corrupt queued entry"
        )
        report(f"{where} {redact(key)}", detail)
        damaged.append({"entry": redact(key), "detail": redact(detail)})

    for key, detail in query.corrupt:
        damage(key, detail)
    for record in query.records:
        key = f"{record.session}/{record.entry_id}"
        try:
            state = decode_entry(record.body, key)
        except CorruptRecord as error:
            damage(key, str(error))
            continue
        entries.append(
            {
                "session": redact(record.session),
                "entry": redact(record.entry_id),
                "position": record.position,
                "kind": state.kind.value,
                "mode": state.mode.value,
                "adds": len(state.messages),
                "withdrawn": state.withdrawn,
                "text": redact("\n".join(message.text for message in state.messages)),
            }
        )
    return entries, damaged


def print_queue(
    console: Console, entries: list[dict[str, Any]], damaged: list[dict[str, str]]
) -> None:
    """One line per queued entry, then one per damaged entry (its key and what was wrong)."""
    if not entries and not damaged:
        console.print("queued entries: none")
        return
    console.print(
        f"queued entries: {len(entries)}" + (f", {len(damaged)} damaged" if damaged else "")
    )
    for item in entries:
        adds = f"{item['adds']} add" + ("" if item["adds"] == 1 else "s")
        withdrawn = ", withdrawn" if item["withdrawn"] else ""
        text = clip(item["text"]).replace("\n", " ⏎ ")  # redacted already: one line per entry
        head = f"{clip(item['session'])}/{clip(item['entry'])}"
        line = f"  {head}: {item['kind']}, {item['mode']}, {adds}{withdrawn}: {text}"
        console.print(line, markup=False, soft_wrap=True)  # stored text, not rich markup
    for item in damaged:
        line = f"  {clip(item['entry'])}: damaged: {clip(item['detail'], 1000)}"
        console.print(line, markup=False, soft_wrap=True)
