"""Admission of a resume: the goal, the workspace and the handle, asked again up to the launch.

ST-8 (the read after the claim), ST-9 (the combined probe at every launch checkpoint), R8 and
R12 (a goal that no longer admits), R17 (the probe threaded to the stream manager), R41
(workspace and handle admission), R34 (a refused launch leaves no sentinel), ST-6 and R24 (a
refusal forfeits and settles the owner). The scenario ``crew-3`` works towards the goal
``g-41``; its first stream is cut at the tool boundary by a wake that is withdrawn at the
stream's end, so the sweep resumes the cut turn, and each test moves the goal or the workspace
at one point of that resume.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_session import EngineConfig, PreStreamFailure, ResumeAttempted
from agent_session._admission import (
    Admission,
    AdmissionUnreadable,
    GoalBoard,
    GoalState,
    WorkspaceBoard,
    WorkspaceState,
    WorkspaceStatus,
)
from agent_session.harness import load_scenario
from agent_session.harness.loader import ScenarioError
from agent_session.harness.runner import SUPPORTED_OPS, RunResult, run_scenario
from message_queue import Correlation
from persistence import HandleStatus, MemoryStore, RowKind, SqliteStore, Store
from stream_manager import StreamStarted
from tests import store_kit
from tests.agent_session.support import T_, HookTool, X, session_rig
from tests.agent_session.test_st_rules import Gate, Wakes, reach

HEAD = """
name = "admission"

[engine]
max_stream_steps = 6

[[models]]
id = "alpha"

[[tools]]
name = "bash"
result = "started"

[[tools]]
name = "job_wait"
duration_ms = 40
result = "job 5 exited 0"

[[sessions]]
id = "crew-3"
model = "alpha"
goal = "g-41"

[scripts.alpha]
steps = [
  { tool_calls = [{ tool = "bash", args = { cmd = "make &" } }] },
  { tool_calls = [{ tool = "job_wait" }] },
  { text = "built" },
]

[[actions]]
at = "start"
do = { op = "send", session = "crew-3", text = "build it" }

[[actions]]
at = { event = "op-start", tool = "job_wait", nth = 1 }
do = { op = "enqueue", session = "crew-3", entry = "done-7", kind = "wake", text = "job 5 done" }

[[actions]]
at = { event = "stream-end", session = "crew-3", nth = 1 }
do = { op = "withdraw", session = "crew-3", entry = "done-7" }
"""

#: The trigger at which each checkpoint's change lands.
AT_READ = '{ event = "withdrawn", session = "crew-3" }'  # before the sweep reads admission
AT_HISTORY = '{ event = "persisted", what = "sentinel" }'  # after the history read
AT_ENVELOPE = '{ event = "persisted", what = "envelope", nth = 2 }'  # the resume's stream


def at(trigger: str, do: str) -> str:
    return f"\n[[actions]]\nat = {trigger}\ndo = {do}\n"


def goal(state: str) -> str:
    return f'{{ op = "goal", session = "crew-3", state = "{state}" }}'


def workspace(state: str) -> str:
    return f'{{ op = "workspace", session = "crew-3", state = "{state}" }}'


async def run(tmp_path: Path, kind: str, text: str) -> tuple[RunResult, Store]:
    path = tmp_path / "admission.toml"
    path.write_text(text, encoding="utf-8")
    scenario = load_scenario(path, supported_ops=SUPPORTED_OPS)
    store: Store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "a.db")
    result = await run_scenario(scenario, store)
    assert result.error is None, result.error  # a model call past the script would be one
    return result, store


def events(result: RunResult, name: str) -> list[dict[str, object]]:
    return [line for line in result.trace if line["event"] == name]


async def rows(store: Store) -> list[RowKind]:
    async with store:
        return [row.kind for row in await store_kit.history(store, "crew-3")]


def assert_forfeited_without_a_stream(result: RunResult, why: str) -> None:
    starts = [line["stream"] for line in events(result, "stream-start")]
    assert starts == ["crew-3/1"]  # the resume's stream never started
    (resume,) = events(result, "resume")  # one attempt: a refusal is not retried (R12)
    assert (resume["cut"], resume["attempt"], resume["outcome"]) == ("crew-3/1", 1, "refused")
    (ended,) = events(result, "continuation-ended")
    assert ended["how"] == "forfeited"
    assert why in str(ended["why"])


STORES = ["memory", "sqlite"]


@pytest.mark.parametrize("kind", STORES)
async def test_st8_r8_a_goal_paused_before_the_sweep_refuses_the_resume_at_its_read(
    tmp_path: Path, kind: str
) -> None:
    result, store = await run(tmp_path, kind, HEAD + at(AT_READ, goal("paused")))

    assert_forfeited_without_a_stream(result, "the goal g-41 no longer admits work (paused)")
    assert events(result, "launch-refused") == []  # refused at the read: nothing was launched
    assert RowKind.SENTINEL not in await rows(store)  # no [CONTINUE] was appended


@pytest.mark.parametrize("state", ["replaced", "complete"])
async def test_r8_a_replaced_or_completed_goal_refuses_the_resume_too(
    tmp_path: Path, state: str
) -> None:
    result, _ = await run(tmp_path, "memory", HEAD + at(AT_READ, goal(state)))
    assert_forfeited_without_a_stream(result, f"no longer admits work ({state})")


@pytest.mark.parametrize("kind", STORES)
async def test_r12_r17_st9_r34_a_goal_paused_after_the_history_read_refuses_before_registration(
    tmp_path: Path, kind: str
) -> None:
    result, store = await run(tmp_path, kind, HEAD + at(AT_HISTORY, goal("paused")))

    assert_forfeited_without_a_stream(result, "g-41")
    (refused,) = events(result, "launch-refused")
    assert refused["why"] == "the goal g-41 no longer admits work (paused)"
    assert RowKind.SENTINEL not in await rows(store)  # R34: the appended sentinel is deleted
    assert [line["what"] for line in events(result, "persisted")].count("envelope") == 1


@pytest.mark.parametrize("kind", STORES)
async def test_st9_a_goal_paused_during_the_envelope_write_refuses_after_it(
    tmp_path: Path, kind: str
) -> None:
    result, store = await run(tmp_path, kind, HEAD + at(AT_ENVELOPE, goal("paused")))

    assert_forfeited_without_a_stream(result, "g-41")  # and no model call: the script ran out
    (refused,) = events(result, "launch-refused")
    assert "g-41" in str(refused["why"])
    assert RowKind.SENTINEL not in await rows(store)


@pytest.mark.parametrize("state", ["renaming", "archived", "removed"])
async def test_r41_a_workspace_that_is_not_ok_refuses_the_resume_at_its_read(
    tmp_path: Path, state: str
) -> None:
    result, store = await run(tmp_path, "memory", HEAD + at(AT_READ, workspace(state)))

    assert_forfeited_without_a_stream(result, f"the workspace of crew-3 is {state}")
    assert RowKind.SENTINEL not in await rows(store)


@pytest.mark.parametrize("kind", STORES)
async def test_st9_r41_a_stop_epoch_moved_during_the_launch_refuses_it(
    tmp_path: Path, kind: str
) -> None:
    # a rename starts and finishes between the read and the launch: the state is ok again,
    # but the stop epoch the resume was admitted under moved
    text = HEAD + at(AT_HISTORY, workspace("renaming")) + at(AT_HISTORY, workspace("ok"))
    result, store = await run(tmp_path, kind, text)

    assert_forfeited_without_a_stream(result, "was stopped (epoch 2)")
    assert RowKind.SENTINEL not in await rows(store)


async def test_st8_a_goal_back_to_active_before_the_sweep_lets_the_resume_run(
    tmp_path: Path,
) -> None:
    text = HEAD + at(AT_READ, goal("paused")) + at(AT_READ, goal("active"))
    result, _ = await run(tmp_path, "memory", text)

    assert [line["outcome"] for line in events(result, "resume")] == ["started"]
    assert [line["cause"] for line in events(result, "stream-start")] == ["send", "resume"]


@pytest.mark.parametrize("kind", STORES)
async def test_r8_the_goal_rides_in_the_cut_record_and_is_asked_again_after_a_restart(
    tmp_path: Path, kind: str
) -> None:
    # the engine dies at the cut; the goal is paused while it is down; the next engine's
    # recovery resume asks the goal of the durable cut record and forfeits
    text = HEAD.replace(
        'do = { op = "withdraw", session = "crew-3", entry = "done-7" }',
        'do = { op = "crash" }',
    ) + at('{ event = "crash" }', goal("paused"))
    result, _ = await run(tmp_path, kind, text)

    assert [line["outcome"] for line in events(result, "resume")] == ["refused"]
    assert [line["stream"] for line in events(result, "stream-start")] == ["crew-3/1"]


def test_a_goal_op_on_a_session_without_a_goal_is_a_scenario_error(tmp_path: Path) -> None:
    path = tmp_path / "no-goal.toml"
    path.write_text(HEAD.replace('goal = "g-41"\n', "") + at(AT_READ, goal("paused")))
    with pytest.raises(ScenarioError, match="session: 'crew-3' declares no goal to move"):
        load_scenario(path, supported_ops=SUPPORTED_OPS)


# ---------------------------------------------------------------- the delegated handle (R41)


def owner_rig_sessions() -> tuple[tuple[str, str], ...]:
    return (("s1", "M"), ("lead-4", "M"))


async def test_r41_a_handle_settled_while_the_resume_waits_refuses_it_at_the_read() -> None:
    gate = Gate()
    held = gate.hold("resume", 1)
    wakes = Wakes()
    script = {"M": [T_("bash"), T_("task_await"), X("never")]}
    tools = [HookTool("task_await", before=wakes.queue)]
    async with session_rig(script, tools=tools, gate=gate, sessions=owner_rig_sessions()) as r:
        wakes.attach(r)
        delegation = r.engine.delegate("lead-4", "s1", "task-88", "run it")
        await reach(held.reached)  # the owner deferred; the resume waits at the pricing gate
        assert r.engine.delegations.record("task-88").deferred == ("s1/1",)
        # the owner gives up on its own (its wait timed out), without touching the stream
        r.engine.delegations.settle_orphan("task-88", "the owner's wait timed out")
        held.release()
        await r.settle()
        settled = await delegation.settled()
        kinds = await r.kinds()
    assert settled.status is HandleStatus.INTERRUPTED
    assert settled.reason == "the owner's wait timed out"  # the forfeit's settlement: a no-op
    assert [e.stream for e in r.of(StreamStarted)] == ["s1/1"]
    assert r.models["M"].steps_played == 2  # the resume never reached the model
    assert RowKind.SENTINEL not in kinds


# ---------------------------------------------------------------- the ports


async def test_st10_an_admission_port_that_raises_fails_the_attempt_instead_of_refusing() -> None:
    class Flaky(GoalBoard):
        def __init__(self) -> None:
            super().__init__()
            self.raises = 1

        def goal_state(self, goal: str) -> GoalState:
            if self.raises:
                self.raises -= 1
                raise OSError("the goal service is unreachable")
            return super().goal_state(goal)

    wakes = Wakes()
    script = {"M": [T_("bash"), T_("task_await"), X("resumed")]}
    tools = [HookTool("task_await", before=wakes.queue)]
    async with session_rig(script, tools=tools, config=EngineConfig(max_stream_steps=9)) as r:
        r.engine._admission._goals = goals = Flaky()
        r.engine.session("s1")._machine.goal = "g-2"
        wakes.attach(r)
        r.session().send("start")
        await r.settle()
    outcomes = [(e.attempt, e.outcome) for e in r.of(ResumeAttempted)]
    assert outcomes == [(1, "failed"), (2, "started")]  # counted toward the cap, then retried
    assert goals.raises == 0


def test_st9_the_probe_refuses_on_any_of_its_three_conditions() -> None:
    goals, workspaces = GoalBoard(), WorkspaceBoard()
    handles: dict[str, str | None] = {"h-5": None}
    c = Correlation(handle_id="h-5", owner_session="lead-4", turn_id="t-2")
    admission = Admission(goals, workspaces, lambda corr, target: handles[corr.handle_id])
    workspaces.set("s9", WorkspaceState.ARCHIVED)
    assert admission.admit("s9", "g-3", c) == "the workspace of s9 is archived"
    workspaces.set("s9", WorkspaceState.OK)
    ticket = admission.admit("s9", "g-3", c)
    assert not isinstance(ticket, str)
    assert (ticket.epoch, ticket.refusal()) == (2, None)
    goals.set("g-3", GoalState.PAUSED)
    assert ticket.refusal() == "the goal g-3 no longer admits work (paused)"
    goals.set("g-3", GoalState.ACTIVE)
    handles["h-5"] = "the handle h-5 is settled interrupted"
    assert ticket.refusal() == "the handle h-5 is settled interrupted"
    handles["h-5"] = None
    workspaces.set("s9", WorkspaceState.OK)  # a stop that ended: the epoch moved anyway
    assert ticket.refusal() == "the workspace of s9 was stopped (epoch 3)"
    assert workspaces.workspace_status("s1") == WorkspaceStatus()


def test_st10_a_probe_that_cannot_read_refuses_and_keeps_the_error() -> None:
    class Down(WorkspaceBoard):
        down = False

        def workspace_status(self, session: str) -> WorkspaceStatus:
            if self.down:
                raise RuntimeError("registry down")
            return super().workspace_status(session)

    workspaces = Down()
    admission = Admission(GoalBoard(), workspaces, lambda corr, target: None)
    ticket = admission.admit("s9", None, None)
    assert not isinstance(ticket, str)
    workspaces.down = True
    assert ticket.refusal() == "admission could not be read: RuntimeError('registry down')"
    assert isinstance(ticket.error, AdmissionUnreadable)
    assert isinstance(ticket.error, PreStreamFailure)  # a failure before start (ST-10)
    with pytest.raises(AdmissionUnreadable):
        admission.admit("s9", None, None)


DELEGATED = (
    HEAD.replace(
        '[[actions]]\nat = "start"\ndo = { op = "send", session = "crew-3", text = "build it" }',
        '[[sessions]]\nid = "lead-4"\nmodel = "alpha"\n\n[[actions]]\nat = "start"\n'
        'do = { op = "delegate", owner = "lead-4", target = "crew-3", handle = "task-88", '
        'text = "build it" }',
    )
    + '\n[expect]\nhandles = { task-88 = "interrupted" }\n'
)


@pytest.mark.parametrize("kind", STORES)
async def test_r24_st6_a_goal_refusal_of_a_delegated_resume_settles_its_owner(
    tmp_path: Path, kind: str
) -> None:
    result, store = await run(tmp_path, kind, DELEGATED + at(AT_HISTORY, goal("paused")))

    assert result.failures == []
    assert [(line["answer"]) for line in events(result, "claim")] == ["defer"]
    (settled,) = events(result, "settled")  # exactly once, after the refusal
    assert (settled["handle"], settled["status"]) == ("task-88", "interrupted")
    async with store:
        (record,) = (await store.handles()).records
    assert record.reason == "admission refused: the goal g-41 no longer admits work (paused)"
    assert record.deferred == ()


# ---------------------------------------------------------------- follow-ups (TD-8, R41, R51)

#: The delegated turn is cut by a wake that stays live: its dispatch continues the turn.
LIVE_WAKE = DELEGATED.replace(
    '[[actions]]\nat = { event = "stream-end", session = "crew-3", nth = 1 }\n'
    'do = { op = "withdraw", session = "crew-3", entry = "done-7" }\n',
    "",
)
STOP_HANDLE = '{ op = "handle", handle = "task-88", state = "interrupted" }'


@pytest.mark.parametrize("kind", STORES)
async def test_td8_r41_a_follow_up_dispatching_when_its_handle_is_stopped_is_refused(
    tmp_path: Path, kind: str
) -> None:
    at_dispatch = '{ event = "dequeued", session = "crew-3", entry = "done-7" }'
    result, store = await run(tmp_path, kind, LIVE_WAKE + at(at_dispatch, STOP_HANDLE))

    assert result.failures == []
    assert [line["stream"] for line in events(result, "stream-start")] == ["crew-3/1"]
    (refused,) = events(result, "launch-refused")
    assert refused["why"] == "the handle task-88 is settled interrupted"
    assert [line["status"] for line in events(result, "settled")] == ["interrupted"]
    assert await rows(store) == [RowKind.USER, RowKind.ASSISTANT]
    persisted = [line["what"] for line in events(result, "persisted")]
    assert persisted.count("user-row") == 1  # refused before the wake's row was written


@pytest.mark.parametrize("kind", STORES)
async def test_r51_a_follow_up_refused_at_its_launch_takes_its_row_back(
    tmp_path: Path, kind: str
) -> None:
    at_row = '{ event = "persisted", what = "user-row", nth = 2 }'  # the wake's row is durable
    result, store = await run(tmp_path, kind, LIVE_WAKE + at(at_row, STOP_HANDLE))

    assert result.failures == []
    assert [line["stream"] for line in events(result, "stream-start")] == ["crew-3/1"]
    (refused,) = events(result, "launch-refused")
    assert refused["why"] == "the handle task-88 is settled interrupted"
    assert await rows(store) == [RowKind.USER, RowKind.ASSISTANT]  # its row was deleted
