"""MCP server tools as turnkeeper tools (the optional ``turnkeeper[mcp]`` extra).

An :class:`McpTool` runs one tool of an MCP server through an ``mcp.ClientSession``. It is the
nested layer of OP-3: when the engine cancels ``execute``, the adapter sends
``notifications/cancelled`` for the call's JSON-RPC request and then waits, shielded and
bounded by ``confirm_timeout_s``, for the server to confirm that the call ended. The MCP spec
lets a server ignore a cancel and recommends not answering a cancelled request at all, so
silence proves nothing: the cancellation is acknowledged (it propagates, receipt
``cancelled``) only when

* a response for that request id arrives anyway: an error such as ``REQUEST_CANCELLED``
  (-32800) that a server writes once the handler has settled (the SDK's 2025-era
  streamable-HTTP transport does so); a successful result that raced the cancel is the result
  (returned: receipt ``completed``, ``docs/operations.md``); or
* the session closes: the SDK then wakes every pending request with ``CONNECTION_CLOSED``
  (over stdio: the server process exited, or the session is being closed, after which the SDK
  stops the process);

otherwise ``execute`` raises :class:`~stream_manager.errors.TerminationUnconfirmed` (receipt
``indeterminate``). A *result* for that request arriving in the confirmation wait (it raced
the cancel) is not thrown away: ``execute`` returns it, and the call completed.

Transport failures are raised, never dressed as the server's answer:
:class:`~stream_manager.errors.ToolUnavailable` when the call was never sent (the server is
down or restarting, the session closed), :class:`~stream_manager.errors.ToolTransportLost`
when it was sent and the transport broke before any answer (nobody knows whether it ran).
:func:`stdio_tools` supervises its server (``stream_manager._mcp_server``): a server that
dies is restarted, with bounded backoff, and its tools are listed again.

Observing that answer needs the request id, and a session the adapter can address: the SDK's
``ClientSession.call_tool`` mints the id privately and, when its caller is cancelled, sends its
own courtesy ``notifications/cancelled`` and then drops whatever the server answers. Sessions
built by :func:`client_session` (and :func:`stdio_tools`) run on a dispatcher that gives each
adapter call an id the adapter chose and turns the SDK's abandon-cancel off for it (both
documented ``CallOptions`` keys of the SDK), so the adapter keeps listening after its cancel.
On any other session the adapter still stops the call (the SDK sends the cancel) but can never
confirm it: a cancelled call there is always unconfirmed unless it had already finished.

``stream_manager`` does not import this module; ``from stream_manager.mcp import McpTool``
needs the ``mcp`` package.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from os import PathLike
from typing import TYPE_CHECKING, Any, TextIO

import anyio
import anyio.lowlevel

from persistence import TurnkeeperError, UsageError
from stream_manager._parts import ToolCallPart, ToolResultPart
from stream_manager.errors import TerminationUnconfirmed, ToolTransportLost, ToolUnavailable
from stream_manager.ports import ToolContext, ToolKind
from stream_manager.redaction import cover_library_logs
from stream_manager.tools import ToolDefinition

try:
    import mcp_types
    from mcp import ClientSession, StdioServerParameters
    from mcp.shared.dispatcher import CallOptions
    from mcp.shared.exceptions import MCPError
    from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
    from mcp.shared.transport_context import TransportContext

    from stream_manager._mcp_server import Backoff, McpServer, McpUnavailable
except ImportError as error:  # pragma: no cover - only without the extra
    raise ImportError(
        "stream_manager.mcp needs the optional mcp package: pip install 'turnkeeper[mcp]'"
    ) from error

if TYPE_CHECKING:
    from types import TracebackType
    from typing import Self

    # The SDK's stream protocols live in a private module; they are only annotations here.
    from mcp.client._transport import ReadStream, WriteStream
    from mcp.shared.message import SessionMessage

__all__ = ["McpServer", "McpTool", "McpUnavailable", "client_session", "stdio_tools"]

#: The roots of the SDK's loggers: its modules' (``mcp.*``) and its ``ClientSession``'s.
SDK_LOGGERS = ("mcp", "client")


def cover_sdk_logs() -> None:
    """Keep the SDK's loggers below DEBUG and redact every record of theirs (idempotent).

    Their DEBUG and INFO records quote messages whole (a streamable-HTTP event, a session id),
    so they stay at ``WARNING`` unless the host gave them a level; a filter sees only its own
    logger's records, so every ``mcp.*`` logger that exists gets one (run again for each
    session, for loggers the SDK creates late). ``docs/trace.md``, "Redaction".
    """
    cover_library_logs(SDK_LOGGERS)


cover_sdk_logs()

#: Why the adapter cancels: the ``reason`` of its ``notifications/cancelled``.
CANCEL_REASON = "cancelled by the turnkeeper engine (stop, deadline or stream loss)"

# Adapter request ids are strings that never parse as an integer, so they cannot collide with
# the ids the SDK mints from its integer counter (the SDK's ``CallOptions.request_id`` docs).
_request_numbers = itertools.count(1)


class _Call:
    """One ``tools/call`` in flight: its id, how far it got, and how it ended."""

    __slots__ = ("done", "error", "issued", "request_id", "result", "started", "written")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        #: The request task ran (before this, nothing can have been written).
        self.started = False
        #: The addressable dispatcher sent the request under ``request_id``.
        self.issued = False
        #: The request went onto the transport's write stream (before this, it was never sent).
        self.written = False
        self.result: mcp_types.CallToolResult | None = None
        self.error: Exception | None = None
        self.done = anyio.Event()


#: The call the current task is making, for the dispatcher to address (one per request task).
_current_call: ContextVar[_Call | None] = ContextVar("turnkeeper_mcp_call", default=None)


class _AddressableDispatcher(JSONRPCDispatcher[TransportContext]):
    """The SDK's JSON-RPC dispatcher, sending an adapter's ``tools/call`` under the adapter's id.

    ``ClientSession.call_tool`` offers no way to pass per-call options, but it awaits the
    dispatcher in the caller's task, so the adapter's call is found in a context variable. Its
    request goes out with ``request_id`` (the caller-chosen id) and ``cancel_on_abandon=False``
    (the adapter sends ``notifications/cancelled`` itself and keeps waiting for the answer);
    every other request is the SDK's, unchanged.
    """

    async def send_raw_request(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        opts: CallOptions | None = None,
        *,
        _related_request_id: mcp_types.RequestId | None = None,
    ) -> dict[str, Any]:
        call = _current_call.get()
        if call is not None and not call.issued and method == "tools/call":
            call.issued = True
            opts = opts.copy() if opts is not None else CallOptions()
            opts["request_id"] = call.request_id
            opts["cancel_on_abandon"] = False
        return await super().send_raw_request(
            method, params, opts, _related_request_id=_related_request_id
        )


class _NotingWrites:
    """A transport's write stream that notes when the current adapter call's request went out.

    The dispatcher writes a request in its caller's task, so the call is found in the context
    variable; a ``CONNECTION_CLOSED`` for a call never written means it was never sent.
    """

    __slots__ = ("_stream",)

    def __init__(self, stream: WriteStream[SessionMessage]) -> None:
        self._stream = stream

    async def send(self, item: SessionMessage, /) -> None:
        await self._stream.send(item)
        call = _current_call.get()
        message = item.message
        if call is not None and isinstance(message, mcp_types.JSONRPCRequest):
            call.written = call.written or message.id == call.request_id

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        return None


def client_session(
    read_stream: ReadStream[SessionMessage | Exception],
    write_stream: WriteStream[SessionMessage],
    **session_options: Any,
) -> ClientSession:
    """Build a ``ClientSession`` whose tool calls an :class:`McpTool` can cancel and confirm.

    Use it in place of ``ClientSession(read_stream, write_stream, ...)`` over any transport's
    streams; enter and initialize it as usual.

    Args:
        read_stream: The transport's read stream.
        write_stream: The transport's write stream.
        **session_options: Further ``ClientSession`` keyword arguments (callbacks, client info,
            timeouts), except ``dispatcher``.

    Returns:
        The session, not yet entered.
    """
    cover_sdk_logs()
    return ClientSession(
        dispatcher=_AddressableDispatcher(read_stream, _NotingWrites(write_stream)),
        **session_options,
    )


class McpTool:
    """One tool of an MCP server, as a turnkeeper :class:`~stream_manager.ports.Tool`.

    ``execute`` calls the server's tool with the call's arguments. A result becomes the
    output: the structured content if the server sent one, else the text contents joined by
    newlines, else the content blocks as JSON objects. A tool error (``isError``) or a protocol
    error the server answered is a failed result with ``{"error": ...}``; a call never sent
    raises :class:`~stream_manager.errors.ToolUnavailable`, a transport lost mid-call
    :class:`~stream_manager.errors.ToolTransportLost`; nothing from the ``mcp`` package is
    raised. Server progress notifications go to the context's ``report_progress``.
    Cancelling ``execute`` cancels the remote call (see the module docs for when that is
    acknowledged and when it raises ``TerminationUnconfirmed``).
    """

    __slots__ = ("_confirm_timeout_s", "_definition", "_kind", "_name", "_remote_name", "_source")

    def __init__(
        self,
        session: ClientSession | McpServer,
        name: str,
        *,
        remote_name: str | None = None,
        kind: ToolKind = ToolKind.CLIENT,
        confirm_timeout_s: float = 5.0,
        definition: ToolDefinition | None = None,
    ) -> None:
        """Adapt the server tool ``remote_name`` (default ``name``) of an initialized session.

        Args:
            session: An entered, initialized session (build it with :func:`client_session` so
                cancellations can be confirmed), or a supervised :class:`McpServer` (what
                :func:`stdio_tools` passes: its current session serves each call).
            name: The name the model calls the tool by.
            remote_name: The tool's name on the server, if different.
            kind: How the engine runs the tool.
            confirm_timeout_s: How long (real seconds) a cancelled call may take to confirm
                that it ended before the adapter reports it unconfirmed.
            definition: What the model is told of the tool; ``None``: the server's current
                ``tools/list`` entry for a supervised server, else an open schema.

        Raises:
            UsageError: ``confirm_timeout_s`` is not positive.
        """
        if not confirm_timeout_s > 0:
            raise UsageError(f"confirm_timeout_s must be positive, not {confirm_timeout_s!r}")
        self._source = session
        self._name = name
        self._remote_name = remote_name if remote_name is not None else name
        self._kind = kind
        self._confirm_timeout_s = confirm_timeout_s
        self._definition = definition

    @property
    def name(self) -> str:
        """The name the model calls the tool by."""
        return self._name

    @property
    def kind(self) -> ToolKind:
        """How the engine runs the tool."""
        return self._kind

    @property
    def definition(self) -> ToolDefinition | None:
        """Its description, parameters' schema and hints, as the server lists them now.

        For a supervised server that is its latest ``tools/list`` (re-read at each restart);
        while it is down, the last one seen.
        """
        server = self.server
        if self._definition is None and server is not None:
            listed = server.listing.get(self._remote_name)
            if listed is not None:
                return _definition(self._name, listed)
        return self._definition

    @property
    def definition_generation(self) -> int:
        """Moves when :attr:`definition` may have changed (a supervised server re-listed)."""
        server = self.server
        return 0 if server is None else server.generation

    @property
    def server(self) -> McpServer | None:
        """The supervised server the tool calls through (``None``: a fixed session)."""
        return self._source if isinstance(self._source, McpServer) else None

    @property
    def session(self) -> ClientSession:
        """The session the tool calls through now.

        Raises:
            ToolUnavailable: A supervised server is down.
        """
        return self._source.session() if isinstance(self._source, McpServer) else self._source

    @property
    def remote_name(self) -> str:
        """The tool's name on the MCP server."""
        return self._remote_name

    async def execute(self, call: ToolCallPart, context: ToolContext) -> ToolResultPart:
        """Call the server's tool and return its result.

        Args:
            call: The model's tool call; its ``args`` are the tool's arguments.
            context: Where the call runs: its ``report_progress`` gets the server's progress
                (the engine owns the deadline; progress never extends it).

        Returns:
            The tool's result (failed, ``is_error``, for a tool or protocol error the server
            answered), also when it arrived while a cancel was being confirmed.

        Raises:
            TerminationUnconfirmed: ``execute`` was cancelled and the server did not confirm,
                within ``confirm_timeout_s``, that the call ended.
            ToolUnavailable: The server is down or the session closed: nothing was sent.
            ToolTransportLost: The call was sent and the transport broke before any answer.
        """
        # Already cancelled (a stop before the call began): send nothing at all.
        await anyio.lowlevel.checkpoint_if_cancelled()
        session = self.session
        if self.server is not None and self._remote_name not in self.server.listing:
            raise ToolUnavailable(
                f"MCP server {self.server.label!r} no longer lists the tool {self._remote_name!r}"
            )
        mcp_call = _Call(f"turnkeeper-{next(_request_numbers)}")
        # Shielded: the engine's cancellation must not abandon the request (the SDK would drop
        # its answer); the adapter decides when to stop waiting and cancels this scope itself.
        request_scope = anyio.CancelScope(shield=True)
        unconfirmed: str | None = None
        try:
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(
                    self._request, session, call, context, mcp_call, request_scope
                )
                try:
                    await mcp_call.done.wait()
                except anyio.get_cancelled_exc_class():
                    unconfirmed = await self._stop(session, mcp_call, request_scope)
                    raise
        except anyio.get_cancelled_exc_class():
            # Raised here, outside the task group, so it is not wrapped in an exception group.
            if unconfirmed is not None:
                raise TerminationUnconfirmed(unconfirmed) from None
            if mcp_call.result is None:
                raise
            # The server's answer raced the cancel and won: the call ran, this is its result
            # (the cancellation is spent here; nothing awaits before returning).
        return self._result(call, mcp_call)

    async def _request(
        self,
        session: ClientSession,
        call: ToolCallPart,
        context: ToolContext,
        mcp_call: _Call,
        scope: anyio.CancelScope,
    ) -> None:
        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            context.report_progress(progress, total, message)

        with scope:
            mcp_call.started = True
            token = _current_call.set(mcp_call)
            try:
                mcp_call.result = await session.call_tool(
                    self._remote_name, dict(call.args), progress_callback=on_progress
                )
            except Exception as error:  # every failure of the call is examined in _result
                mcp_call.error = error
            finally:
                _current_call.reset(token)
                mcp_call.done.set()

    async def _stop(
        self, session: ClientSession, mcp_call: _Call, request_scope: anyio.CancelScope
    ) -> str | None:
        """Cancel the remote call; ``None`` once it is confirmed ended, else why it is not."""
        if mcp_call.done.is_set():
            return None  # it had already ended: nothing left to stop
        if not mcp_call.started:
            # The request task has not run: cancelling its scope now makes the SDK stop at its
            # pre-write checkpoint, so the request is never sent and nothing ran.
            request_scope.cancel(f"{self._remote_name!r}: cancelled before it was sent")
            return None
        where = f"MCP tool {self._remote_name!r}"
        if not mcp_call.issued:
            # A session not built by client_session: its dispatcher minted the id. The SDK sends
            # notifications/cancelled itself when the request task is cancelled, then drops the
            # server's answer, so nothing can confirm the end.
            request_scope.cancel(f"{self._remote_name!r}: cancelled (no observable answer)")
            return (
                f"{where}: cancellation requested, termination not confirmed (the session was "
                "not built with stream_manager.mcp.client_session, so the server's answer to "
                "the cancelled request cannot be observed)"
            )
        notice = mcp_types.CancelledNotification(
            params=mcp_types.CancelledNotificationParams(
                request_id=mcp_call.request_id, reason=CANCEL_REASON
            )
        )
        with anyio.move_on_after(self._confirm_timeout_s, shield=True):
            # Fire-and-forget in the SDK: after the connection closed it is dropped, and the
            # pending call has then already been woken with CONNECTION_CLOSED.
            await session.send_notification(notice)
            # Any end of the request counts: a response of any kind for this id, or the session
            # closing (the SDK wakes every pending request with CONNECTION_CLOSED).
            await mcp_call.done.wait()
        if mcp_call.done.is_set():
            return None
        # Stop waiting; cancel_on_abandon is off, so no second cancel.
        request_scope.cancel(f"{self._remote_name!r}: its cancellation was not confirmed")
        return (
            f"{where} (request {mcp_call.request_id!r}): cancellation requested, termination "
            f"not confirmed within {self._confirm_timeout_s:g} s"
        )

    def _result(self, call: ToolCallPart, mcp_call: _Call) -> ToolResultPart:
        result = mcp_call.result
        if result is None:
            self._raise_if_transport(mcp_call)
            return _failed(call, self._failure(mcp_call.error))
        if self.server is not None:
            self.server.served()
        if result.is_error:
            text = _joined_text(result.content)
            return _failed(call, text or f"MCP tool {self._remote_name!r} reported an error")
        return ToolResultPart(call_id=call.call_id, name=call.name, output=_output(result))

    def _raise_if_transport(self, mcp_call: _Call) -> None:
        """Raise what a transport failure is: never sent, or sent and lost (no answer)."""
        error = mcp_call.error
        closed = isinstance(error, MCPError) and error.code == mcp_types.CONNECTION_CLOSED
        where = f"MCP tools/call {self._remote_name!r}"
        if not mcp_call.written and (closed or not isinstance(error, MCPError)):
            raise ToolUnavailable(
                f"{where} was not sent: the connection to the MCP server is closed ({error})"
            )
        if closed:
            raise ToolTransportLost(
                f"{where} (request {mcp_call.request_id!r}): the connection to the MCP server "
                "closed before it answered; whether the call ran is unknown"
            )

    def _failure(self, error: Exception | None) -> str:
        where = f"MCP tools/call {self._remote_name!r}"
        if isinstance(error, MCPError):
            return f"{where} failed: {error.message} (JSON-RPC error {error.code})"
        if error is None:  # pragma: no cover - a finished call has a result or an error
            return f"{where} failed without an error"
        return f"{where} failed: {type(error).__name__}: {error}"


def _failed(call: ToolCallPart, error: str) -> ToolResultPart:
    return ToolResultPart(
        call_id=call.call_id, name=call.name, output={"error": error}, is_error=True
    )


def _joined_text(content: Sequence[mcp_types.ContentBlock]) -> str:
    return "\n".join(block.text for block in content if isinstance(block, mcp_types.TextContent))


def _output(result: mcp_types.CallToolResult) -> object:
    """A successful result as JSON-able output (structured, else text, else content blocks)."""
    if result.structured_content is not None:
        return result.structured_content
    if all(isinstance(block, mcp_types.TextContent) for block in result.content):
        return _joined_text(result.content)
    return [
        block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content
    ]


@asynccontextmanager
async def stdio_tools(
    command: str,
    args: Sequence[str] = (),
    *,
    names: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | PathLike[str] | None = None,
    kind: ToolKind = ToolKind.CLIENT,
    confirm_timeout_s: float = 5.0,
    start_timeout_s: float = 30.0,
    restart_backoff_s: float = 0.5,
    max_restart_backoff_s: float = 30.0,
    errlog: TextIO | None = None,
) -> AsyncIterator[dict[str, McpTool]]:
    """Start a supervised MCP server over stdio and yield its tools as :class:`McpTool` by name.

    A server that exits or whose transport breaks is started again after ``restart_backoff_s``
    (doubling per consecutive failure, at most ``max_restart_backoff_s``; back to the first
    delay once a call is answered) and its tools are listed again (a changed list is logged;
    each tool's ``definition`` is the latest listing). While it is down a call raises
    ``ToolUnavailable`` and is never sent. On exit the session closes and the SDK stops the
    server (closes its stdin, waits, then terminates and kills its process group; every wait
    bounded, a few seconds at most).

    Args:
        command: The server's executable.
        args: Its arguments.
        names: The tools to adapt (default: every tool the server lists at its first start).
        env: Extra environment variables for the server.
        cwd: The server's working directory.
        kind: How the engine runs the tools.
        confirm_timeout_s: Each tool's cancellation-confirmation bound (real seconds).
        start_timeout_s: Bound on initializing the session and listing the tools.
        restart_backoff_s: The first delay before a restart (real seconds).
        max_restart_backoff_s: The bound on the restart delay (real seconds).
        errlog: Where the server's stderr goes (default: this process's stderr).

    Yields:
        The tools by name.

    Raises:
        McpUnavailable: The server failed or timed out while initializing or listing tools.
        UsageError: ``names`` names a tool the server does not list, or the backoff is not
            ``0 < restart_backoff_s <= max_restart_backoff_s``.
        OSError: The server process could not be started.
    """
    params = StdioServerParameters(
        command=command, args=list(args), env=dict(env) if env is not None else None, cwd=cwd
    )
    cover_sdk_logs()
    server = McpServer(
        params,
        names=names,
        start_timeout_s=start_timeout_s,
        backoff=Backoff(restart_backoff_s, max_restart_backoff_s),
        errlog=errlog if errlog is not None else sys.stderr,
        session_factory=client_session,
    )
    failure: TurnkeeperError | OSError | None = None
    async with anyio.create_task_group() as task_group:
        try:
            listing = await task_group.start(server.run)
        except (McpUnavailable, UsageError, OSError) as error:
            # Raised below, once the task group is left: inside it, it would surface wrapped
            # in an exception group.
            failure = error
        else:
            try:
                yield {
                    name: McpTool(server, name, kind=kind, confirm_timeout_s=confirm_timeout_s)
                    for name in listing
                }
            finally:
                task_group.cancel_scope.cancel("the MCP tools' context was left")
    if failure is not None:
        raise failure


def _definition(name: str, tool: mcp_types.Tool) -> ToolDefinition:
    """The server's listing of ``tool`` as a definition: description, schema and hints."""
    hints = tool.annotations
    return ToolDefinition(
        name=name,
        description=tool.description or "",
        parameters=dict(tool.input_schema),
        read_only=bool(hints is not None and hints.read_only_hint),
        idempotent=bool(hints is not None and hints.idempotent_hint),
    )
