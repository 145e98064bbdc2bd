"""Checking a scenario's ``[expect]`` at quiescence.

Each check returns sentences naming what differed; an empty list means every expectation held.
``events`` is a subsequence match: each expected item must match a later trace line than the
one before it, every given field equal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from agent_session._rows import unanswered
from agent_session._session import AgentSession
from agent_session.harness.scenario import Expect
from agent_session.harness.trace import TraceLine
from persistence import Store


async def check_expectations(
    expect: Expect,
    sessions: Mapping[str, AgentSession],
    store: Store,
    trace: Sequence[TraceLine],
) -> list[str]:
    """Every expectation that did not hold, as a sentence."""
    failures: list[str] = []
    for session, phase in expect.phases.items():
        actual = sessions[session].phase.value
        if actual != phase:
            failures.append(f"phases.{session}: expected {phase}, got {actual}")
    for session, owed in expect.owed.items():
        actual_owed = sessions[session].owes()
        if actual_owed != owed:
            failures.append(f"owed.{session}: expected {owed}, got {actual_owed}")
    for session, count in expect.streams.items():
        started = sum(
            1 for line in trace if line["event"] == "stream-start" and line["session"] == session
        )
        if started != count:
            failures.append(f"streams.{session}: expected {count} stream-start, got {started}")
    for session, count in expect.unanswered.items():
        loaded = await store.load(session)
        actual_count = unanswered(list(loaded.rows) if loaded is not None else [])
        if actual_count != count:
            failures.append(f"unanswered.{session}: expected {count}, got {actual_count}")
    failures += await _stored(expect, store)
    failures.extend(match_events(expect.events, trace))
    return failures


async def _stored(expect: Expect, store: Store) -> list[str]:
    """The expectations the store answers: receipts by state, handles by status."""
    failures: list[str] = []
    if expect.receipts:
        counts = Counter(r.state.value for r in (await store.receipts()).records)
        for state, count in expect.receipts.items():
            if counts[state] != count:
                failures.append(f"receipts.{state}: expected {count}, got {counts[state]}")
    if expect.handles:  # what the store holds: a handle settles when its record is durable
        stored = {r.handle_id: r.status.value for r in (await store.handles()).records}
        for handle, status in expect.handles.items():
            actual_status = stored.get(handle, "missing")
            if actual_status != status:
                failures.append(f"handles.{handle}: expected {status}, got {actual_status}")
    return failures


def match_events(expected: Sequence[Mapping[str, object]], trace: Sequence[TraceLine]) -> list[str]:
    """The subsequence check of ``expect.events``."""
    position = 0
    for index, want in enumerate(expected):
        found = next(
            (
                at
                for at in range(position, len(trace))
                if all(_same(trace[at].get(key), value) for key, value in want.items())
            ),
            None,
        )
        if found is None:
            return [
                f"events[{index}]: no {dict(want)} after trace line {position} "
                f"(the expected events must appear in this order)"
            ]
        position = found + 1
    return []


def _same(actual: object, expected: object) -> bool:
    if isinstance(expected, list) and isinstance(actual, list | tuple):
        return list(actual) == expected
    return actual == expected
