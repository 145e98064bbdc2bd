"""Honest outcomes and the overlap policy by declaration (``docs/operations.md``).

* A result that arrives before the terminal receipt is written is the result: ``completed``,
  and the model gets it, whatever was requested (a deadline, a person's cancel, a Stop).
* A tool whose transport broke mid-call (``ToolTransportLost``) is ``indeterminate``; one whose
  server is down (``ToolUnavailable``) is ``failed`` with outcome ``unavailable`` (not run).
* A tool declared read-only or idempotent (or ``overlap="warn"``) runs beside an indeterminate
  earlier call, with ``op-overlap-warned``; any other is blocked (OP-9).
* The overlap guard holds what nobody confirmed in the live process too: a provider call cut by
  its stream, a receipt the engine could not close at startup.
"""

from __future__ import annotations

import pytest

from agent_session import EngineConfig
from agent_session.harness.fakes import Faults, FaultyStore
from persistence import MemoryStore, OperationRecord, OpState, UsageError
from stream_manager import (
    Capability,
    FinishReason,
    FunctionTool,
    OpBlocked,
    OpOverlapWarned,
    OutcomeCode,
    ToolCallPart,
    ToolDefinition,
    ToolKind,
    VirtualClock,
    WriteFailed,
)
from stream_manager._op_guard import OverlapGuard, OverlapPolicy
from stream_manager._op_receipts import ProviderCalls, ReceiptWriter
from stream_manager._op_states import TRANSPORT_LOST, target_digest
from stream_manager.tools import declared_definition
from tests import store_kit
from tests.operations.support import (
    DEADLINE_S,
    GRACE_S,
    LiveModel,
    LiveStep,
    OpTool,
    call,
    last_results,
    odd,
    op_id,
    op_rig,
    provider_call,
    step,
    text,
)
from tests.operations.test_op_rules import A1, error_of, op_events, receipt_events

SALT = "a-salt-of-these-tests"


def _config(**changes: object) -> EngineConfig:
    base: dict[str, object] = {
        "max_stream_steps": 8,
        "tool_deadline_s": DEADLINE_S,
        "cancel_grace_s": GRACE_S,
        "receipt_salt": SALT,
    }
    return EngineConfig(**{**base, **changes})  # type: ignore[arg-type]


# ---------------------------------------------------------------- a result that raced the cancel


async def test_op2_a_result_inside_the_grace_interval_is_the_result_the_model_gets() -> None:
    a = OpTool("write_file", hang=True, on_cancel="finish", ack_delay_s=0.5, output={"wrote": 7})
    async with op_rig({"M": [step(call("write_file", path="/w")), text()]}, tools=[a]) as r:
        r.session().send("go")
        await r.settle()
        receipt = await r.receipt(A1)
        assert (receipt.state, receipt.outcome_code) == (OpState.COMPLETED, "ok")
        assert receipt.cancel_reason == "deadline"  # it was asked to stop; it answered first
        assert not receipt.resolved_late
        [result] = last_results(r.scripted())
        assert not result.is_error
        assert result.output == {"wrote": 7}  # not "timeout": it ran, and the model knows
        assert [e.state for e in receipt_events(r, A1)] == ["completed"]
        assert len(a.calls) == 1


async def test_op3_a_result_that_raced_a_persons_cancel_is_the_result_the_model_gets() -> None:
    a = OpTool("write_file", hang=True, on_cancel="finish", ack_delay_s=0.25, output={"wrote": 3})
    async with op_rig({"M": [step(call("write_file", path="/w")), text()]}, tools=[a]) as r:
        r.session().send("go")
        await r.run_until(1.0)
        assert r.engine.manager.operations.cancel_nowait(op_id=A1)
        await r.settle()
        receipt = await r.receipt(A1)
        assert (receipt.state, receipt.outcome_code) == (OpState.COMPLETED, "ok")
        assert receipt.cancel_reason == "user"
        [result] = last_results(r.scripted())
        assert (result.is_error, result.output) == (False, {"wrote": 3})


async def test_op3_an_error_answer_that_raced_the_cancel_is_the_answer() -> None:
    a = OpTool("render", hang=True, on_cancel="finish", ack_delay_s=0.5, fail="page too big")
    async with op_rig({"M": [step(call("render", page=4)), text()]}, tools=[a]) as r:
        r.session().send("go")
        await r.settle()
        receipt = await r.receipt(A1)
        assert (receipt.state, receipt.outcome_code) == (OpState.FAILED, "capability_error")
        [result] = last_results(r.scripted())
        assert result.is_error
        assert result.output == {"error": "page too big"}


# ---------------------------------------------------------------- transport lost, unavailable


async def test_op12_a_transport_lost_mid_call_is_indeterminate_and_holds_the_target() -> None:
    a = OpTool("deploy", raises="pipe closed", raises_as="lost")
    script = [step(call("deploy", env="prod")), step(call("deploy", env="prod")), text()]
    async with op_rig({"M": script}, tools=[a]) as r:
        r.session().send("go")
        await r.settle()
        receipt = await r.receipt(A1)
        assert receipt.state is OpState.INDETERMINATE
        assert receipt.outcome_code == OutcomeCode.TRANSPORT_LOST
        assert receipt.explanation == TRANSPORT_LOST
        assert not receipt.termination_acknowledged
        assert [(e.state, e.acknowledged) for e in receipt_events(r, A1)] == [
            ("indeterminate", False)
        ]
        # The model is told that nobody knows, and the identical retry is held (OP-9).
        first = r.scripted().requests[1]
        [told] = [t for m in first.messages for t in m.tool_results]
        assert told.is_error
        assert error_of(told.output)["error"] == "indeterminate"
        assert (await r.receipt(op_id(1, 2, 0))).blocked_by == A1
        assert len(a.calls) == 1


async def test_op12_an_unavailable_server_is_failed_unavailable_and_nothing_ran() -> None:
    a = OpTool("deploy", raises="the server is restarting", raises_as="unavailable")
    script = [step(call("deploy", env="prod")), step(call("deploy", env="prod")), text()]
    async with op_rig({"M": script}, tools=[a]) as r:
        r.session().send("go")
        await r.settle()
        receipt = await r.receipt(A1)
        assert (receipt.state, receipt.outcome_code) == (OpState.FAILED, "unavailable")
        assert receipt.outcome_code != OutcomeCode.CAPABILITY_ERROR
        assert receipt.termination_acknowledged  # nothing ran: nothing is unknown
        first = r.scripted().requests[1]
        [told] = [t for m in first.messages for t in m.tool_results]
        assert error_of(told.output)["error"] == "unavailable"
        # Nothing is held: the retry runs (and is unavailable again).
        again = await r.receipt(op_id(1, 2, 0))
        assert (again.state, again.outcome_code) == (OpState.FAILED, "unavailable")
        assert len(a.calls) == 2


# ---------------------------------------------------------------- overlap by declaration


def _declared(name: str, **flags: object) -> ToolDefinition:
    return ToolDefinition(name=name, **flags)  # type: ignore[arg-type]


def _indeterminate_then(tool: str) -> dict[str, list[object]]:
    return {
        "M": [
            step(odd(tool, {"hang": True, "on_cancel": "ignore"}, path="/etc/x")),
            step(call(tool, path="/etc/x")),
            text(),
        ]
    }


@pytest.mark.parametrize("flags", [{"read_only": True}, {"idempotent": True}, {"overlap": "warn"}])
async def test_op9_a_tool_declared_safe_to_overlap_runs_with_a_warning(
    flags: dict[str, object],
) -> None:
    a = OpTool("read", definition=_declared("read", **flags))
    async with op_rig(_indeterminate_then("read"), tools=[a]) as r:  # type: ignore[arg-type]
        r.session().send("go")
        await r.settle()
        assert (await r.receipt(A1)).state is OpState.INDETERMINATE
        second = op_id(1, 2, 0)
        assert (await r.receipt(second)).state is OpState.COMPLETED
        assert r.of(OpBlocked) == []
        [warned] = r.of(OpOverlapWarned)
        assert (warned.op, warned.tool, warned.overlaps) == (second, "read", A1)
        assert op_events(r, second)[:2] == ["op-overlap-warned", "op-start"]
        assert len(a.calls) == 2


@pytest.mark.parametrize(
    ("flags", "policy"),
    [({}, "block"), ({"read_only": True, "overlap": "block"}, "block"), ({}, "session")],
)
async def test_op9_any_other_tool_is_blocked(flags: dict[str, object], policy: str) -> None:
    a = OpTool("write", definition=_declared("write", **flags))
    script = _indeterminate_then("write")
    async with op_rig(script, tools=[a], config=_config(overlap_policy=policy)) as r:  # type: ignore[arg-type]
        r.session().send("go")
        await r.settle()
        assert (await r.receipt(op_id(1, 2, 0))).blocked_by == A1
        assert r.of(OpOverlapWarned) == []
        assert len(a.calls) == 1


async def test_op9_a_function_tool_declares_how_it_may_overlap() -> None:
    async def fetch(url: str) -> str:
        return url

    tool = FunctionTool(fetch, read_only=True, idempotent=True)
    assert (tool.definition.read_only, tool.definition.idempotent) == (True, True)
    assert FunctionTool(fetch, overlap="block").definition.overlap == "block"
    with pytest.raises(UsageError, match="overlap"):
        FunctionTool(fetch, overlap="sometimes")


def test_op9_a_declaration_with_an_unknown_overlap_is_refused() -> None:
    with pytest.raises(UsageError, match="overlap"):
        declared_definition("x", type("T", (), {"definition": _declared("x", overlap="never")}))


# ---------------------------------------------------------------- OP-11: the salt


def test_op11_the_target_digest_is_keyed_by_its_salt() -> None:
    capability = Capability(ToolKind.CLIENT, "bash")
    args = {"cmd": "rm -rf /tmp/x", "n": 3}
    first = target_digest(capability, args, "salt-one")
    assert first == target_digest(capability, dict(reversed(args.items())), "salt-one")
    assert first != target_digest(capability, args, "salt-two")
    assert first != target_digest(capability, {**args, "n": 4}, "salt-one")
    assert first.startswith("client:bash#")


# ---------------------------------------------------------------- the live guard


async def test_op9_op7_a_provider_call_cut_by_its_stream_is_held_in_the_live_process() -> None:
    a = OpTool("a")
    model = LiveModel(
        "P",
        [
            LiveStep((provider_call("p0", q="weather"),), then="error"),
            LiveStep(
                (ToolCallPart(call_id="c1", name="a", args={"n": 1}),),
                finish=FinishReason.TOOL_CALLS,
            ),
        ],
    )
    config = _config(overlap_policy="session")
    async with op_rig(models=[model], tools=[a], sessions=(("s1", "P"),), config=config) as r:
        r.session().send("search")
        await r.settle()
        cut = await r.receipt("s1/1/1/p0")
        assert cut.state is OpState.INDETERMINATE
        r.session().send("now a client call")  # same process: no restart reloads the guard
        await r.settle()
        blocked = await r.receipt(op_id(2, 1, 0))
        assert blocked.blocked_by == cut.op_id
        assert a.calls == []


async def test_op9_op7_cut_provider_calls_whose_receipts_fail_to_write_are_held_all() -> None:
    faults = Faults()
    store = FaultyStore(MemoryStore.opened(), faults)
    guard = OverlapGuard(OverlapPolicy.BLOCK, store)
    clock = VirtualClock()
    writer = ReceiptWriter(store=store, owner=lambda: store.owner, emit=None)
    calls = ProviderCalls(clock=clock, salt=SALT, receipts=writer, guard=guard, emit=None)
    parts = [provider_call("p0", q="1"), provider_call("p1", q="2")]
    for index, part in enumerate(parts):
        await calls.started(session="s1", stream="s1/1", step=1, index=index, call=part)
    faults.arm("store_write", 2)
    with pytest.raises(WriteFailed):
        await calls.cut("s1/1")
    capability = Capability(ToolKind.PROVIDER, "web_search")
    for index, part in enumerate(parts):
        target = target_digest(capability, part.args, SALT)
        assert guard.blocker("next", "s1", capability, target) == f"s1/1/1/p{index}"


async def test_op9_a_receipt_the_engine_could_not_close_at_startup_is_held() -> None:
    capability = Capability(ToolKind.CLIENT, "a")
    left = OperationRecord(
        op_id="s1/0/1/0",
        session="s1",
        stream="s1/0",
        call_id="c0",
        capability=capability,
        target=target_digest(capability, {"path": "/x"}, SALT),
        started_at=0.0,
        deadline_at=DEADLINE_S,
        state=OpState.RUNNING,
    )
    inner = MemoryStore()
    async with inner as seeding:
        await store_kit.put_receipts(seeding, left)
    faults = Faults()
    faults.arm("store_write", 1)  # the close at startup fails
    a = OpTool("a")
    script = {"M": [step(call("a", path="/x")), text()]}
    async with op_rig(script, tools=[a], store=FaultyStore(inner, faults), config=_config()) as r:
        assert (await r.receipt(left.op_id)).state is OpState.RUNNING  # still open in the store
        r.session().send("go")
        await r.settle()
        blocked = await r.receipt(op_id(1, 1, 0))
        assert blocked.blocked_by == left.op_id
        assert a.calls == []
