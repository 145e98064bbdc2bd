"""A hypothesis state machine over the MessageQueue (MQ-2, MQ-7, MQ-8, MQ-9, MQ-14, MQ-16).

The machine keeps a small model beside the queue: the order of entry ids, which keys are held
by which entry, which entries left and how, and how often each callback ran. It does not
re-implement batching; it trusts the queue's ``into`` answer for that and checks everything
that must follow from it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from message_queue import (
    CancelToken,
    Correlation,
    DispatchMode,
    EntryCallbacks,
    EntryKind,
    MessageMetadata,
    MessageQueue,
    MetadataType,
    NewMessage,
    Queued,
    SendFailure,
    notify_all_canceled,
)

CORRELATIONS = [
    Correlation(handle_id="h1", owner_session="o", turn_id="t1"),
    Correlation(handle_id="h2", owner_session="o", turn_id="t2"),
]
KEYS = ["k:1", "k:2", "p:1", "p:2"]
MODES = [DispatchMode.TOOL_END, DispatchMode.TURN_END]


@dataclass
class _Spec:
    kind: EntryKind
    mode: DispatchMode
    callbacks: str  # "none" | "canceled" | "failure" | "both"
    correlation: int | None
    continuation: bool
    sealed: bool


specs = st.builds(
    _Spec,
    kind=st.sampled_from(list(EntryKind)),
    mode=st.sampled_from(MODES),
    callbacks=st.sampled_from(["none", "canceled", "failure", "both"]),
    correlation=st.none() | st.integers(0, 1),
    continuation=st.booleans(),
    sealed=st.booleans(),
)


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = MessageQueue()
        self.order: list[str] = []  # entry ids, head first
        self.user_authored: dict[str, bool] = {}
        self.keys: dict[str, str] = {}  # key -> entry id
        self.withdrawable: dict[str, CancelToken] = {}
        self.with_cancellation: set[str] = set()
        self.cancellation_calls: Counter[str] = Counter()
        self.accepted_calls: Counter[str] = Counter()
        self.left_unaccepted: set[str] = set()  # left by removal, clear or a withdrawn dequeue
        self.counter = 0

    # ------------------------------------------------------------ building adds

    def _message(self, spec: _Spec) -> NewMessage:
        self.counter += 1
        name = f"m{self.counter}"
        token = CancelToken() if spec.kind is EntryKind.WAKE or spec.sealed else None
        metadata = None
        if spec.correlation is not None:
            metadata = MessageMetadata(
                type=MetadataType.WORKSPACE_TURN, correlation=CORRELATIONS[spec.correlation]
            )

        def on_canceled(reason: str) -> None:
            del reason
            self.cancellation_calls[name] += 1

        def on_failure(failure: SendFailure) -> None:
            del failure
            self.cancellation_calls[name] += 1

        def on_accepted() -> None:
            self.accepted_calls[name] += 1

        return NewMessage(
            text=f"text {name}",
            id=name,
            kind=spec.kind,
            mode=spec.mode,
            metadata=metadata,
            workspace_turn_continuation=spec.continuation,
            cancel_token=token,
            on_canceled=on_canceled if spec.callbacks in ("canceled", "both") else None,
            on_accepted_pre_stream_failure=on_failure
            if spec.callbacks in ("failure", "both")
            else None,
            on_accepted=on_accepted if spec.callbacks != "none" else None,
        )

    def _record(self, message: NewMessage, outcome: Queued, key: str | None) -> None:
        if outcome.into is None:
            self.order.append(outcome.entry_id)
            snapshot = self.queue.get(outcome.entry_id)
            assert snapshot is not None
            self.user_authored[outcome.entry_id] = snapshot.user_authored
            if message.on_canceled or message.on_accepted_pre_stream_failure:
                self.with_cancellation.add(outcome.entry_id)
            if snapshot.withdrawn is False and message.cancel_token is not None:
                self.withdrawable[outcome.entry_id] = message.cancel_token
            if message.kind is EntryKind.WAKE and message.cancel_token is None:
                raise AssertionError("wakes are built with tokens here")
        else:
            assert outcome.into == self.order[-1], "an add may only batch into the tail"
            assert message.on_canceled is None
            assert message.cancel_token is None
        if key is not None:
            self.keys[key] = outcome.entry_id

    def _left(self, removed: list[EntryCallbacks], reason: str) -> None:
        gone = {c.entry_id for c in removed}
        notify_all_canceled(removed, reason)
        self.order = [entry for entry in self.order if entry not in gone]
        self.left_unaccepted |= gone
        for entry in gone:
            self.withdrawable.pop(entry, None)
        self.keys = {k: e for k, e in self.keys.items() if e not in gone}

    # ------------------------------------------------------------ rules

    @rule(spec=specs)
    def add(self, spec: _Spec) -> None:
        message = self._message(spec)
        outcome = self.queue.add(message)
        assert isinstance(outcome, Queued)
        self._record(message, outcome, None)

    @rule(spec=specs, key=st.sampled_from(KEYS), removable=st.booleans())
    def add_once(self, spec: _Spec, key: str, removable: bool) -> None:
        message = self._message(spec)
        outcome = self.queue.add_once(message, key, removable=removable)
        if key in self.keys:
            assert not isinstance(outcome, Queued), "a held key must be refused (MQ-9)"
            return
        assert isinstance(outcome, Queued)
        self._record(message, outcome, key)

    @precondition(lambda self: bool(self.withdrawable))
    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(sorted(self.withdrawable)))
        self.withdrawable.pop(entry).cancel("withdrawn by test")

    @rule(prefix=st.sampled_from(["k:", "p:", "k:1", "p:2", "x"]))
    def remove_by_prefix(self, prefix: str) -> None:
        removal = self.queue.remove_by_dedupe_key_prefix(prefix)
        matching = [k for k in self.keys if k.startswith(prefix)]
        assert removal.removed_messages == len(matching)
        for key in matching:
            del self.keys[key]
        self._left(removal.removed_entries, "removed")

    @rule(handle=st.sampled_from(["h1", "h2"]))
    def remove_workspace_turn(self, handle: str) -> None:
        self._left(self.queue.remove_workspace_turn(handle), "turn removed")

    def _after_reorder(self) -> None:
        # MQ-13 may strip a stale continuation's callbacks: it then has nothing to cancel.
        for entry in self.queue:
            if not (entry.has_on_canceled or entry.has_on_accepted_pre_stream_failure):
                self.with_cancellation.discard(entry.id)

    @rule()
    def prioritize(self) -> None:
        users = [e for e in self.order if self.user_authored[e]]
        assert self.queue.prioritize_next_user_entry() == bool(users)
        if users:
            self.order.remove(users[0])
            self.order.insert(0, users[0])
        self._after_reorder()

    @rule(mode=st.sampled_from(MODES))
    def set_visible_mode(self, mode: DispatchMode) -> None:
        users = [e for e in self.order if self.user_authored[e]]
        assert self.queue.set_visible_dispatch_mode(mode) == bool(users)
        if users:
            self.order = users + [e for e in self.order if not self.user_authored[e]]
        self._after_reorder()

    @precondition(lambda self: bool(self.order))
    @rule()
    def dequeue(self) -> None:
        out = self.queue.dequeue_next()
        assert out.entry_id == self.order.pop(0), "dequeue is FIFO over entries"
        self.withdrawable.pop(out.entry_id, None)
        self.keys = {k: e for k, e in self.keys.items() if e != out.entry_id}
        if out.withdrawn:  # the dispatcher cancels it before acceptance
            out.callbacks.notify_canceled("canceled before acceptance")
            self.left_unaccepted.add(out.entry_id)
        elif out.callbacks.on_accepted is not None:
            out.callbacks.on_accepted()

    @rule()
    def clear(self) -> None:
        self._left(self.queue.clear(), "cleared")

    # ------------------------------------------------------------ invariants

    @invariant()
    def order_matches(self) -> None:
        assert [e.id for e in self.queue] == self.order
        assert len(self.queue) == len(self.order)

    @invariant()
    def live_readers_never_return_withdrawn(self) -> None:
        entries = list(self.queue)
        live = [e for e in entries if not e.withdrawn]
        first = self.queue.first_live()
        assert (first.id if first else None) == (live[0].id if live else None)
        assert first is None or not first.withdrawn
        assert self.queue.next_is_wake() == bool(live and live[0].kind is EntryKind.WAKE)
        for correlation in CORRELATIONS:
            assert self.queue.next_continues(correlation) == bool(
                live and live[0].correlation == correlation
            )
            assert self.queue.all_continue(correlation) == all(
                e.correlation == correlation for e in live
            )

    @invariant()
    def has_queued_follows_first_live_mode(self) -> None:
        live = [e for e in self.queue if not e.withdrawn]
        assert self.queue.has_queued() == bool(live)
        for mode in MODES:
            assert self.queue.has_queued(mode) == bool(live and live[0].mode is mode)
        expected = live[0].mode if live else DispatchMode.TOOL_END
        assert self.queue.next_dispatch_mode() is expected

    @invariant()
    def keys_held_exactly_while_queued(self) -> None:
        held = {key for e in self.queue for key in e.dedupe_keys}
        assert held == set(self.keys)
        for key in KEYS:
            assert self.queue.holds_dedupe_key(key) == (key in self.keys)

    @invariant()
    def exactly_one_cancellation_per_unaccepted_departure(self) -> None:
        for entry in self.with_cancellation:
            calls = self.cancellation_calls[entry]
            expected = 1 if entry in self.left_unaccepted else 0
            assert calls == expected, f"{entry}: {calls} cancellations, expected {expected}"
        assert all(count <= 1 for count in self.cancellation_calls.values())
        assert all(count <= 1 for count in self.accepted_calls.values())


QueueMachine.TestCase.settings = settings(max_examples=500, stateful_step_count=40)
TestQueueMachine = QueueMachine.TestCase
