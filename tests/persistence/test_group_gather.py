"""A group commit's leader that gathers: writers made ready with it share its batch.

``GroupCommit(gather_turns=N)`` (``persistence/_group.py``): the leader lets the event loop run
``N`` turns before it takes its batch, so writers that reach the store within those turns ride
in it. The protocol is checked on a fake ``execute`` (no database): which jobs rode together,
that every writer gets its own job's outcome, and that no interleaving of writers, gathering
leaders and commits in flight leaves a writer waiting (a writer that waited for a turn to
lead while a gathering leader held its batch would spin or hang).
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import hypothesis.strategies as st
from hypothesis import given, settings

from persistence._group import GroupCommit, Outcome


class FakeDatabase:
    """Records each batch; a batch takes ``commit_turns`` scheduler turns to commit."""

    def __init__(self, commit_turns: int = 0) -> None:
        self.batches: list[list[int]] = []
        self.commit_turns = commit_turns

    async def execute(self, jobs: list[int]) -> list[Outcome]:
        self.batches.append(list(jobs))
        for _ in range(self.commit_turns):
            await anyio.lowlevel.checkpoint()
        return [
            Outcome(error=ValueError(f"job {job} refused")) if job < 0 else Outcome(value=job * 7)
            for job in jobs
        ]


async def _turns(n: int) -> None:
    for _ in range(n):
        await anyio.lowlevel.checkpoint()


async def _batches_of(gather_turns: int, delays: list[int]) -> list[list[int]]:
    database = FakeDatabase()
    group = GroupCommit(
        execute=database.execute, lock=anyio.Lock(), batching=True, gather_turns=gather_turns
    )
    told: dict[int, object] = {}

    async def writer(job: int, delay: int) -> None:
        await _turns(delay)
        told[job] = await group.run(job)

    async with anyio.create_task_group() as tasks:
        for job, delay in enumerate(delays, start=1):
            tasks.start_soon(writer, job, delay)
    assert told == {job: job * 7 for job in range(1, len(delays) + 1)}
    return database.batches


async def test_writers_arriving_within_the_gathered_turns_share_the_leaders_batch() -> None:
    # Writer 1 leads at once; 2 and 3 arrive two turns later, inside a gather of three turns.
    assert await _batches_of(3, [0, 2, 2]) == [[1, 2, 3]]


async def test_without_gathering_each_writer_that_finds_no_commit_in_flight_leads_alone() -> None:
    assert await _batches_of(0, [0, 2, 2]) == [[1], [2], [3]]


async def test_a_writer_later_than_the_gathered_turns_leads_a_batch_of_its_own() -> None:
    assert await _batches_of(2, [0, 1, 6]) == [[1, 2], [3]]


writer_plans = st.lists(
    st.tuples(st.integers(0, 6), st.booleans()),  # (turns before it writes, refused)
    min_size=1,
    max_size=16,
)


async def _interleaving(plan: list[tuple[int, bool]], gather_turns: int, commit_turns: int) -> None:
    database = FakeDatabase(commit_turns)
    group = GroupCommit(
        execute=database.execute, lock=anyio.Lock(), batching=True, gather_turns=gather_turns
    )
    told: dict[int, object] = {}

    async def writer(job: int, delay: int) -> None:
        await _turns(delay)
        try:
            told[job] = await group.run(job)
        except ValueError as error:
            told[job] = str(error)

    with anyio.fail_after(5):  # a writer left waiting fails here, not at the suite's timeout
        async with anyio.create_task_group() as tasks:
            for index, (delay, refused) in enumerate(plan, start=1):
                tasks.start_soon(writer, -index if refused else index, delay)
    jobs = [-i if refused else i for i, (_, refused) in enumerate(plan, start=1)]
    assert told == {j: f"job {j} refused" if j < 0 else j * 7 for j in jobs}
    ridden = [job for batch in database.batches for job in batch]
    assert sorted(ridden) == sorted(jobs), "every job rode in exactly one batch"
    assert all(database.batches), "no empty batch was committed"


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    plan=writer_plans,
    gather_turns=st.integers(0, 4),
    commit_turns=st.integers(0, 3),
)
def test_a_gathering_leader_leaves_no_writer_waiting_under_any_interleaving(
    plan: list[tuple[int, bool]], gather_turns: int, commit_turns: int
) -> None:
    anyio.run(_interleaving, plan, gather_turns, commit_turns)
