"""The claim and forfeit bookkeeping of a delegated turn, under generated orders of events.

Hypothesis drives the real engine through the scenario runner in-process (a real ``Engine``,
its sessions and its in-process owner ``Delegations``, on a ``MemoryStore`` or a
``SqliteStore``; a ``crash`` or ``restart`` starts the next engine on the same store). Every
example is one scenario: the session ``lead`` delegates a turn to ``worker`` under the handle
``h-9``; the worker's first stream starts a job and waits on it, and a wake queued meanwhile
cuts it at the tool boundary (5 of 7 steps left), so the lead is asked to claim that cut
(ST-15). Around that, a few generated actions, each pinned to one of the delegated turn's
trigger events (or a virtual time): withdrawals of the wake, queue clears (plain and
hard-stop), unrelated user sends, a user Stop, ``fail_next store_write`` and ``fail_next
settlement`` with counts, disposal of the worker, a crash or a restart, and the lead's
interrupt of the handle (TD-8).

An action that cannot run (withdrawing a wake already gone, acting on a disposed session) fails
the run with exit 3 once it is quiescent; that is an outcome, not a finding. Checked on every
run, from the trace (both engine lives of a crash are in one trace) and the store:

1. a lead that deferred (``claim answer=defer``) is settled exactly once: one ``settled`` line
   for the handle (never two, for any handle), and the stored handle is not ``active``. A
   crash after the settlement's write committed and before it was told loses the telling,
   never the fact (``docs/session.md``, "Decide, persist, tell"): after a crash the line may
   be missing, but the store must hold the settlement (ST-6, R54, TD-10);
2. a "no" is never followed by a resume of that cut: after ``claim answer=settle`` for cut X,
   or a ``continuation-ended`` that voids X, no ``resume`` of X starts (ST-15, R28, R33). The
   second test asks the same after a withdrawal or a forfeit of X (ST-5, ST-6);
3. never both, never neither: at quiescence no stored handle is ``active`` unless its target's
   store still owes a cut (nothing runs at quiescence) (ST-6, TD-2).

The ``@example`` orders include the eight the machine found, each now a regression test in
``tests/agent_session/test_delegation_regressions.py``: the target disposed before the
delegated prompt streams, or while its stream runs; the prompt's user-row write failing; a
user Stop after the owner deferred; a restart, then an unrelated message superseding the
recovered turn; an unrelated message superseding the deferred cut whose stream then fails; a
queued delegated prompt cleared before it ran; the target disposed before the delegation's
own task sent the prompt (that failed the engine).

The second test's shrunk order, a user Stop or a hard-stop clear landing in the resumed
stream's ``stream-start`` emission, once found the resume told ``started`` and a model step run
after its continuation ended; now the stream aborts before any step (with the stop's reason)
and the attempt is told ``withdrawn`` (``test_as30_r11_...`` in ``test_stop_races.py``).

``make test`` runs a bounded, derandomized sample; ``TURNKEEPER_FUZZ=full`` runs 2000.
"""

from __future__ import annotations

import os

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.stateful.delegation_kit import (
    ENDED,
    ENDINGS,
    OPS,
    TRIGGERS,
    Action,
    check,
    run_example,
)

EXAMPLES = 2000 if os.environ.get("TURNKEEPER_FUZZ") == "full" else 150

actions_strategy = st.lists(
    st.tuples(st.sampled_from(sorted(TRIGGERS)), st.sampled_from(sorted(OPS))),
    min_size=1,
    max_size=5,
).filter(lambda actions: sum(op in ENDINGS for _, op in actions) <= 2)


@settings(max_examples=EXAMPLES, deadline=None)
@given(actions=actions_strategy.map(tuple), kind=st.sampled_from(["memory", "sqlite"]))
@example(actions=(("claim", "withdraw"),), kind="memory")  # defer, then the wake is taken back
@example(actions=(("claim", "fail-settlement-3"), ("claim", "dispose")), kind="sqlite")
@example(actions=(("wait-start", "send"),), kind="memory")  # behind the wake: a defer
# R28 (b): an unrelated head cuts the loop (a no); it leaves the queue before it is dispatched
@example(actions=(("bash-end", "send"), ("claim", "clear")), kind="sqlite")
@example(actions=(("claim", "clear-hard"),), kind="sqlite")  # hard-stop clear forfeits
@example(actions=(("claim", "crash"),), kind="sqlite")  # recovery resumes the owed cut
@example(actions=(("claim", "withdraw"), ("sentinel", "crash")), kind="sqlite")
@example(actions=(("cut-end", "fail-store-2"), ("claim", "interrupt")), kind="memory")
# found by this machine (regression tests in tests/agent_session/test_delegation_regressions.py)
@example(actions=(("handle-1", "dispose"),), kind="memory")
@example(actions=(("ended", "dispose"),), kind="sqlite")
@example(actions=(("handle-1", "fail-store-1"),), kind="memory")
@example(actions=(("claim", "stop"),), kind="memory")
@example(actions=(("owed", "crash"), ("recovered", "send")), kind="memory")
@example(
    actions=(("claim", "fail-store-1"), ("claim", "send"), ("start-2", "fail-store-1")),
    kind="memory",
)
@example(actions=(("cut-end", "clear"), ("start", "send")), kind="memory")
@example(actions=(("start", "dispose"), ("start", "dispose")), kind="sqlite")
@example(actions=(("end-2", "crash"), ("start-2", "clear-hard")), kind="sqlite")  # untold
def test_st6_st15_r54_a_delegated_turn_settles_once_and_a_no_is_never_resumed(
    actions: tuple[Action, ...], kind: str
) -> None:
    check(run_example(actions, kind))


@settings(max_examples=EXAMPLES, deadline=None)
@given(actions=actions_strategy.map(tuple), kind=st.sampled_from(["memory", "sqlite"]))
@example(actions=(("claim", "withdraw"), ("start-2", "stop")), kind="memory")
@example(actions=(("claim", "withdraw"), ("start-2", "clear-hard")), kind="sqlite")
def test_st5_st6_a_withdrawn_or_forfeited_cut_is_never_resumed(
    actions: tuple[Action, ...], kind: str
) -> None:
    check(run_example(actions, kind), ended=ENDED)
