"""Every input of the turn machine has a handler, and only inputs do.

``TurnMachine.handle`` finds an input's handler by its type (``_machine._DECIDE``): a table
rather than a ``match`` of 74 class patterns (a late case cost ~6 µs to reach). This is the
exhaustiveness the ``match`` and ``assert_never`` gave: a new input without a handler, or a
handler for something that is not an input, fails here.
"""

from __future__ import annotations

from typing import get_args

from agent_session import _inputs as _in
from agent_session._machine import _DECIDE, TurnMachine


def test_every_input_has_one_handler() -> None:
    inputs = set(get_args(_in.Input))
    assert len(inputs) == 99
    assert set(_DECIDE) == inputs
    assert all(_DECIDE[kind].__name__ == f"_on_{kind.__name__}" for kind in inputs)


def test_write_failures_are_inputs() -> None:
    assert set(get_args(_in.WriteFailure)) <= set(_DECIDE)


def test_an_object_that_is_no_input_is_refused() -> None:
    machine = TurnMachine("s-3", "m-5", known_models=frozenset({"m-5"}), resume_attempt_cap=2)
    broken = machine.handle("not an input")  # type: ignore[arg-type]
    assert machine.broken is not None
    assert "KeyError" in machine.broken
    assert broken  # told once: the machine fails loudly, not silently
