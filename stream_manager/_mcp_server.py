"""A supervised MCP server over stdio: started, listed, restarted when it dies (``stdio_tools``).

:class:`McpServer` runs one server process at a time in a task of its own: it starts the
process, initializes a session, lists the tools, then serves until the transport ends (the
process exited, its stdout closed, its stdin broke). It then restarts the server after a
backoff that doubles per consecutive failure up to a bound, and lists the tools again (a
changed list is logged). While it is down, :meth:`McpServer.session` raises
:class:`~stream_manager.errors.ToolUnavailable`, so a call is never sent.

The server's stdout is decoded with :data:`REPLACE_ERRORS`: an undecodable byte becomes
U+FFFD and the connection goes on (the SDK's ``strict`` default kills its reader on the first
one). What reaches the session passes a relay that logs each line that is not a JSON-RPC
message as one record without a traceback, and notes undecodable bytes once per burst (one
read from the pipe); the SDK's own record of such a line (with a traceback) is dropped.

Imported by :mod:`stream_manager.mcp` only (it needs the ``mcp`` package).
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, TextIO

import anyio
import anyio.abc
import mcp_types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from persistence import TurnkeeperError, UsageError
from stream_manager.errors import ToolUnavailable

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectSendStream
    from mcp.client._transport import ReadStream, WriteStream
    from mcp.shared.message import SessionMessage

#: Redacted like every turnkeeper logger (``stream_manager.redaction.LOGGERS``).
log = logging.getLogger("turnkeeper.mcp")

#: The codec error handler the server's stdout is decoded with (``codecs.register_error``).
REPLACE_ERRORS = "turnkeeper-mcp-replace"
#: The SDK's record of a stdout line that is no JSON-RPC message (dropped: the relay logs it).
_SDK_PARSE_FAILURE = "Failed to parse JSONRPC message from server"

SessionFactory = Callable[
    ["ReadStream[SessionMessage | Exception]", "WriteStream[SessionMessage]"], ClientSession
]


class McpUnavailable(TurnkeeperError):
    """An MCP server could not be started, initialized or listed."""


class _Noise:
    """Undecodable bytes one server's stdout carried since the relay last reported them."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


#: The server whose stdout the current task decodes (the SDK's reader inherits its context).
_noise: ContextVar[_Noise | None] = ContextVar("turnkeeper_mcp_noise", default=None)


def _replace(error: UnicodeError) -> tuple[str, int]:
    """``errors="replace"`` for decoding, counted for the server being read; strict otherwise."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    noise = _noise.get()
    if noise is not None:
        noise.bytes += error.end - error.start
    return "\ufffd", error.end


codecs.register_error(REPLACE_ERRORS, _replace)


class _DropSdkParseRecord(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != _SDK_PARSE_FAILURE


logging.getLogger("mcp.client.stdio").addFilter(_DropSdkParseRecord())


class Backoff:
    """The restart delays: ``first_s``, doubling per consecutive failure, at most ``max_s``."""

    __slots__ = ("first_s", "max_s", "next_s")

    def __init__(self, first_s: float, max_s: float) -> None:
        if not 0 < first_s <= max_s:
            raise UsageError(
                f"restart backoff must satisfy 0 < first ({first_s!r}) <= max ({max_s!r})"
            )
        self.first_s = first_s
        self.max_s = max_s
        self.next_s = first_s

    def take(self) -> float:
        """The delay before this restart; the next one doubles (bounded)."""
        delay = self.next_s
        self.next_s = min(self.max_s, self.next_s * 2)
        return delay

    def reset(self) -> None:
        """The server served a call: the next failure waits ``first_s`` again."""
        self.next_s = self.first_s


class McpServer:
    """One stdio MCP server, supervised: its current session and tool list, restarted on death.

    ``starts`` counts successful starts (1 after the first), ``stops`` the ends of their
    transports; :meth:`wait_started` and :meth:`wait_stopped` wait for a later one.
    ``listing`` is the latest ``tools/list`` by name (kept while down).
    """

    def __init__(
        self,
        params: StdioServerParameters,
        *,
        names: Sequence[str] | None,
        start_timeout_s: float,
        backoff: Backoff,
        errlog: TextIO,
        session_factory: SessionFactory,
    ) -> None:
        self.label = params.command
        self._params = params.model_copy(update={"encoding_error_handler": REPLACE_ERRORS})
        self._names = list(names) if names is not None else None
        self._start_timeout_s = start_timeout_s
        self._backoff = backoff
        self._errlog = errlog
        self._factory = session_factory
        self._session: ClientSession | None = None
        self.listing: dict[str, mcp_types.Tool] = {}
        #: Moves each time ``listing`` changes (``ToolOffer`` re-reads the definitions then).
        self.generation = 0
        self.starts = 0
        self.stops = 0
        self._changed = anyio.Event()
        self._down_reason = "it has not started"

    @property
    def up(self) -> bool:
        """Whether a session is serving now."""
        return self._session is not None

    def session(self) -> ClientSession:
        """The serving session.

        Raises:
            ToolUnavailable: The server is down (exited, restarting).
        """
        if self._session is None:
            raise ToolUnavailable(f"MCP server {self.label!r} is down ({self._down_reason})")
        return self._session

    def served(self) -> None:
        """A call got an answer: the server works, so its next failure restarts promptly."""
        self._backoff.reset()

    async def wait_started(self, count: int) -> None:
        """Wait until the server has started ``count`` times (the first start counts 1)."""
        while self.starts < count:
            await self._changed.wait()

    async def wait_stopped(self, count: int) -> None:
        """Wait until the server's transport has ended ``count`` times."""
        while self.stops < count:
            await self._changed.wait()

    def _note(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def run(self, *, task_status: anyio.abc.TaskStatus[dict[str, mcp_types.Tool]]) -> None:
        """Serve, and restart after each end, until cancelled; the first start's failure raises.

        Raises:
            McpUnavailable: The first start failed to initialize or list the tools.
            UsageError: ``names`` names a tool the first listing does not have.
            OSError: The first start could not spawn the process.
        """
        noise = _Noise()
        _noise.set(noise)
        status: anyio.abc.TaskStatus[dict[str, mcp_types.Tool]] | None = task_status
        while True:
            try:
                await self._serve(noise, status)
            except Exception as error:
                if status is not None:
                    raise  # the first start's failure is the caller's
                self._down_reason = f"its restart failed: {_first_line(error)}"
            status = None
            delay = self._backoff.take()
            log.warning(
                "MCP server %r: %s; restarting in %g s", self.label, self._down_reason, delay
            )
            await anyio.sleep(delay)

    async def _serve(
        self, noise: _Noise, started: anyio.abc.TaskStatus[dict[str, mcp_types.Tool]] | None
    ) -> None:
        """Start the server once and serve until its transport ends."""
        failure: McpUnavailable | UsageError | None = None
        async with stdio_client(self._params, self._errlog) as (read, write):
            sink, relayed = anyio.create_memory_object_stream["SessionMessage | Exception"](0)
            lost = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._relay, read, sink, noise, lost)
                async with self._factory(relayed, write) as session:
                    try:
                        listing = await self._listing(session, first=started is not None)
                    except (McpUnavailable, UsageError) as error:
                        # Raised below, once the SDK's task groups are left: inside them it
                        # would surface wrapped in an exception group.
                        failure = error
                    else:
                        await self._until_lost(session, listing, lost, started)
                tg.cancel_scope.cancel(f"MCP server {self.label!r}: its session ended")
        if failure is not None:
            raise failure

    async def _until_lost(
        self,
        session: ClientSession,
        listing: dict[str, mcp_types.Tool],
        lost: anyio.Event,
        started: anyio.abc.TaskStatus[dict[str, mcp_types.Tool]] | None,
    ) -> None:
        self._up(session, listing)
        try:
            if started is not None:
                started.started(listing)
            await lost.wait()
        finally:
            self._down("its transport closed (the process exited or its pipes broke)")

    async def _listing(self, session: ClientSession, *, first: bool) -> dict[str, mcp_types.Tool]:
        listed = await initialize(session, self.label, self._start_timeout_s)
        wanted = self._names if self._names is not None else list(listed)
        missing = sorted(set(wanted) - set(listed))
        if missing and first:
            raise UsageError(
                f"MCP server {self.label!r} does not list the tool(s) {missing}; "
                f"it lists {sorted(listed)}"
            )
        return {name: listed[name] for name in wanted if name in listed}

    def _up(self, session: ClientSession, listing: dict[str, mcp_types.Tool]) -> None:
        if self.starts and listing != self.listing:
            log.warning(
                "MCP server %r: its tool list changed on restart: now %s (was %s)",
                self.label,
                sorted(listing),
                sorted(self.listing),
            )
        if listing != self.listing:
            self.generation += 1  # the tools' definitions changed: the engine's offer follows
        self._session, self.listing = session, listing
        self.starts += 1
        self._note()

    def _down(self, reason: str) -> None:
        self._session = None  # the listing stays: the last one seen
        self._down_reason = reason
        self.stops += 1
        self._note()

    async def _relay(
        self,
        source: ReadStream[SessionMessage | Exception],
        sink: MemoryObjectSendStream[SessionMessage | Exception],
        noise: _Noise,
        lost: anyio.Event,
    ) -> None:
        """Pass the transport's messages on; log what is no message, in one line each."""
        try:
            await self._pass_on(source, sink, noise)
        finally:
            lost.set()

    async def _pass_on(
        self,
        source: ReadStream[SessionMessage | Exception],
        sink: MemoryObjectSendStream[SessionMessage | Exception],
        noise: _Noise,
    ) -> None:
        async with sink:
            try:
                async for item in source:
                    replaced = self._replaced(noise)
                    if isinstance(item, Exception):
                        log.warning(
                            "MCP server %r wrote a line that is not a JSON-RPC message "
                            "(%s)%s; ignored",
                            self.label,
                            _first_line(item),
                            replaced,
                        )
                        continue
                    if replaced:
                        log.warning("MCP server %r: a message%s", self.label, replaced)
                    await sink.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass

    @staticmethod
    def _replaced(noise: _Noise) -> str:
        if not noise.bytes:
            return ""
        text = f" with {noise.bytes} undecodable byte(s) replaced by U+FFFD"
        noise.bytes = 0
        return text


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


async def initialize(
    session: ClientSession, command: str, timeout_s: float
) -> dict[str, mcp_types.Tool]:
    """Initialize ``session`` and list every tool (all pages).

    Raises:
        McpUnavailable: It failed or did not finish within ``timeout_s``.
    """
    names: dict[str, mcp_types.Tool] = {}
    try:
        with anyio.fail_after(timeout_s):
            await session.initialize()
            cursor: str | None = None
            while True:
                page = await session.list_tools(
                    params=mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
                )
                names.update((tool.name, tool) for tool in page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    return names
    except TimeoutError:
        raise McpUnavailable(
            f"MCP server {command!r} did not initialize and list its tools within {timeout_s:g} s"
        ) from None
    except (MCPError, RuntimeError) as error:
        raise McpUnavailable(f"MCP server {command!r} failed to start: {error}") from error
