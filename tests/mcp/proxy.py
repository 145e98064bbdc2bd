"""A stdio proxy the MCP tests own, in front of a real MCP server nobody here wrote.

Run as ``python tests/mcp/proxy.py CONTROL_DIR -- COMMAND [ARGS...]``: it spawns the server,
relays the client's stdin to the server's stdin and the server's stdout to its own stdout, line
by line, and exits when the server's stdout ends (so a killed server closes the client's
transport as a dead server would). It answers one command per connection on the Unix socket
``CONTROL_DIR/sock`` (one line in, one line out), so a test steers it without sleeping:

* ``hold``: the server's next response is held back (not relayed) until ``release``;
* ``held``: waits until a response is held, answers its JSON-RPC id;
* ``release``: relays the held response;
* ``cancelled``: waits until a ``notifications/cancelled`` passed through, answers its id;
* ``inject HEX``: writes these raw bytes to the client (e.g. a non-UTF-8 line);
* ``kill``: kills the server with SIGKILL (the proxy then exits, its stdout closing);
* ``pid``: the server's process id.

A tool named in the file ``CONTROL_DIR/hidden`` (one per line) is removed from every
``tools/list`` answer, so a test can change the list a restarted server offers. Each proxy
(one per server start) binds the socket afresh.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any


class Proxy:
    """The relay's state: the held response and what the control socket waits on."""

    def __init__(self, server: asyncio.subprocess.Process, control: Path) -> None:
        self.server = server
        self.control = control
        self.hold = False
        self.held: bytes | None = None
        self.held_id: object = None
        self.cancels: list[object] = []
        self.changed = asyncio.Condition()
        self.out = sys.stdout.buffer

    async def note(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def wait_for(self, ready: Any) -> None:
        async with self.changed:
            await self.changed.wait_for(ready)

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.out.flush()

    def hidden(self) -> set[str]:
        path = self.control / "hidden"
        return set(path.read_text().split()) if path.exists() else set()

    async def client_to_server(self, reader: asyncio.StreamReader) -> None:
        assert self.server.stdin is not None
        while line := await reader.readline():
            message = _parsed(line)
            if message.get("method") == "notifications/cancelled":
                self.cancels.append(message.get("params", {}).get("requestId"))
                await self.note()
            self.server.stdin.write(line)
            await self.server.stdin.drain()
        self.server.stdin.close()

    async def server_to_client(self) -> None:
        assert self.server.stdout is not None
        while line := await self.server.stdout.readline():
            message = _parsed(line)
            tools = message.get("result", {}).get("tools") if "id" in message else None
            if isinstance(tools, list) and (hidden := self.hidden()):
                message["result"]["tools"] = [t for t in tools if t.get("name") not in hidden]
                line = json.dumps(message).encode() + b"\n"
            if self.hold and "id" in message and ("result" in message or "error" in message):
                self.hold = False
                self.held, self.held_id = line, message["id"]
                await self.note()
                continue
            self.write(line)

    async def command(self, text: str) -> str:
        verb, _, argument = text.partition(" ")
        if verb == "hold":
            self.hold = True
        elif verb == "held":
            await self.wait_for(lambda: self.held is not None)
            return json.dumps(self.held_id)
        elif verb == "release":
            assert self.held is not None, "nothing is held"
            self.write(self.held)
            self.held = None
        elif verb == "cancelled":
            await self.wait_for(lambda: bool(self.cancels))
            return json.dumps(self.cancels[-1])
        elif verb == "inject":
            self.write(bytes.fromhex(argument))
        elif verb == "kill":
            self.server.send_signal(signal.SIGKILL)
        elif verb == "pid":
            return str(self.server.pid)
        else:
            return f"unknown command {verb!r}"
        return "ok"

    async def serve_control(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        answer = await self.command((await reader.readline()).decode().strip())
        writer.write(answer.encode() + b"\n")
        await writer.drain()
        writer.close()


def _parsed(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


async def main(control: Path, command: list[str]) -> int:
    server = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    proxy = Proxy(server, control)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    sock = control / "sock"
    sock.unlink(missing_ok=True)
    listener = await asyncio.start_unix_server(proxy.serve_control, path=str(sock))
    upstream = asyncio.create_task(proxy.client_to_server(stdin))
    await proxy.server_to_client()  # until the server's stdout ends
    upstream.cancel()
    listener.close()
    code = await server.wait()
    sys.stdout.close()
    return code


if __name__ == "__main__":
    separator = sys.argv.index("--")
    code = asyncio.run(main(Path(sys.argv[1]), sys.argv[separator + 1 :]))
    os._exit(0 if code == 0 else 1)
