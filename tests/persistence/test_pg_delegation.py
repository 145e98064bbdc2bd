"""A delegated turn across processes (LS-11), on the store, against a real PostgreSQL server.

The owner's store writes the handle and posts the prompt in one transaction fenced by the
owner session's lease: the prompt is an inbox row naming the handle, heard by the target's
side; a store that does not hold the owner writes nothing. The target's side reads the
active handles delegated into the sessions it claims, and tells the owner's side.
"""

from __future__ import annotations

import anyio
import pytest

from persistence import HandleRecord, HandleStatus, LeaseLost, UsageError
from persistence.postgres import PostgresStore
from tests.pg_kit import sql
from tests.store_kit import commit

from .helpers import session

PLAN = HandleRecord(
    handle_id="h-plan-3", owner="lead", target="crew", turn_id="h-plan-3", created_at=12.5
)


@pytest.mark.timeout(60)
async def test_ls11_the_handle_and_its_prompt_are_one_fenced_write(pg_url: str) -> None:
    async with PostgresStore(pg_url) as owner, PostgresStore(pg_url) as target:
        await commit(owner, "lead", create=session("lead"))
        await commit(target, "crew", create=session("crew"))
        heard: list[str] = []
        told = anyio.Event()

        def on_mail(sid: str) -> None:
            heard.append(sid)
            told.set()

        target.watch_inbox(on_mail)
        entry = await owner.delegate(PLAN, "write the plan in 3 parts")
        with anyio.fail_after(20):
            await told.wait()
        assert heard == ["crew"]
        assert await target.inbox("crew") == ((entry, "write the plan in 3 parts", "h-plan-3"),)
        (found,) = (await target.handles_into(["crew", "other"])).records
        assert found == PLAN
        assert (await target.handles_into(["lead"])).records == ()
        with pytest.raises(UsageError, match=r"h-plan-3.*taken"):
            await owner.delegate(PLAN, "the same handle again")  # never reused, never overwritten
        assert len(await target.inbox("crew")) == 1
        await target.drop_mail("crew", entry)  # its turn settled before it was taken
        assert await target.inbox("crew") == ()


@pytest.mark.timeout(60)
async def test_ls11_a_store_that_does_not_hold_the_owner_writes_nothing(pg_url: str) -> None:
    async with PostgresStore(pg_url) as owner, PostgresStore(pg_url) as stranger:
        await commit(owner, "lead", create=session("lead"))
        await commit(owner, "crew", create=session("crew"))
        with pytest.raises(LeaseLost) as lost:
            await stranger.delegate(PLAN, "write the plan")
        assert (lost.value.session, lost.value.held, lost.value.epoch) == ("lead", None, 1)
        assert lost.value.holder == owner.owner
        sql(pg_url, "UPDATE sessions SET epoch = 5 WHERE id = 'lead'")  # a peer took it since
        with pytest.raises(LeaseLost):
            await owner.delegate(PLAN, "write the plan")
        assert "lead" in owner.leases.lost
        assert sql(pg_url, "SELECT count(*) FROM handles") == [(0,)]
        assert sql(pg_url, "SELECT count(*) FROM inbox") == [(0,)]


@pytest.mark.timeout(60)
async def test_ls11_a_prompt_to_an_unknown_or_with_blank_text_is_refused(pg_url: str) -> None:
    async with PostgresStore(pg_url) as owner:
        await commit(owner, "lead", create=session("lead"))
        with pytest.raises(UsageError, match="crew"):
            await owner.delegate(PLAN, "write the plan")
        await commit(owner, "crew", create=session("crew"))
        with pytest.raises(UsageError, match="blank"):
            await owner.delegate(PLAN, "   ")
        settled = HandleRecord(
            handle_id="h-bad-1", owner="lead", target="crew", turn_id="h-bad-1",
            created_at=1.0, status=HandleStatus.COMPLETED,
        )  # fmt: skip
        with pytest.raises(UsageError, match="h-bad-1"):
            await owner.delegate(settled, "anything")  # settled without a settled_at
        assert sql(pg_url, "SELECT count(*) FROM handles") == [(0,)]
        assert sql(pg_url, "SELECT count(*) FROM inbox") == [(0,)]


@pytest.mark.timeout(60)
async def test_ls11_the_owners_side_hears_a_handle_written_elsewhere(pg_url: str) -> None:
    async with PostgresStore(pg_url) as owner, PostgresStore(pg_url) as target:
        heard: list[str] = []
        told = anyio.Event()

        def on_handle(sid: str) -> None:
            heard.append(sid)
            told.set()

        owner.watch_handles(on_handle)
        await target.notify_handle("lead")
        with anyio.fail_after(20):
            await told.wait()
        assert heard == ["lead"]
