"""The ``turnkeeper`` command line.

The commands of CONTRACT.md section 1 (``run``, ``demo``, ``inspect``, ``receipts``) arrive with
the engine (the walking-skeleton and operations issues). Until then the command names itself and
says plainly that they are not available, rather than pretending to run anything.
"""

import argparse
from collections.abc import Sequence
from importlib.metadata import version

_NOT_YET = (
    "turnkeeper: the engine commands (run, demo, inspect, receipts) are not built yet; "
    "this release ships the message queue only"
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code.

    Args:
        argv: the arguments after the program name; ``None`` reads ``sys.argv``.

    Returns:
        The process exit code: 0 for ``--version``, 2 for anything else (usage).
    """
    parser = argparse.ArgumentParser(prog="turnkeeper", description=_NOT_YET)
    parser.add_argument("--version", action="version", version=version("turnkeeper"))
    parser.parse_args(argv)
    parser.print_usage()
    print(_NOT_YET)
    return 2
