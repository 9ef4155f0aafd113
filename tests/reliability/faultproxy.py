"""A small TCP fault proxy on loopback, between the worker and the simulator.

The simulator injects faults inside HTTP; this proxy breaks the TCP stream itself, the way a
load balancer, a NAT box or a flaky network does. It listens on 127.0.0.1 (an ephemeral
port), and for each connection it accepts it draws a fate from a seeded generator:

| fate | what the client sees |
|---|---|
| `pass` | the simulator's answers, byte for byte |
| `reset` | the request is read, then the connection is reset (RST, SO_LINGER 0) |
| `close` | the request is read, then the connection is closed with no answer at all |
| `truncate` | the status line and headers and part of the body, then the connection closes |
| `stall` | the request is read and nothing ever comes back (until the proxy stops) |
| `garbage` | bytes that are not HTTP, then the connection closes |
| `slow` | the answer one small chunk at a time, with a pause between chunks |

A fate applies to the whole connection: the first exchange on it gets the fault, and the
connection is gone after it (except `pass` and `slow`), so a client with a keep-alive pool
opens a new one for its next request, which draws again. Everything runs on one asyncio loop
in a daemon thread; every wait is bounded, and `stop` closes every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections import Counter
from collections.abc import Mapping
from types import TracebackType
from typing import Final

FATES: Final = ("pass", "reset", "close", "truncate", "stall", "garbage", "slow")
STALL_LIMIT_S: Final = 60.0
SLOW_CHUNK: Final = 64
SLOW_PAUSE_S: Final = 0.02
IO_TIMEOUT_S: Final = 30.0


class FaultProxy:
    """A loopback TCP proxy to `target` that breaks connections by a seeded plan.

    Args:
        target: (host, port) of the simulator; must be loopback.
        fates: weight of each fate (see `FATES`); they need not sum to 1.
        seed: seed of the generator that draws each connection's fate.
    """

    def __init__(self, target: tuple[str, int], fates: Mapping[str, float], seed: int) -> None:
        unknown = set(fates) - set(FATES)
        if unknown:
            raise ValueError(f"unknown fates {sorted(unknown)}; expected some of {FATES}")
        if target[0] not in {"127.0.0.1", "::1", "localhost"}:
            raise ValueError("the fault proxy only forwards to loopback")
        self.target = target
        self._names = list(fates)
        self._weights = [fates[name] for name in self._names]
        self._rng = random.Random(seed)
        self.seen: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self.port = 0

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Listen on 127.0.0.1 and return once ready."""
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`: use it as `service.base_url`."""
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Close the listener and every connection; wait for the thread to end."""
        if self._stopping is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        async with self._server:
            await self._stopping.wait()
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=5)

    def _draw(self) -> str:
        with self._lock:
            fate = self._rng.choices(self._names, self._weights)[0]
            self.seen[fate] += 1
        return fate

    # -- one connection -----------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        fate = self._draw()
        try:
            await asyncio.wait_for(self._serve(fate, reader, writer), STALL_LIMIT_S)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            if fate != "reset":
                writer.close()

    async def _serve(
        self, fate: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if fate in {"pass", "slow"}:
            await self._forward(reader, writer, slow=fate == "slow")
            return
        request = await _read_request(reader)
        if not request:
            return
        if fate == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        elif fate == "close":
            return
        elif fate == "stall":
            await asyncio.sleep(STALL_LIMIT_S)
        elif fate == "garbage":
            writer.write(b"\x00\xffnot http at all\r\n\r\n\x16\x03\x01")
            await writer.drain()
        elif fate == "truncate":
            answer = await self._exchange(request)
            writer.write(answer[: _cut(answer)])
            await writer.drain()

    async def _exchange(self, request: bytes) -> bytes:
        """Send one request to the simulator and read its whole answer (connection: close)."""
        up_reader, up_writer = await asyncio.wait_for(
            asyncio.open_connection(*self.target), IO_TIMEOUT_S
        )
        try:
            up_writer.write(_with_close(request))
            await up_writer.drain()
            return await asyncio.wait_for(up_reader.read(), IO_TIMEOUT_S)
        finally:
            up_writer.close()

    async def _forward(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, slow: bool
    ) -> None:
        up_reader, up_writer = await asyncio.wait_for(
            asyncio.open_connection(*self.target), IO_TIMEOUT_S
        )
        try:
            # Each direction ends on its own (EOF or IO_TIMEOUT_S of silence); exceptions
            # are collected, and cancelling the gather (stop) cancels both.
            await asyncio.gather(
                _pipe(reader, up_writer, slow=False),
                _pipe(up_reader, writer, slow=slow),
                return_exceptions=True,
            )
        finally:
            up_writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, slow: bool) -> None:
    try:
        while True:
            data = await asyncio.wait_for(reader.read(SLOW_CHUNK if slow else 65536), IO_TIMEOUT_S)
            if not data:
                break
            writer.write(data)
            await writer.drain()
            if slow:
                await asyncio.sleep(SLOW_PAUSE_S)
    finally:
        if writer.can_write_eof():
            with contextlib.suppress(OSError):
                writer.write_eof()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (the worker's requests carry a Content-Length or none)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IO_TIMEOUT_S)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip() or 0)
    body = await asyncio.wait_for(reader.readexactly(length), IO_TIMEOUT_S) if length else b""
    return head + body


def _cut(answer: bytes) -> int:
    """Where to cut an answer: halfway through its body (or its head, when it has none)."""
    head_end = answer.find(b"\r\n\r\n")
    if head_end < 0:
        return max(1, len(answer) // 2)
    body = len(answer) - head_end - 4
    return head_end + 4 + body // 2 if body > 1 else max(1, head_end // 2)


def _with_close(request: bytes) -> bytes:
    """The request with `Connection: close`, so the answer ends when the socket does."""
    head, _, body = request.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body
