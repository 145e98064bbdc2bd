"""A host's own owner of delegated turns (``Engine(owner=...)``, the ``TurnOwner`` port).

The host keeps its delegated turns in a task store of its own: the engine's sessions tell it
what each correlated stream did, it answers the claim through the target session (ST-15), and
a resume asks it whether the handle still admits the turn (R41). The engine's own owner keeps
the handles it delegated itself; ``Owners`` routes each event to the owner holding its handle.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field

import anyio

from agent_session import (
    ChildAborted,
    ChildEnded,
    ChildEvent,
    ChildForfeited,
    ChildHardStopped,
    Engine,
    ResumeAttempted,
)
from agent_session._delegation import Delegations
from agent_session._owners import Owners
from message_queue import Correlation, EntryKind
from stream_manager import AbortReason, FinishReason, ScriptStep, StreamStarted, VirtualClock
from tests.agent_session.support import T_, HookTool, X, session_rig
from tests.agent_session.test_st_rules import Wakes

#: A delegated turn of the host's task store (not one the engine delegated).
JOB = Correlation(handle_id="job-31", owner_session="tasks", turn_id="t-5")


@dataclass
class TaskStore:
    """A host's owner: its handles, what it heard, what it decided, and its writes."""

    engine: Engine | None = None
    status: dict[str, str] = field(default_factory=lambda: {"job-31": "active"})
    heard: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)
    settled: list[tuple[str, str, str]] = field(default_factory=list)
    begun: list[str] = field(default_factory=list)
    writes: int = 0

    def on_child(self, event: ChildEvent) -> Awaitable[None] | None:
        self.heard.append(type(event).__name__)
        if not isinstance(event, ChildEnded) or event.correlation is None:
            if isinstance(event, ChildForfeited):
                return self._settle(event.correlation.handle_id, "interrupted", event.why)
            return None
        handle = event.correlation.handle_id
        if self.status.get(handle) != "active":
            return None  # TD-1, TD-10: settled already
        if event.finish is FinishReason.TOOL_CALLS:
            assert self.engine is not None
            if self.engine.session(event.target).claim(event.correlation, event.stream):
                self.deferred.append(event.stream)
                return self._write()
            return self._settle(handle, "interrupted", "superseded")
        return self._settle(handle, "completed", event.report)

    def refusal(self, correlation: Correlation, target: str) -> str | None:
        status = self.status.get(correlation.handle_id)
        return None if status == "active" else f"task {correlation.handle_id} is {status}"

    def turn_began(self, handle: str) -> None:
        self.begun.append(handle)

    def _settle(self, handle: str, status: str, why: str) -> Awaitable[None] | None:
        if self.status.get(handle) != "active":
            return None
        self.status[handle] = status
        self.settled.append((handle, status, why))
        return self._write()

    async def _write(self) -> None:
        await anyio.lowlevel.checkpoint()  # the task store's write
        self.writes += 1


def incident() -> dict[str, list[ScriptStep]]:
    return {"M": [T_("bash"), T_("task_await"), X("migration checked: 0 drifts")]}


async def test_td2_st15_a_host_owner_defers_through_the_claim_and_is_settled_by_the_resume() -> (
    None
):
    tasks = TaskStore()
    wakes = Wakes()
    tools = [HookTool("task_await", before=wakes.queue)]
    async with session_rig(incident(), tools=tools, owner=tasks) as r:
        tasks.engine = r.engine
        wakes.attach(r)
        r.session().enqueue("check the migration", kind=EntryKind.SYSTEM, correlation=JOB)
        await r.settle()
    assert tasks.deferred == ["s1/1"]  # the claim said yes: the cut is owed
    assert tasks.settled == [("job-31", "completed", "migration checked: 0 drifts")]
    assert tasks.writes == 2  # the defer and the settlement, each awaited by the target
    assert [(s.cause.value, s.handle) for s in r.of(StreamStarted)] == [
        ("queue", "job-31"),
        ("resume", "job-31"),
    ]
    assert tasks.begun == ["job-31", "job-31"]
    assert [e.outcome for e in r.of(ResumeAttempted)] == ["started"]


async def test_r41_a_host_owner_that_cancelled_the_task_refuses_the_resume() -> None:
    tasks = TaskStore()
    wakes = Wakes()

    def cancel_in_the_task_store(event: object) -> None:
        if isinstance(event, ResumeAttempted):
            return
        if tasks.deferred and tasks.status["job-31"] == "active":
            tasks.status["job-31"] = "cancelled"  # the host's own decision, told to nobody

    tools = [HookTool("task_await", before=wakes.queue)]
    async with session_rig(incident(), tools=tools, owner=tasks) as r:
        tasks.engine = r.engine
        wakes.attach(r)
        r.on(cancel_in_the_task_store)
        r.session().enqueue("check the migration", kind=EntryKind.SYSTEM, correlation=JOB)
        await r.settle()
    assert [e.outcome for e in r.of(ResumeAttempted)] == ["refused"]
    assert [s.cause.value for s in r.of(StreamStarted)] == ["queue"]
    assert "ChildForfeited" in tasks.heard
    assert tasks.settled == []  # cancelled already: the forfeit's settlement is a no-op
    assert r.models["M"].steps_played == 2


async def test_td4_td7_the_router_sends_each_event_to_the_owner_holding_its_handle() -> None:
    own = Delegations(
        clock=VirtualClock(),
        emit=lambda event: None,
        spawn=lambda work: None,
        write=_no_write,
        claimer=lambda target: None,
    )
    _, mine = own.open("lead-2", "worker-5", "review-8")
    tasks = TaskStore()
    owners = Owners(own, tasks)

    ours = ChildAborted(
        target="worker-5", correlation=mine, stream="worker-5/1", reason=AbortReason.SYSTEM
    )
    theirs = ChildAborted(
        target="worker-5", correlation=JOB, stream="worker-5/2", reason=AbortReason.SYSTEM
    )
    assert owners.on_child(ours) is None  # the engine's own: a system abort settles nothing
    assert tasks.heard == []
    owners.on_child(theirs)
    assert tasks.heard == ["ChildAborted"]
    whole = owners.on_child(ChildHardStopped(target="worker-5"))  # TD-7: both hear it
    assert tasks.heard == ["ChildAborted", "ChildHardStopped"]
    assert whole is not None  # the engine's own settles review-8
    await whole
    assert own.record("review-8").status.value == "interrupted"
    assert owners.refusal(mine, "worker-5") == "the handle review-8 is settled interrupted"
    assert owners.refusal(JOB, "worker-5") is None  # the host's answer for its own handle
    owners.turn_began("job-31")
    assert tasks.begun == ["job-31"]


async def _no_write(session: str, boundary: object) -> object:
    return None


async def test_td4_a_host_owner_hears_the_uncorrelated_ends_that_may_supersede_its_turns() -> None:
    tasks = TaskStore()
    async with session_rig({"M": [X("done")]}, owner=tasks) as r:
        tasks.engine = r.engine
        r.session().send("an unrelated question")
        await r.settle()
    assert tasks.heard == ["ChildEnded"]  # whether a turn of its own runs there is its call
