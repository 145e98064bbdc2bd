"""Bounded cleanup (``docs/architecture.md``): a shielded await of host or store code ends.

Each kind of site is driven with a host or a store that never returns: after the cleanup
bound of virtual time the work is cut short, one warning names the site, and nothing of the
cut work is told. Cancel scopes carry their reason into the cancelled task.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import anyio
import pytest

from agent_session.harness.virtual_time import VirtualTime
from stream_manager import (
    Aborted,
    AbortReason,
    ErrorType,
    Failed,
    ModelRequest,
    Part,
    ReceiptWritten,
    StreamOutcome,
    TextPart,
    ToolCallPart,
    ToolContext,
    ToolResultPart,
)
from tests.store_kit import HangingStore
from tests.stream_manager.support import T_, FakeTool, Host, Rig, X, rig

BOUND_S = 7.0  # the tests' cleanup bound (the default is CLEANUP_S)
GRACE_S = 3.0  # the tests' cancel grace (the default is 5 s)


async def _forever(*_: object) -> None:
    await anyio.sleep_forever()


def _warned(caplog: pytest.LogCaptureFixture, what: str, bound_s: float = BOUND_S) -> bool:
    """One warning of the cleanup logger names the site and its bound."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "turnkeeper.cleanup" and record.levelno == logging.WARNING
    ] == [f"cleanup bound: {what} did not finish within {bound_s:g} s; cut short"]


async def _run(r: Rig, host: Host | None = None) -> StreamOutcome:
    request = r.request() if host is None else r.request(host=host)
    return await VirtualTime(r.clock).drive(lambda: r.manager.start_stream(request))


async def test_cleanup_bound_ends_a_start_write_that_hangs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The host's start write never returns: no step runs, the stream fails ``store_write``."""
    r = rig({"M": [X("never asked")]}, cleanup_s=BOUND_S)

    outcome = await _run(r, Host(started=_forever))

    assert isinstance(outcome, Failed)
    assert outcome.type is ErrorType.STORE_WRITE
    assert r.clock.now() == BOUND_S
    assert r.models["M"].requests == []  # its start is not durable: no step may run
    assert r.recorder.names() == ["stream-start", "stream-error"]
    assert _warned(caplog, "the start of stream s1/1")


async def test_cleanup_bound_ends_a_final_write_that_hangs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The host's final write never returns: a ``store_write`` error, never ``stream-end``."""
    r = rig({"M": [X("the answer")]}, cleanup_s=BOUND_S)

    outcome = await _run(r, Host(final=_forever))

    assert isinstance(outcome, Failed)
    assert outcome.type is ErrorType.STORE_WRITE
    assert r.clock.now() == BOUND_S
    assert "stream-end" not in r.recorder.names()  # nothing told as durable
    assert r.recorder.names()[-1] == "stream-error"
    assert _warned(caplog, "the final write of stream s1/1")


class _OpenProviderCall:
    """A model whose step starts a provider-executed call, then ends with no result or finish.

    Once the call's ``running`` receipt is written the store hangs: the receipt that cuts the
    call (``indeterminate``, OP-7) is a write that never returns.
    """

    id = "P"

    def __init__(self, store: HangingStore) -> None:
        self._store = store

    async def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        yield ToolCallPart(call_id="p1", name="web_search", args={}, provider_executed=True)
        self._store.hang()


async def test_cleanup_bound_ends_a_provider_call_cut_that_hangs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = HangingStore()
    await store.open()
    r = rig({}, store=store, cleanup_s=BOUND_S, extra_models={"P": _OpenProviderCall(store)})

    outcome = await VirtualTime(r.clock).drive(lambda: r.manager.start_stream(r.request(model="P")))

    assert isinstance(outcome, Failed)
    assert outcome.type is ErrorType.STREAM_TRUNCATED
    assert r.clock.now() == BOUND_S
    assert r.recorder.of(ReceiptWritten) == []  # the cut receipt was never told
    assert _warned(caplog, "cutting the provider calls of stream s1/1")


async def test_cleanup_bound_ends_an_operation_stop_whose_writes_hang(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hard stop while a call runs; the store hangs from then on (its cancel request too).

    The stop's cleanup has the grace interval plus the bound; then it is cut short: the call's
    task is cancelled all the same, the stream aborts, and no cancellation is told.
    """
    store = HangingStore()
    await store.open()
    runs = anyio.Event()
    r: Rig

    def stop(call: ToolCallPart) -> None:
        store.hang()
        r.manager.request_stop_nowait("s1", reason=AbortReason.USER)

    tool = FakeTool("bash", before=stop, gate=runs)  # never opened: it runs until cancelled
    r = rig(
        {"M": [T_("bash"), X()]},
        tools=[tool],
        store=store,
        cleanup_s=BOUND_S,
        cancel_grace_s=GRACE_S,
    )

    outcome = await _run(r)

    assert isinstance(outcome, Aborted)
    assert r.clock.now() == GRACE_S + BOUND_S
    names = r.recorder.names()
    assert "op-cancel-requested" not in names  # its request never became durable
    assert [e.state for e in r.recorder.of(ReceiptWritten)] == []
    assert _warned(caplog, "stopping operation s1/1/1/0", GRACE_S + BOUND_S)


# ---------------------------------------------------------------- cancel reasons


class _CancelSeen:
    """Records the message of the cancellation that reached it (a tool, or a model step)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def wait(self) -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class() as cancelled:
            self.seen.append(str(cancelled))
            raise


class _SlowTool(_CancelSeen):
    name = "bash"
    kind = FakeTool("x").kind

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        await self.wait()
        raise AssertionError("unreachable")


class _SlowModel(_CancelSeen):
    id = "S"

    async def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        yield TextPart(text="thinking")
        await self.wait()


async def test_a_hard_stop_cancels_the_stream_with_its_reason() -> None:
    model = _SlowModel()
    r = rig({}, extra_models={"S": model})

    async with anyio.create_task_group() as group:
        group.start_soon(r.manager.start_stream, r.request(model="S"))
        await anyio.wait_all_tasks_blocked()
        r.manager.request_stop_nowait("s1", reason=AbortReason.USER)

    assert len(model.seen) == 1
    assert "reason: stream s1/1: hard stop (user)" in model.seen[0]


async def test_a_cancelled_operation_is_cancelled_with_its_reason() -> None:
    tool = _SlowTool()
    r = rig({"M": [T_("bash"), X()]}, tools=[tool])  # type: ignore[list-item]

    async with anyio.create_task_group() as group:
        group.start_soon(r.manager.start_stream, r.request())
        await anyio.wait_all_tasks_blocked()
        assert r.manager.operations.cancel_nowait(tool="bash")

    assert len(tool.seen) == 1
    assert "reason: operation s1/1/1/0: cancellation requested (user)" in tool.seen[0]
