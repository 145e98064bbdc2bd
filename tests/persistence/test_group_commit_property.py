"""Group commit under generated interleavings (hypothesis).

Writers of many kinds (receipts, history rows, envelopes, refused writes of each kind, reads)
start together and reach the store after a generated number of scheduler turns, so they land
in transactions in every combination: alone, with others, behind a commit in flight. For
every interleaving:

1. a writer told "done" finds its write in the file at that moment, through another
   connection (nobody is told durable before its COMMIT returned);
2. a refused write changed nothing, and only its own writer heard of it;
3. the file ends holding exactly what the writes that returned said they wrote;
4. every write ran once, and no more transactions were made than writes.
"""

from __future__ import annotations

import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.lowlevel
import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from persistence import OperationRecord, OpState, SqliteStore, UsageError
from tests.store_kit import commit, history

from .helpers import client, envelope, row, session

KINDS = ("receipt", "row", "envelope", "bad_row", "bad_envelope", "read")


@dataclass(frozen=True)
class Writer:
    kind: str
    delay: int  # scheduler turns before it reaches the store


writers = st.lists(
    st.builds(Writer, kind=st.sampled_from(KINDS), delay=st.integers(0, 4)),
    min_size=1,
    max_size=24,
)


def receipt(n: int) -> OperationRecord:
    return OperationRecord(
        op_id=f"op{n}",
        session="s1",
        stream="s1/1",
        call_id=f"c{n}",
        capability=client("noop"),
        target="t",
        started_at=float(n),
        state=OpState.RUNNING,
    )


def count(path: Path, sql: str, params: tuple[object, ...] = ()) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute(sql, params).fetchone()[0])
    finally:
        conn.close()


async def scenario(path: Path, plan: list[Writer]) -> None:
    refused: list[int] = []
    written: dict[str, set[int]] = {"receipt": set(), "row": set(), "envelope": set()}
    async with SqliteStore(path) as store:
        await commit(store, "s1", create=session(), rows=[row(1)])  # a "bad_row" collides
        before = store.commits

        async def write(index: int, writer: Writer) -> None:
            for _ in range(writer.delay):
                await anyio.lowlevel.checkpoint()
            n = index + 10
            try:
                if writer.kind == "receipt":
                    await commit(store, "s1", operations=[receipt(n)])
                    seen = count(
                        path, "SELECT count(*) FROM operations WHERE op_id = ?", (f"op{n}",)
                    )
                elif writer.kind == "row":
                    await commit(store, "s1", rows=[row(n)])
                    seen = count(path, "SELECT count(*) FROM history_rows WHERE seq = ?", (n,))
                elif writer.kind == "envelope":
                    await commit(store, "s1", envelope=envelope(f"st{n}"))
                    seen = count(
                        path, "SELECT count(*) FROM turn_envelopes WHERE stream = ?", (f"st{n}",)
                    )
                elif writer.kind == "bad_row":
                    # the second row collides: all of the boundary is refused, its receipt too
                    await commit(store, "s1", rows=[row(n), row(1)], operations=[receipt(n)])
                    raise AssertionError("a colliding append was accepted")
                elif writer.kind == "bad_envelope":
                    await commit(store, "nobody", envelope=envelope(f"st{n}", sid="nobody"))
                    raise AssertionError("an envelope of an unknown session was accepted")
                else:
                    rows = await history(store)
                    assert rows[0].seq == 1
                    return
            except UsageError:
                assert writer.kind.startswith("bad_"), f"{writer.kind} was refused"
                refused.append(index)
                return
            assert seen == 1, f"{writer.kind} {n} told done but not in the file"  # (1)
            written[writer.kind].add(n)

        async with anyio.create_task_group() as group:
            for index, writer in enumerate(plan):
                group.start_soon(write, index, writer)
        transactions = store.commits[0] - before[0]
        jobs = store.commits[1] - before[1]

    bad = [i for i, w in enumerate(plan) if w.kind.startswith("bad_")]
    assert sorted(refused) == bad  # (2)
    assert jobs == len(plan)  # (4)
    assert 1 <= transactions <= len(plan)
    ops = count(path, "SELECT count(*) FROM operations")
    rows = count(path, "SELECT count(*) FROM history_rows")
    envelopes = count(path, "SELECT count(*) FROM turn_envelopes")
    assert ops == len(written["receipt"])  # (3)
    assert rows == 1 + len(written["row"])
    assert envelopes == len(written["envelope"])


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(plan=writers)
def test_group_commit_keeps_every_promise_under_any_interleaving(plan: list[Writer]) -> None:
    with tempfile.TemporaryDirectory(prefix="turnkeeper-group-") as folder:
        anyio.run(scenario, Path(folder) / "tk.db", plan)
