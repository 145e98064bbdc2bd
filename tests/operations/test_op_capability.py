"""A tool's capability is a typed pair (kind, name), end to end (OP-9, OP-11).

The runner builds the pair, the receipt holds it, the overlap guard and the target are built
from it, and the engine reads the tool's name off it; only the store turns it into its text
(``client:bash``) and back (``tests/persistence/test_capability.py``).
"""

from __future__ import annotations

import pytest

from persistence import OperationRecord, OpState
from stream_manager import Capability, OutcomeCode, ToolKind
from stream_manager._op_states import requested, target_digest
from tests import store_kit
from tests.operations.conftest import Backend
from tests.operations.support import DEADLINE_S, OpTool, call, op_id, op_rig, step, text
from tests.operations.test_op_rules import receipt_events


def receipt(capability: Capability) -> OperationRecord:
    return requested(
        op_id="s1/1/1/0",
        session="s1",
        stream="s1/1",
        call_id="c0",
        capability=capability,
        target=target_digest(capability, {"path": "/tmp/x"}, "salt"),
        now=12.5,
        deadline_at=72.5,
    )


def test_op11_the_receipt_holds_the_pair_and_the_target_leads_with_its_text() -> None:
    capability = Capability(kind=ToolKind.PROVIDER, name="web_search")
    record = receipt(capability)
    assert record.capability == capability
    assert (record.capability.kind, record.capability.name) == (ToolKind.PROVIDER, "web_search")
    assert capability.text == "provider:web_search"
    assert record.target.startswith("provider:web_search#")


def test_op11_the_pair_is_stream_managers_and_persistences_one_type() -> None:
    from persistence import records

    assert Capability is records.Capability
    assert ToolKind is records.ToolKind
    assert [kind.value for kind in ToolKind] == ["client", "provider", "completion"]


@pytest.mark.parametrize("kind", list(ToolKind))
def test_op9_the_same_name_under_another_kind_is_another_capability(kind: ToolKind) -> None:
    pair = Capability(kind, "bash")
    others = [Capability(other, "bash") for other in ToolKind if other is not kind]
    assert all(pair != other for other in others)
    assert all(
        target_digest(pair, {"a": 1}, "s") != target_digest(other, {"a": 1}, "s")
        for other in others
    )


async def test_op11_the_runner_writes_the_pair_of_the_tools_kind_and_name(
    backend: Backend,
) -> None:
    a = OpTool("mcp:files:read")  # a name may hold colons
    async with op_rig(
        {"M": [step(call("mcp:files:read", path="/x")), text()]}, tools=[a], store=backend.make()
    ) as r:
        r.session().send("go")
        await r.settle()
        record = await r.receipt(op_id(1, 1, 0))
    assert record.state is OpState.COMPLETED
    assert record.capability == Capability(ToolKind.CLIENT, "mcp:files:read")
    assert record.target.startswith("client:mcp:files:read#")


async def test_op7_a_receipt_left_open_is_told_with_its_tools_whole_name(
    backend: Backend,
) -> None:
    # The engine's restart pass names the tool by the pair's name, never by re-parsing text.
    left = OperationRecord(
        op_id="s0/1/1/0",
        session="s0",
        stream="s0/1",
        call_id="c0",
        capability=Capability(ToolKind.CLIENT, "mcp:files:read"),
        target="client:mcp:files:read#0",
        started_at=0.0,
        deadline_at=DEADLINE_S,
        state=OpState.RUNNING,
    )
    async with backend.make() as seeding:
        await store_kit.put_receipts(seeding, left)
    async with op_rig({"M": [text()]}, store=backend.make()) as r:
        [event] = receipt_events(r, left.op_id)
        closed = await r.receipt(left.op_id)
    assert event.tool == "mcp:files:read"
    assert (event.state, closed.state) == ("indeterminate", OpState.INDETERMINATE)
    assert closed.outcome_code == OutcomeCode.PROCESS_RESTART
    assert closed.capability == left.capability
