"""Requests to a session's holder (LS-10), on the store, against a real PostgreSQL server.

One ``PostgresStore`` asks, another (the holder) reads the request, answers, and the asker
takes the answer; an asker that gives up withdraws its request, and a withdrawn request is
never answered. Each post and answer is heard through ``LISTEN`` by the other side.
"""

from __future__ import annotations

import anyio
import pytest

from persistence import CorruptRecord, Reply, UsageError
from persistence.postgres import PostgresStore
from tests.pg_kit import sql
from tests.store_kit import commit

from .helpers import session


@pytest.mark.timeout(60)
async def test_ls10_a_request_is_heard_answered_and_taken_once(pg_url: str) -> None:
    async with PostgresStore(pg_url) as holder, PostgresStore(pg_url) as asker:
        await commit(holder, "s7", create=session("s7"))
        posted: list[str] = []
        answered: list[int] = []
        heard_post, heard_answer = anyio.Event(), anyio.Event()

        def on_request(sid: str) -> None:
            posted.append(sid)
            heard_post.set()

        def on_answer(number: int) -> None:
            answered.append(number)
            heard_answer.set()

        holder.watch_requests(on_request)
        asker.watch_answers(on_answer)
        number = await asker.ask("s7", "resolve", {"op_id": "op-3", "note": "checked"})
        with anyio.fail_after(20):
            await heard_post.wait()
        assert posted == ["s7"]
        assert await holder.asked_for(["s7", "s8"]) == {"s7"}
        (request,) = await holder.requests("s7")
        assert (request.id, request.session, request.kind) == (number, "s7", "resolve")
        assert request.body == {"op_id": "op-3", "note": "checked"}
        assert await asker.take_answer(number) is None  # not answered yet
        reply = Reply(ok=True, value="op-3")
        assert not await holder.answer(number, reply)  # not begun: nothing to answer
        assert await holder.begin(number)
        assert not await holder.begin(number)  # begun once
        assert await holder.asked_for(["s7"]) == set()  # begun: no longer asked
        assert await holder.answer(number, reply)
        assert not await holder.answer(number, Reply(ok=False, error="Twice"))  # once only
        with anyio.fail_after(20):
            await heard_answer.wait()
        assert answered == [number]
        assert await asker.take_answer(number) == reply
        assert await asker.take_answer(number) is None  # taken: the row is gone
        assert sql(pg_url, "SELECT count(*) FROM requests") == [(0,)]


async def test_ls10_a_withdrawn_request_is_never_answered(pg_url: str) -> None:
    async with PostgresStore(pg_url) as holder, PostgresStore(pg_url) as asker:
        await commit(holder, "s7", create=session("s7"))
        number = await asker.ask("s7", "stop", {})
        assert await asker.withdraw(number) == "withdrawn"
        assert not await holder.begin(number)
        assert not await holder.answer(number, Reply(ok=True, value="late"))
        assert await holder.requests("s7") == ()
        assert await holder.asked_for(["s7"]) == set()


async def test_ls10_a_request_withdrawn_once_begun_says_so(pg_url: str) -> None:
    async with PostgresStore(pg_url) as holder, PostgresStore(pg_url) as asker:
        await commit(holder, "s7", create=session("s7"))
        number = await asker.ask("s7", "stop", {})
        assert await holder.begin(number)
        assert await asker.withdraw(number) == "begun"
        assert not await holder.answer(number, Reply(ok=True, value="too late"))
        assert sql(pg_url, "SELECT count(*) FROM requests") == [(0,)]


async def test_ls10_an_answered_request_cannot_be_withdrawn(pg_url: str) -> None:
    async with PostgresStore(pg_url) as holder, PostgresStore(pg_url) as asker:
        await commit(holder, "s7", create=session("s7"))
        number = await asker.ask("s7", "stop", {})
        assert await holder.begin(number)
        assert await holder.answer(number, Reply(ok=True, value="queued text"))
        assert await asker.withdraw(number) == "answered"
        assert await asker.take_answer(number) == Reply(ok=True, value="queued text")


async def test_ls10_a_request_for_an_unknown_session_or_kind_is_refused(pg_url: str) -> None:
    async with PostgresStore(pg_url) as store:
        with pytest.raises(UsageError, match="unknown session 'ghost'"):
            await store.ask("ghost", "stop", {})
        await commit(store, "s7", create=session("s7"))
        with pytest.raises(UsageError, match="'pause'"):
            await store.ask("s7", "pause", {})  # type: ignore[arg-type]
        assert sql(pg_url, "SELECT count(*) FROM requests") == [(0,)]


async def test_ls10_a_damaged_request_or_reply_is_named_and_kept(pg_url: str) -> None:
    async with PostgresStore(pg_url) as store:
        await commit(store, "s7", create=session("s7"))
        number = await store.ask("s7", "resolve", {"op_id": "op-9"})
        sql(pg_url, "UPDATE requests SET body = %s WHERE id = %s", (b"[1, 2]", number))
        with pytest.raises(CorruptRecord, match=rf"requests\[{number}\]: \$\.body"):
            await store.requests("s7")
        sql(pg_url, "UPDATE requests SET answer = %s WHERE id = %s", (b"{not json", number))
        with pytest.raises(CorruptRecord, match=rf"requests\[{number}\]: \$\.answer"):
            await store.take_answer(number)
        assert sql(pg_url, "SELECT count(*) FROM requests") == [(1,)]  # nothing lost
