"""One owner per SQLite store: an exclusive ``flock`` on ``<database>.lock``.

A read-write :class:`~persistence.SqliteStore` takes the lock before it reads, migrates or
writes anything, holds it for its life and releases it on close. The kernel decides: the lock
belongs to an open file description, so a second process, or a second store in this process
(its own ``open``), is refused at once (``LOCK_NB``), and the kernel drops the lock when the
holder dies, however it dies (even ``SIGKILL``): there is no stale lock to clean up. The
descriptor is close-on-exec, so a tool process the engine starts never inherits it.

The holder writes its pid, host and start time into the file once it holds the lock, for the
refusal's message only; the decision is the kernel's, never the file's. The file stays behind
after a close (emptied), except when an open that created it fails: then it is removed, so a
refused file's folder is left as it was. Removing a lock file is safe because a taker checks,
once it holds the lock, that the path still names the file it locked, and starts over if not.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
from datetime import UTC, datetime

import msgspec

from persistence._errors import StoreError, StoreLocked

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX (Windows): opens are refused, see acquire
    HAVE_FLOCK = False
else:
    HAVE_FLOCK = True

#: The lock file's name is the database's (symlinks resolved) with this suffix.
SUFFIX = ".lock"
#: Times a taker starts over because the lock file was replaced under it (a race, not a wait).
_ATTEMPTS = 8
_MAX_HOLDER_BYTES = 4096


class Holder(msgspec.Struct, frozen=True, kw_only=True):
    """What the lock file says about its holder (for messages only; possibly stale)."""

    pid: int | None = None
    host: str | None = None
    since: str | None = None


class HeldLock:
    """The lock on one store's lock file, held until :meth:`release`.

    Attributes:
        path: The lock file.
        owner: A fresh random token minted when the lock was taken (see ``SqliteStore.owner``).
    """

    __slots__ = ("_fd", "created", "owner", "path")

    def __init__(self, fd: int, path: str, *, created: bool) -> None:
        self._fd: int | None = fd
        self.path = path
        #: Whether taking this lock created the file (a failed open then removes it again).
        self.created = created
        self.owner = secrets.token_hex(16)

    def release(self, *, discard: bool = False) -> None:
        """Give the lock up; idempotent.

        The file is emptied first, so a refused opener never reads a holder that is gone, or
        removed (``discard``: a failed open that created it, a removed store) while still held.
        """
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError):  # the lock is what matters; closing drops it
                if discard:
                    os.unlink(self.path)
                else:
                    os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # the last descriptor of the open file description: the lock goes


def lock_path(database: str) -> str:
    """The lock file of the store at ``database``: beside the real file, symlinks resolved."""
    return os.path.realpath(database) + SUFFIX


def acquire(database: str) -> HeldLock:
    """Take the store's lock without waiting (blocking file I/O: run it on a worker thread).

    Raises:
        StoreLocked: Another open file description holds it (another process, or another
            store in this one); nothing was written.
        StoreError: The platform has no ``flock``, or the lock file cannot be opened or locked.
    """
    if not HAVE_FLOCK:
        raise StoreError(
            f"{database}: SQLite stores need POSIX file locks (fcntl.flock) to make sure one "
            f"process owns a store, and this platform ({sys.platform}) has none; refusing to "
            "open it unlocked (read-only opens still work)"
        )
    path = lock_path(database)
    for _ in range(_ATTEMPTS):
        fd, created = _open(database, path)
        if fd is None:
            continue  # created by another taker between our two tries: try again
        try:
            if not _lock(database, fd):
                raise _refusal(database, _holder(fd))
            if _same_file(database, fd, path):
                _write_holder(fd)
                return HeldLock(fd, path, created=created)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its holder removed it before we locked it: start over on the new one
    raise StoreError(f"{database}: could not take the lock {path}: it kept being replaced")


def _open(database: str, path: str) -> tuple[int | None, bool]:
    """Open the lock file (never truncating it), creating it ``0600`` when it is missing."""
    flags = os.O_RDWR | os.O_CLOEXEC
    try:
        try:
            return os.open(path, flags), False
        except FileNotFoundError:
            pass
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600), True
        except FileExistsError:
            return None, False
    except OSError as error:
        raise StoreError(
            f"{database}: unable to open the lock file {path}: {error.strerror}"
        ) from error


def _lock(database: str, fd: int) -> bool:
    """``flock(LOCK_EX | LOCK_NB)``: whether this descriptor now holds the lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as error:  # e.g. a file system without flock support
        raise StoreError(f"{database}: unable to lock {database}{SUFFIX}: {error}") from error
    return True


def _same_file(database: str, fd: int, path: str) -> bool:
    """Whether ``path`` still names the file ``fd`` has open (it was not removed meanwhile)."""
    try:
        named = os.stat(path)
        held = os.fstat(fd)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise StoreError(f"{database}: unable to check the lock file {path}: {error}") from error
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _write_holder(fd: int) -> None:
    """Replace the file's content with this process's pid, host and start time (held only)."""
    since = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    holder = Holder(pid=os.getpid(), host=socket.gethostname(), since=since)
    with contextlib.suppress(OSError):  # the content only feeds messages; the lock is held
        os.ftruncate(fd, 0)
        os.pwrite(fd, msgspec.json.encode(holder) + b"\n", 0)


def _holder(fd: int) -> Holder:
    """What the lock file says about its holder; empty when it says nothing readable."""
    try:
        content = os.pread(fd, _MAX_HOLDER_BYTES, 0)
        return msgspec.json.decode(content, type=Holder)
    except (OSError, msgspec.DecodeError):
        return Holder()


def _refusal(database: str, holder: Holder) -> StoreLocked:
    """The error naming the holder: its host only when it is another machine."""
    same_host = holder.host is None or holder.host == socket.gethostname()
    return StoreLocked(
        database,
        pid=holder.pid,
        since=holder.since,
        host=None if same_host else holder.host,
        this_process=same_host and holder.pid == os.getpid(),
    )
