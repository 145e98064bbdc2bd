"""AS-13, AS-14, AS-2: an idle session never holds a live entry, whatever made it idle.

A user message sent while a Stop (or a hard stop) is landing is queued behind the stopping
turn: the session is busy until the abort settles. When it then goes idle, the drain runs, so
the message is sent; before, it was left queued with the session idle (issue 20, item 1).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import anyio
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from agent_session import AgentSession, EngineEvent, Phase
from agent_session.cli import main
from agent_session.harness.fakes import Faults, FaultyStore
from agent_session.harness.virtual_time import busy_sessions
from message_queue import EntryKind, NewMessage
from persistence import MemoryStore
from stream_manager import FunctionModel, ModelRequest, ScriptStep, StreamAborted
from tests.agent_session.support import T_, HookTool, Rig, X, session_rig


def _texts(request: ModelRequest) -> list[str]:
    return [message.text for message in request.messages]


async def _send_while_the_abort_lands(*, hard: bool) -> Rig:
    script = [ScriptStep(text="half an answer", hang=True), X("answered the follow-up")]
    async with session_rig({"M": script}) as r:
        session = r.session()

        def send_at_abort(event: EngineEvent) -> None:
            if isinstance(event, StreamAborted):
                session.send("follow-up typed during the stop")

        r.on(send_at_abort)
        session.send("first request")
        await anyio.wait_all_tasks_blocked()
        if hard:
            session.hard_stop()
        else:
            session.stop()
        await r.settle()
        assert session.phase is Phase.IDLE
        assert len(session.queue) == 0, "an idle session holds a live entry"
        return r


async def test_as13_a_message_sent_while_a_stop_lands_is_sent() -> None:
    r = await _send_while_the_abort_lands(hard=False)
    last = r.models["M"].requests[-1]
    assert "follow-up typed during the stop" in _texts(last)


async def test_as13_a_message_sent_while_a_hard_stop_lands_is_sent() -> None:
    r = await _send_while_the_abort_lands(hard=True)
    last = r.models["M"].requests[-1]
    assert "follow-up typed during the stop" in _texts(last)


# ---------------------------------------------------------------- generated interleavings


def _withdraw_a_wake(session: AgentSession, _: Faults, __: int) -> None:
    live = [e.id for e in session.queue if not e.withdrawn and e.kind is EntryKind.WAKE]
    if live:
        session.withdraw(live[0], "generated withdrawal")


#: What the host (or a fault) does at an event, by name; ``n`` numbers the action.
_ACTIONS: dict[str, Callable[[AgentSession, Faults, int], object]] = {
    "send": lambda session, _, n: session.send(f"user message {n}"),
    "wake": lambda session, _, n: session.enqueue(f"wake {n}", kind=EntryKind.WAKE, entry=f"w{n}"),
    "withdraw": _withdraw_a_wake,
    "stop": lambda session, _, __: session.stop(),
    "hard stop": lambda session, _, __: session.hard_stop(),
    "send now": lambda session, _, __: session.send_now(),
    "clear": lambda session, _, __: session.clear_queue("generated clear"),
    "fail write": lambda _, faults, __: faults.arm("store_write", 1),
    "fail gate": lambda _, faults, __: faults.arm("pre_stream", 1),
}
#: What the model does at its n-th request (cycled): text, a quick or slow tool call, errors.
_STEPS = {
    "text": X("plain answer"),
    "tool": T_("bash"),
    "slow": T_("slow"),
    "retryable": ScriptStep(error="retryable"),
    "terminal": ScriptStep(error="terminal"),
}


@st.composite
def _plans(draw: st.DrawFn) -> tuple[list[str], list[tuple[int, str]]]:
    steps = draw(st.lists(st.sampled_from(sorted(_STEPS)), min_size=1, max_size=6))
    actions = draw(
        st.lists(st.tuples(st.integers(0, 60), st.sampled_from(sorted(_ACTIONS))), max_size=12)
    )
    return steps, sorted(actions, key=lambda a: a[0])


async def _run_plan(steps: list[str], actions: list[tuple[int, str]]) -> None:
    faults = Faults()
    store = FaultyStore(MemoryStore(), faults)
    count = {"requests": 0, "events": 0, "entries": 0}

    def answer(request: ModelRequest) -> ScriptStep:
        count["requests"] += 1
        return _STEPS[steps[(count["requests"] - 1) % len(steps)]]

    model = FunctionModel("M", answer)
    async with session_rig(
        {},
        models=[model],
        tools=[HookTool("bash", duration_s=0.03), HookTool("slow", duration_s=0.4)],
        store=store,
        gate=faults,
    ) as r:
        session = r.session()
        pending = list(actions)

        def act(what: str) -> None:
            count["entries"] += 1
            if not session.disposed:
                _ACTIONS[what](session, faults, count["entries"])

        failures: list[BaseException] = []

        def on_event(_: EngineEvent) -> None:
            count["events"] += 1
            try:
                while pending and pending[0][0] <= count["events"]:
                    act(pending.pop(0)[1])
            except Exception as error:  # an observer's error is only logged: keep it
                failures.append(error)

        r.on(on_event)
        session.send("the first request")
        await r.settle()
        while pending:  # what the run never reached happens at quiescence, then settles
            act(pending.pop(0)[1])
            await r.settle()
        assert not failures, failures
        assert session.phase is Phase.IDLE
        assert len(session.queue) == 0, f"idle with queued entries: {session.queue!r}"


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=_plans())
def test_as13_as14_no_session_is_idle_with_a_queued_entry_after_any_interleaving(
    plan: tuple[list[str], list[tuple[int, str]]],
) -> None:
    """Sends, wakes, withdrawals, Stops, hard stops, send-now, clears, failed writes and
    refused launches at any event: at quiescence the session is idle with an empty queue."""
    steps, actions = plan
    anyio.run(_run_plan, steps, actions)


# ---------------------------------------------------------------- the harness and the CLI

_SEND_DURING_STOP = """
name = "a message typed while a Stop lands"
[[models]]
id = "m"
[[sessions]]
id = "s1"
model = "m"
[[tools]]
name = "bash"
hang = true
[scripts.m]
steps = [{ tool_calls = [{ tool = "bash" }] }, { text = "answered the follow-up" }]
[[actions]]
at = "start"
do = { op = "send", session = "s1", text = "run the tests" }
[[actions]]
at = { event = "tool-call-start", session = "s1", nth = 1 }
do = { op = "STOP", session = "s1" }
[[actions]]
at = { event = "stream-abort", session = "s1", nth = 1 }
do = { op = "send", session = "s1", text = "and then lint" }
[expect]
phases = { s1 = "idle" }
streams = { s1 = 2 }
"""


@pytest.mark.parametrize("stop", ["stop", "hard_stop"])
def test_as13_a_scenario_sending_while_a_stop_lands_sends_it(tmp_path: Path, stop: str) -> None:
    scenario = tmp_path / "send-during-stop.toml"
    scenario.write_text(_SEND_DURING_STOP.replace("STOP", stop))
    trace = tmp_path / "trace.jsonl"
    assert main(["run", str(scenario), "--memory", "--trace", str(trace)]) == 0
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    starts = [e["cause"] for e in events if e["event"] == "stream-start"]
    assert starts == ["send", "queue"]


async def test_as13_the_harness_fails_a_run_left_idle_holding_an_entry() -> None:
    async with session_rig({"M": [X()]}) as r:
        session = r.session()
        assert busy_sessions(r.engine) == []
        session.queue.add(NewMessage(text="nobody sends this", kind=EntryKind.WAKE))
        (found,) = busy_sessions(r.engine)
        assert found.endswith("is idle holding queued entries")
