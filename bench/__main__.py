"""``python -m bench``: run every benchmark and print its table."""

from bench import durable, memory, peers_memory, queue_ops, step_overhead


def main() -> int:
    """Run every benchmark; non-zero when any of them misses a turnkeeper target."""
    codes = [
        queue_ops.main(),
        step_overhead.main(),
        peers_memory.main(),
        durable.main(),
        memory.main(),
    ]
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
