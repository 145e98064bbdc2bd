"""A tool's capability is a typed pair (kind, name); receipts store and show it as ``kind:name``.

The overlap guard (OP-9) and the target (OP-11) are built from the pair; what a receipt stores
is its text, byte for byte what it always was, and a stored value of another shape is a
``CorruptRecord`` naming the table, the receipt and the field.
"""

from __future__ import annotations

import msgspec
import pytest

from persistence import CorruptRecord, OperationRecord, OpState
from persistence._decode import decode_operation
from stream_manager import Capability, ToolKind
from stream_manager._op_states import requested, target_digest

_ENCODE = msgspec.json.Encoder().encode


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


def test_op11_the_receipt_stores_the_capability_as_its_kind_name_text() -> None:
    capability = Capability(kind=ToolKind.PROVIDER, name="web_search")
    record = receipt(capability)
    assert capability.text == "provider:web_search"
    assert record.capability == "provider:web_search"
    assert record.target.startswith("provider:web_search#")
    assert b'"capability":"provider:web_search"' in _ENCODE(record)


@pytest.mark.parametrize("kind", list(ToolKind))
def test_op11_every_tool_kind_reads_back_from_a_stored_receipt(kind: ToolKind) -> None:
    record = receipt(Capability(kind=kind, name="mcp:files:read"))  # a name may hold colons
    assert decode_operation((record.op_id, record.state.value, _ENCODE(record))) == record


@pytest.mark.parametrize(
    "stored",
    ["bash", "client:", "weird:bash", ":bash", "Client:bash"],
)
def test_op11_a_stored_capability_of_another_shape_is_a_corrupt_record(stored: str) -> None:
    record = msgspec.structs.replace(
        receipt(Capability(ToolKind.CLIENT, "bash")), capability=stored
    )
    with pytest.raises(CorruptRecord) as caught:
        decode_operation((record.op_id, OpState.REQUESTED.value, _ENCODE(record)))
    assert (caught.value.table, caught.value.key) == ("operations", "s1/1/1/0")
    assert caught.value.detail.startswith("$.capability: ")
