"""``python -m bench``: run every benchmark, each in a fresh interpreter, and print its table.

Each benchmark runs in a process of its own (``python -m bench.<name>``), as pyperf does: a
benchmark's figures then hold its own heap only, not the peers' modules or the 100,000-entry
queues of the one before it (the cyclic garbage collector re-scans every live object, so a
large heap left behind slows every later figure). Comparisons stay inside one process: the
peers and turnkeeper of one table are measured in the same run, interleaved.
"""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = (
    "queue_ops",
    "step_overhead",
    "peers_memory",
    "durable",
    "resume",
    "many_sessions",
    "recovery",
    "delegation",
    "queue_durable",
    "memory",
    "models",
    "pg_fleet",
)


def main() -> int:
    """Run every benchmark; non-zero when any of them misses a turnkeeper target."""
    missed: list[str] = []
    for name in BENCHMARKS:
        print(f"\n== bench.{name}", flush=True)
        code = subprocess.run([sys.executable, "-m", f"bench.{name}"], check=False).returncode
        if code != 0:
            missed.append(name)
    verdict = "every target met" if not missed else "targets missed in " + ", ".join(missed)
    print(f"\n== summary: {verdict}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
