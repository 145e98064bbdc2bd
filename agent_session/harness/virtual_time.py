"""The one driver of virtual time.

The scenario runner, the crash sweep's recovery and every test rig move their ``VirtualClock``
with it.

``VirtualTime`` moves a clock the way a quiescence-seeking host would: it advances to the next
sleeper only when every other task is blocked and no store call is in flight, so it never
mistakes "waiting for the database thread" (or a task that is merely ready) for quiescence,
and nothing ever sleeps real time to synchronise.

* ``quiet()``: return once every other task is blocked and no store call is in flight.
* ``advance(...)``: the driving loop: at each quiet point, move the clock to the next deadline,
  until nothing sleeps; the caller's hooks add its own rules (when to stop, its own timed work,
  its limits). Every other verb is built on it.
* ``settle(engine)``: move time until nothing sleeps; then every session of ``engine`` must be
  settled (one that is not is wedged: nothing can wake it) and ``engine.wait_idle()`` returns.
* ``run_until(when)``: run every sleeper due up to ``when``, move the clock to ``when``, quiesce.
* ``drive(main)``: run ``main`` while moving time; every task blocked with no sleeper left and
  ``main`` not done is a hang (an ``AssertionError``, never a stuck test).
* ``all_blocked()``: what ``anyio.wait_all_tasks_blocked`` waits for, without its 0.1 s of real
  sleep each time it finds a ready task.

A task waiting for a thread (aiosqlite's) looks blocked: the store's calls in flight
(``FaultyStore.in_flight``, every store the harness uses is wrapped in one) are what tells it
from an idle one. Opening and closing a store are not counted: a driver never runs while its
engine opens, and a closing engine has no sleeper left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

import anyio

from stream_manager import VirtualClock

if TYPE_CHECKING:
    from agent_session._engine import Engine

T = TypeVar("T")

#: How many loop turns ``all_blocked`` yields before it falls back to anyio's own wait.
_SPINS = 1_000
#: With callbacks still queued on the loop, how many turns in a row every task must stay
#: blocked before that counts (anyio re-queues a cancellation's delivery on every turn).
_STEADY = 3


class StoreCalls(Protocol):
    """A store that counts its calls in flight (``agent_session.harness.fakes.FaultyStore``)."""

    @property
    def in_flight(self) -> int:
        """Store calls started and not yet returned."""
        ...

    async def settled(self) -> None:
        """Return once no store call is in flight."""
        ...


def _others_blocked() -> bool:
    """Whether every other task waits on an unfinished future (anyio's own test)."""
    this = asyncio.current_task()
    for task in asyncio.all_tasks():
        if task is this:
            continue
        waiter = getattr(task, "_fut_waiter", None)
        if waiter is None or waiter.done():
            return False
    return True


def _callbacks_queued() -> bool:
    """Whether the loop holds callbacks to run; ``True`` when the loop does not say.

    One may wake a task: a task group's ``task_done``, a thread's result.
    """
    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    # tuple() copies in one go: a thread's call_soon_threadsafe may append while we look
    return ready is None or any(not handle.cancelled() for handle in tuple(ready))


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # another backend (trio): only anyio's own wait knows its tasks
        return False
    return True


async def all_blocked() -> None:
    """Return once every other task is blocked, as ``anyio.wait_all_tasks_blocked`` does.

    anyio sleeps 0.1 s of real time whenever it finds a task ready to run; this yields to
    the event loop instead, one turn at a time, until every task waits on an unfinished future
    and either no callback is queued or the state held ``_STEADY`` turns in a row. Past
    ``_SPINS`` turns, or off asyncio, it leaves the wait to anyio.
    """
    if _on_asyncio():
        steady = 0
        for _ in range(_SPINS):
            await anyio.lowlevel.checkpoint()
            if not _others_blocked():
                steady = 0
                continue
            steady += 1
            if steady >= _STEADY or not _callbacks_queued():
                return
    await anyio.wait_all_tasks_blocked()


def busy_sessions(engine: Engine) -> list[str]:
    """The sessions of ``engine`` not settled, described; at quiescence such a one is wedged.

    A settled session holding queued entries is listed too: nothing would ever send them
    (AS-13: whatever made a session idle, the idle drain empties its queue).
    """
    found: list[str] = []
    for session in engine.sessions.values():
        stats = session.statistics()
        if not stats.settled:
            found.append(session.describe())
        elif (stats.queued or stats.withdrawn) and not stats.disposed:
            found.append(f"{session.describe()} is idle holding queued entries")
    return found


def _never() -> bool:
    return False


@dataclass
class VirtualTime:
    """Moves ``clock`` only at quiescence; ``store``'s calls in flight are not quiescence."""

    clock: VirtualClock
    store: StoreCalls | None = None

    async def quiet(self) -> None:
        """Return once every other task is blocked and no store call is in flight."""
        while True:
            await all_blocked()
            if self.store is None or not self.store.in_flight:
                return
            await self.store.settled()  # blocked on the database thread is not idle

    async def advance(
        self,
        *,
        stop: Callable[[], bool] = _never,
        due: Callable[[], float | None] | None = None,
        check: Callable[[float], None] | None = None,
        then: Callable[[float], None] | None = None,
        until: float | None = None,
    ) -> bool:
        """Move the clock one deadline at a time, each time at a quiet point (``quiet()``).

        At each quiet point ``stop()`` is asked first: true ends the loop (it may raise). The
        next deadline is the earliest of the clock's next sleeper and ``due()`` (the caller's
        own timed work, which it runs in ``then``); with none, or one past ``until``, the loop
        ends. Otherwise ``check(deadline)`` may refuse it (by raising: a limit), the clock
        moves there and ``then(now)`` runs what the caller has due by the clock's new time.

        Returns:
            ``True`` when ``stop()`` ended it; ``False`` when nothing (before ``until``) sleeps.
        """
        while True:
            await self.quiet()
            if stop():
                return True
            deadline = self.clock.next_deadline()
            mine = None if due is None else due()
            if mine is not None and (deadline is None or mine <= deadline):
                deadline = mine
            if deadline is None or (until is not None and deadline > until):
                return False
            if check is not None:
                check(deadline)
            self.clock.advance_to(deadline)
            if then is not None:
                then(self.clock.now())

    async def settle(self, engine: Engine | None = None) -> None:
        """Move virtual time until nothing sleeps; then ``engine`` (if any) must be idle."""
        await self.advance()
        if engine is None:
            return
        # Every task blocked and nothing sleeping: a session still busy now is wedged.
        busy = busy_sessions(engine)
        assert not busy, f"the engine did not reach quiescence: {busy}"
        await engine.wait_idle()

    async def run_until(self, when: float) -> None:
        """Move virtual time to ``when`` (every sleeper due on the way runs), then quiesce."""
        await self.advance(until=when)
        self.clock.advance_to(when)
        await self.quiet()

    async def drive(self, main: Callable[[], Awaitable[T]]) -> T:
        """Run ``main`` to its end, moving virtual time whenever every task is blocked.

        Raises:
            AssertionError: every task blocked with no sleeper left before ``main`` ended.
        """
        result: list[T] = []

        async def run_main(scope: anyio.CancelScope) -> None:
            result.append(await main())
            scope.cancel()

        async with anyio.create_task_group() as group:
            group.start_soon(run_main, group.cancel_scope)
            await self.advance()
            group.cancel_scope.cancel()  # main is blocked and nothing can wake it
        if not result:
            raise AssertionError("every task blocked with no sleeper left: a hang")
        return result[0]
