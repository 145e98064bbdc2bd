"""One owner per SQLite store: an exclusive ``flock`` on the database file itself.

A read-write :class:`~persistence.SqliteStore` takes the lock before it reads, migrates or
writes anything, holds it for its life and releases it on close. The lock is the file's, not a
name's: ``flock`` on a descriptor of the database file, so every path to that file (a symlink,
a hard link, a relative name) meets the same lock, and no file beside it decides anything. The
kernel decides: the lock belongs to an open file description, so a second process is refused
at once (``LOCK_NB``), and the kernel drops the lock when the holder dies, however it dies
(even ``SIGKILL``): there is no stale lock to clean up. The descriptor is close-on-exec, so a
tool process the engine starts never inherits it.

SQLite locks the same file with POSIX ``fcntl`` byte-range locks. The two kinds are independent
on Linux, but POSIX locks belong to the process, and closing *any* descriptor of the file drops
every one this process holds on it, SQLite's included. So this process opens each database file
once (:func:`pin`): every store of the file, read-write or read-only, shares that one descriptor
(reference counted, closed when the last store of the file let go, after its connections), and
reads the file's first bytes through it. A refused open in this process (another store of the
file owns it) is decided from that table, before any descriptor is opened.

The holder writes its pid, host and start time into ``<database>.lock`` (symlinks resolved) once
its open succeeded, for a refusal's message only, and removes it on close. The file decides
nothing: deleting it is harmless, and a refused open never writes or removes it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import stat
import sys
import threading
from datetime import UTC, datetime

import msgspec

from persistence._errors import NotATurnkeeperStore, StoreError, StoreLocked

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX (Windows): opens are refused, see acquire
    HAVE_FLOCK = False
else:
    HAVE_FLOCK = True

#: The holder file's name is the database's (symlinks resolved) with this suffix.
SUFFIX = ".lock"
#: Times a taker starts over because the file was replaced under it (a race, not a wait).
_ATTEMPTS = 8
_MAX_HOLDER_BYTES = 4096
_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)

Key = tuple[int, int]


class Holder(msgspec.Struct, frozen=True, kw_only=True):
    """What the holder file says about its holder (for messages only; possibly stale)."""

    pid: int | None = None
    host: str | None = None
    since: str | None = None


class _File:
    """This process's one open descriptor of a database file (see the module)."""

    __slots__ = ("fd", "key", "owner", "refs", "spare")

    def __init__(self, fd: int, key: Key) -> None:
        self.fd = fd
        self.key = key
        self.refs = 0
        #: What the holder file says while a store of this process owns the file.
        self.owner: Holder | None = None
        #: Descriptors of the same file opened in a race, closed with ``fd``, never before.
        self.spare: list[int] = []


#: Every database file a store of this process has open, by ``(st_dev, st_ino)``.
_FILES: dict[Key, _File] = {}
_TABLE = threading.Lock()


class Pin:
    """A store's share of its file's descriptor, until :meth:`release` (see the module)."""

    __slots__ = ("_file", "created")

    def __init__(self, file: _File, *, created: bool) -> None:
        self._file: _File | None = file
        #: Whether this pin created the (empty) database file.
        self.created = created

    @property
    def file(self) -> _File:
        """The file's entry (its shared descriptor: never close it)."""
        if self._file is None:
            raise StoreError("the database file's descriptor was released")
        return self._file

    def facts(self, size: int) -> tuple[int, bytes]:
        """The file's size and first ``size`` bytes, read through the shared descriptor."""
        fd = self.file.fd
        return os.fstat(fd).st_size, os.pread(fd, size, 0)

    def release(self) -> None:
        """Let go; the last pin of the file closes its descriptors. Idempotent."""
        file, self._file = self._file, None
        if file is None:
            return
        with _TABLE:
            file.refs -= 1
            if file.refs:
                return
            del _FILES[file.key]
        for fd in (file.fd, *file.spare):
            with contextlib.suppress(OSError):
                os.close(fd)


def pin(database: str, *, create: bool) -> Pin:
    """Share this process's descriptor of ``database``, opening it if no store has it open.

    ``create``: a missing file is created ``0600`` and empty (SQLite gives its ``-wal`` and
    ``-shm`` the same mode); otherwise a missing file raises ``FileNotFoundError``.

    Raises:
        FileNotFoundError: The file is missing (and not ``create``).
        NotATurnkeeperStore: It is not a regular file.
        StoreError: It cannot be opened.
    """
    for _ in range(_ATTEMPTS):
        with _TABLE:
            known = _known(database)
            if known is not None:
                known.refs += 1
                return Pin(known, created=False)
            fd, created = _open(database, create=create)
            if fd is None:
                continue  # created by someone else between our two tries: look again
            try:
                held = os.fstat(fd)
            except OSError:
                os.close(fd)
                raise
            if not stat.S_ISREG(held.st_mode):
                os.close(fd)
                raise NotATurnkeeperStore(database, "it is not a regular file")
            key = (held.st_dev, held.st_ino)
            file = _FILES.get(key)
            if file is None:
                file = _FILES[key] = _File(fd, key)
            else:  # the path changed to a file we have open: closing fd would drop its locks
                file.spare.append(fd)
            file.refs += 1
            return Pin(file, created=created)
    raise StoreError(f"{database}: could not open it: it kept being replaced")


def _known(database: str) -> _File | None:
    """The file's entry when a store of this process has the file the path names open."""
    try:
        named = os.stat(database)
    except OSError:
        return None
    return _FILES.get((named.st_dev, named.st_ino))


def _open(database: str, *, create: bool) -> tuple[int | None, bool]:
    """Open the file (never truncating it); create it ``0600`` when missing and ``create``."""
    try:
        try:
            return os.open(database, _FLAGS), False
        except FileNotFoundError:
            if not create:
                raise
        try:
            return os.open(database, _FLAGS | os.O_CREAT | os.O_EXCL, 0o600), True
        except FileExistsError:
            return None, False
    except FileNotFoundError:
        raise
    except OSError as error:
        raise StoreError(f"{database}: unable to open it: {error.strerror}") from error


class HeldLock:
    """The lock on one database file, held until :meth:`release`.

    Attributes:
        pin: The store's share of the file's descriptor (the lock is on it).
        owner: A fresh random token minted when the lock was taken (see ``SqliteStore.owner``).
    """

    __slots__ = ("_file", "_path", "announced", "owner", "pin")

    def __init__(self, database: str, taken: Pin, file: _File) -> None:
        self.pin = taken
        self._file: _File | None = file
        self._path = holder_path(database)
        self.announced = False
        self.owner = secrets.token_hex(16)

    @property
    def created(self) -> bool:
        """Whether taking this lock created the (empty) database file."""
        return self.pin.created

    def announce(self) -> None:
        """Write this holder's words into the holder file (the open succeeded)."""
        if self._file is None or self._file.owner is None:
            return
        self.announced = True
        with contextlib.suppress(OSError):  # the words only feed messages; the lock is held
            _write(self._path, msgspec.json.encode(self._file.owner) + b"\n")

    def release(self) -> None:
        """Give the lock and the pin up; idempotent. Call it after every connection closed."""
        file, self._file = self._file, None
        if file is None:
            return
        try:
            if self.announced:
                with contextlib.suppress(OSError):
                    os.unlink(self._path)
            with _TABLE:
                file.owner = None
                with contextlib.suppress(OSError):
                    fcntl.flock(file.fd, fcntl.LOCK_UN)
        finally:
            self.pin.release()


def holder_path(database: str) -> str:
    """The holder file of the store at ``database``: beside the real file, symlinks resolved."""
    return os.path.realpath(database) + SUFFIX


def acquire(database: str, *, create: bool = True) -> HeldLock | None:
    """Take the database file's lock without waiting (blocking I/O: run it on a worker thread).

    ``create``: a missing file is created ``0600`` and empty first; otherwise a missing file
    gives ``None``.

    Raises:
        StoreLocked: Another open file description holds it (another process), or another
            store in this process owns the file; nothing was written.
        StoreError: The platform has no ``flock``, or the file cannot be opened or locked.
        NotATurnkeeperStore: The path is not a regular file.
    """
    if not HAVE_FLOCK:
        raise StoreError(
            f"{database}: SQLite stores need POSIX file locks (fcntl.flock) to make sure one "
            f"process owns a store, and this platform ({sys.platform}) has none; refusing to "
            "open it unlocked (read-only opens still work)"
        )
    for _ in range(_ATTEMPTS):
        try:
            taken = pin(database, create=create)
        except FileNotFoundError:
            if create:
                raise StoreError(f"{database}: it vanished while it was opened") from None
            return None
        try:
            held = _lock(database, taken)
        except BaseException:
            taken.release()
            raise
        if held is not None:
            return held
        taken.release()  # removed (and maybe made again) before we locked it: start over
    raise StoreError(f"{database}: could not take its lock: it kept being replaced")


def _lock(database: str, taken: Pin) -> HeldLock | None:
    """Lock the pinned file; ``None`` when the path no longer names it (start over)."""
    with _TABLE:
        file = taken.file
        if file.owner is not None:
            raise _refusal(database, file.owner)
        try:
            fcntl.flock(file.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _refusal(database, _holder(database)) from None
        except OSError as error:  # e.g. a file system without flock support
            raise StoreError(f"{database}: unable to lock it: {error}") from error
        if not _names(database, file.key):
            fcntl.flock(file.fd, fcntl.LOCK_UN)
            return None
        since = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        file.owner = Holder(pid=os.getpid(), host=socket.gethostname(), since=since)
        return HeldLock(database, taken, file)


def _names(database: str, key: Key) -> bool:
    """Whether ``database`` still names the file ``key`` (it was not removed meanwhile)."""
    try:
        named = os.stat(database)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise StoreError(f"{database}: unable to check it: {error}") from error
    return (named.st_dev, named.st_ino) == key


def _write(path: str, content: bytes) -> None:
    """Replace the holder file with ``content`` (``0600``, never through a symlink)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, content)
    finally:
        os.close(fd)


def _holder(database: str) -> Holder:
    """What the holder file says about its holder; empty when it says nothing readable."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(holder_path(database), flags)
        try:
            content = os.read(fd, _MAX_HOLDER_BYTES)
        finally:
            os.close(fd)
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
