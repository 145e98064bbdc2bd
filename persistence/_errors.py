"""The root of turnkeeper's error tree.

Exceptions are kept for caller misuse, impossible events and bad stored data; everything else
(a rejected add, a refused launch, a cancelled operation) is returned as a value. Every error we
raise on purpose derives from :class:`TurnkeeperError`, so a host can catch them all at once.
"""


class TurnkeeperError(Exception):
    """Base of every error turnkeeper raises on purpose."""


class UsageError(TurnkeeperError):
    """The caller used an API wrongly (bad argument, unknown name, wrong state)."""


class StoreError(TurnkeeperError):
    """The store could not carry out an operation (I/O failure, a database locked too long)."""


class StoreLocked(StoreError):
    """A live owner holds the SQLite store: one process owns a store at a time.

    Raised by a read-write open (``persistence._lock``); nothing was read or written, and the
    owner goes on undisturbed. Read-only opens take no lock and still work.

    Attributes:
        path: The path that was opened.
        pid: The holder's pid, as its lock file says (``None`` when it says nothing readable).
        since: When the holder took the lock (ISO 8601, UTC), as its lock file says.
        host: The holder's host when it is not this one (a shared file system), else ``None``.
        this_process: The holder is another store in this very process.
    """

    def __init__(
        self,
        path: str,
        *,
        pid: int | None = None,
        since: str | None = None,
        host: str | None = None,
        this_process: bool = False,
    ) -> None:
        who = "another store in this process" if this_process else "another process"
        facts = "pid unknown" if pid is None else f"pid {pid}"
        if host is not None:
            facts += f" on {host}"
        if since is not None:
            facts += f" since {since}"
        super().__init__(
            f"{path} is in use by {who} ({facts}): one process owns a SQLite store at a time; "
            "inspect and receipts can still read it"
        )
        self.path = path
        self.pid = pid
        self.since = since
        self.host = host
        self.this_process = this_process


class StaleOwner(UsageError):
    """A commit named an owner token that is not the store's current owner; nothing was written.

    The fence of a store shared by several processes: every commit carries the token its
    writer got when it came to own the store (``Store.owner``), and a writer that no longer
    owns it (the store was closed and reopened, or, with leases, another process took over)
    is refused before anything of its boundary lands.

    Attributes:
        session: The session the refused boundary was for.
    """

    def __init__(self, session: str) -> None:
        super().__init__(
            f"commit for session {session!r} refused: its owner token is not this store's "
            "current owner (the store was reopened or is owned by another process since)"
        )
        self.session = session


class LeaseLost(StaleOwner):
    """A commit found its session's lease held by a newer epoch; nothing was written.

    The fence of a store shared by many engine processes (``PostgresStore``): each session is
    leased to one process at a time, every take bumps the session's epoch, and every commit
    checks, in its own transaction, that the lease it holds is still the newest. A writer
    that meets this must stop the session at once (no retry of the write, nothing told): a
    peer owns it now.

    Attributes:
        session: The session the refused boundary was for.
        held: The epoch this process held (``None``: it held none).
        epoch: The epoch the database holds.
        holder: The owner the database names (``None``: nobody, or not known).
    """

    def __init__(
        self, session: str, *, held: int | None, epoch: int | None, holder: str | None
    ) -> None:
        TurnkeeperError.__init__(
            self,
            f"commit for session {session!r} refused: its lease is held by "
            f"{holder or 'nobody'} at epoch {epoch} (this process held "
            f"{'none' if held is None else f'epoch {held}'}); nothing was written",
        )
        self.session = session
        self.held = held
        self.epoch = epoch
        self.holder = holder


class CorruptRecord(TurnkeeperError):
    """A stored value failed validation when it was read back.

    A corrupt value is never read as "absent" (R61), and nothing stored is deleted or
    rewritten because of it: the caller decides what to abandon.

    Attributes:
        table: The table (or collection) the value was read from.
        key: The value's key within that table, e.g. ``s1/r7``.
        detail: What failed, led by the field path, e.g. ``$.remaining: Expected int, got str``.
        field: The field path alone (``$.remaining``; ``$`` for the whole value).
    """

    def __init__(self, table: str, key: str, detail: str) -> None:
        super().__init__(f"{table}[{key}]: {detail}")
        self.table = table
        self.key = key
        self.detail = detail
        head = detail.split(": ", 1)[0]
        self.field = head if head.startswith("$") else "$"


class DamagedStore(StoreError):
    """The file is a turnkeeper store SQLite cannot read whole; nothing was written to it.

    A damaged page, a missing table, an unreadable ``schema_version``, text that is not UTF-8.
    Raised at open (a read-write open refuses such a file before it changes anything) and by a
    read that meets a damaged page (SQLite's ``SQLITE_CORRUPT``). ``turnkeeper inspect`` and
    ``receipts`` report it with exit 4 (``docs/cli.md``).

    Attributes:
        path: The path that was opened.
        reason: What is damaged.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} is a damaged turnkeeper store: {reason}")
        self.path = path
        self.reason = reason


class NotATurnkeeperStore(TurnkeeperError):
    """The path is not a turnkeeper store; it was left exactly as it was.

    Attributes:
        path: The path that was opened.
        reason: Why it is not a store (not SQLite, no ``schema_version`` table, missing, a
            directory, a folder that does not exist).
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} is not a turnkeeper store: {reason}")
        self.path = path
        self.reason = reason


class ForeignStore(TurnkeeperError):
    """A turnkeeper store whose label is not the one asked for; it was left exactly as it was.

    A store's label is an integer its creator chose (``SqliteStore(label=...)``), kept in the
    file's header (``PRAGMA user_version``); ``SqliteStore.remove(path, label=...)`` deletes
    only a store carrying that label.

    Attributes:
        path: The path that was opened.
        label: The label the store carries (0: none).
        wanted: The label asked for.
    """

    def __init__(self, path: str, label: int, wanted: int) -> None:
        super().__init__(
            f"{path} is a turnkeeper store labelled {label}, not {wanted}; it was left as it was"
        )
        self.path = path
        self.label = label
        self.wanted = wanted


class UnsupportedSchemaVersion(TurnkeeperError):
    """The store was written by a newer turnkeeper; it was left exactly as it was.

    Attributes:
        path: The path that was opened.
        found: The schema version the store holds.
        supported: The newest schema version this code knows.
    """

    def __init__(self, path: str, found: int, supported: int) -> None:
        super().__init__(
            f"{path} has schema version {found}, newer than the newest this turnkeeper knows "
            f"({supported}); upgrade turnkeeper to open it"
        )
        self.path = path
        self.found = found
        self.supported = supported


class MigrationRequired(TurnkeeperError):
    """A read-only open met a store with an older schema; read-only opens never migrate.

    Attributes:
        path: The path that was opened.
        found: The schema version the store holds.
        supported: The schema version this code needs.
    """

    def __init__(self, path: str, found: int, supported: int) -> None:
        super().__init__(
            f"{path} has schema version {found} and needs migrating to {supported}; "
            "open it once read-write to migrate"
        )
        self.path = path
        self.found = found
        self.supported = supported
