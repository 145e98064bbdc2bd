"""Output for people: a rich console that survives a reader going away (``| head``)."""

from __future__ import annotations

import errno

from rich.console import Console


class PipeConsole(Console):
    """A rich console whose closed pipe is an ordinary ``BrokenPipeError``.

    rich's own answer to a closed pipe exits the process from inside ``print``; this one falls
    silent and raises, so the command line decides how the command ends (quietly, see
    ``agent_session.cli``), and an observer printing inside the engine can stop printing
    without stopping the engine.
    """

    def on_broken_pipe(self) -> None:
        """The reader went away: print nothing more, and say so to the caller."""
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")
