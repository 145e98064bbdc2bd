"""``python -m bench``: run every benchmark and print its table."""

from bench import queue_ops

if __name__ == "__main__":
    raise SystemExit(queue_ops.main())
