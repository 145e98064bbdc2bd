"""``python -m bench``: run every benchmark and print its table."""

from bench import (
    durable,
    many_sessions,
    memory,
    peers_memory,
    queue_ops,
    recovery,
    resume,
    step_overhead,
)


def main() -> int:
    """Run every benchmark; non-zero when any of them misses a turnkeeper target."""
    codes = [
        queue_ops.main(),
        step_overhead.main(),
        peers_memory.main(),
        durable.main(),
        resume.main(),
        many_sessions.main([]),
        recovery.main(),
        memory.main(),
    ]
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
