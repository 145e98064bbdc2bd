"""The ``turnkeeper`` command line (``docs/cli.md``).

``run`` drives scenario files through the harness; ``demo`` runs the built-in incident on a
fresh SQLite file with a live timeline; ``inspect`` and ``receipts`` read a store, read-only;
``resolve`` settles an indeterminate operation in a store no process holds; ``migrate`` brings
a store of an older schema to this one.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import version

import anyio

from agent_session.harness.commands import demo_command, run_command
from agent_session.harness.inspection import (
    inspect_command,
    migrate_command,
    receipts_command,
    resolve_command,
)
from persistence import TurnkeeperError, UsageError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnkeeper",
        description="A turn engine for coding-agent hosts: no stranded turn, no lost receipt.",
    )
    parser.add_argument("--version", action="version", version=version("turnkeeper"))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run scenario files to quiescence and check them")
    run.add_argument("scenarios", nargs="+", metavar="SCENARIO", help="TOML or JSON files")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--db", metavar="PATH", help="SQLite file (default: a fresh temp file)")
    where.add_argument("--memory", action="store_true", help="use the in-memory store")
    run.add_argument("--trace", metavar="FILE", help="write the trace as JSON Lines ('-': stdout)")
    run.add_argument("--json", action="store_true", help="print a JSON summary per scenario")

    demo = commands.add_parser("demo", help="the stranded-turn incident, end to end on SQLite")
    demo.add_argument("--db", metavar="PATH", default="turnkeeper-demo.db", help="SQLite file")
    demo.add_argument("--trace", metavar="FILE", help="write the trace as JSON Lines")
    demo.add_argument("--plain", action="store_true", help="no colours or live redraw")

    inspect = commands.add_parser("inspect", help="what a store holds (read-only)")
    inspect.add_argument("--db", metavar="PATH", required=True)
    inspect.add_argument("session", nargs="?")
    inspect.add_argument("--json", action="store_true")
    receipts = commands.add_parser("receipts", help="operation receipts (read-only)")
    receipts.add_argument("--db", metavar="PATH", required=True)
    receipts.add_argument("--state")
    receipts.add_argument("--json", action="store_true")
    resolve = commands.add_parser("resolve", help="settle an indeterminate operation")
    resolve.add_argument("op", metavar="OP", help="the operation id (turnkeeper receipts)")
    resolve.add_argument("--db", metavar="PATH", required=True)
    resolve.add_argument(
        "--as", dest="as_", metavar="completed|failed|not-run", required=True, help="what you found"
    )
    resolve.add_argument("--note", metavar="TEXT", required=True, help="what you checked")
    migrate = commands.add_parser("migrate", help="bring a store to this turnkeeper's schema")
    migrate.add_argument("--db", metavar="PATH", required=True)
    return parser


#: What a command returns when the reader of its output went away (``| head``): 128 + SIGPIPE,
#: the status a shell reports for a tool that a closed pipe stopped.
EXIT_BROKEN_PIPE = 141


#: Bad input or usage the commands refuse: one line, nothing ran (``docs/cli.md``).
EXIT_USAGE = 2
#: The engine or the store failed.
EXIT_FAILED = 3
#: A bug: an exception nothing expected (70, ``EX_SOFTWARE`` of ``sysexits.h``).
EXIT_INTERNAL = 70
#: Interrupted (Ctrl-C): 128 + SIGINT.
EXIT_INTERRUPTED = 130
#: How much of an error's message the one line shows.
_MESSAGE_LIMIT = 200


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code; never a traceback.

    A reader that stops reading (``turnkeeper inspect --json | head``) ends the command
    quietly: no traceback, exit code :data:`EXIT_BROKEN_PIPE`. Anything else that escapes a
    command is one line on standard error: a refused input or store (``UsageError``, a store
    error) is :data:`EXIT_USAGE` or :data:`EXIT_FAILED`; an exception nothing expected is
    ``turnkeeper: internal error: TYPE: message`` and :data:`EXIT_INTERNAL`.
    """
    try:
        return _dispatch(_parser().parse_args(argv))
    except SystemExit:
        raise  # argparse's own usage errors (2), --help and --version (0)
    except BaseException as error:
        if not _only_broken_pipes(error):
            return _one_line(error)
    _discard_stdout()
    return EXIT_BROKEN_PIPE


def _one_line(error: BaseException) -> int:
    """Report what escaped a command in one line; its exit code."""
    leaf = _first_leaf(error)
    if isinstance(leaf, KeyboardInterrupt):
        print("turnkeeper: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    message = " ".join(str(leaf).split())
    if len(message) > _MESSAGE_LIMIT:
        message = f"{message[:_MESSAGE_LIMIT]}\N{HORIZONTAL ELLIPSIS} ({len(message)} chars)"
    if isinstance(leaf, UsageError):
        print(f"turnkeeper: {message}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(leaf, TurnkeeperError):
        print(f"turnkeeper: {type(leaf).__name__}: {message}", file=sys.stderr)
        return EXIT_FAILED
    print(f"turnkeeper: internal error: {type(leaf).__name__}: {message}", file=sys.stderr)
    return EXIT_INTERNAL


def _first_leaf(error: BaseException) -> BaseException:
    """The first exception a group (of groups) holds; ``error`` itself otherwise."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        return anyio.run(run_command, args.scenarios, args.db, args.memory, args.trace, args.json)
    if args.command == "demo":
        return anyio.run(demo_command, args.db, args.trace, args.plain)
    if args.command == "resolve":
        return anyio.run(resolve_command, args.db, args.op, args.as_, args.note)
    if args.command == "receipts":
        return anyio.run(receipts_command, args.db, args.state, args.json)
    if args.command == "migrate":
        return anyio.run(migrate_command, args.db)
    return anyio.run(inspect_command, args.db, args.session, args.json)


def _only_broken_pipes(error: BaseException) -> bool:
    """A closed output pipe, raised alone or by every task of a group."""
    if isinstance(error, BaseExceptionGroup):
        _, rest = error.split(BrokenPipeError)
        return rest is None
    return isinstance(error, BrokenPipeError)


def _discard_stdout() -> None:
    """Point stdout at the null device, so the interpreter's last flush has nowhere to fail."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):  # no real stdout (embedded, captured): nothing to flush
        pass
