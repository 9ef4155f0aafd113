"""A loopback TCP fault proxy: it forwards to a server and breaks connections on command.

One proxy for the two places that break a TCP stream on purpose:

- the reliability tests put it between the worker and the simulator and let each
  connection draw a *fate* from a seeded generator (the way a load balancer, a NAT box or a
  flaky network breaks HTTP);
- the B6 soak puts it between the `serve` instances and PostgreSQL and calls `cut()` /
  `restore()` and `stall()` / `resume()` from its own thread (the database "goes away" or
  "hangs" without the server itself being touched).

It listens on 127.0.0.1 (an ephemeral port, `port`). The fates of a connection:

| fate | what the client sees |
|---|---|
| `pass` | the server's answers, byte for byte (the default: `fates={"pass": 1}`) |
| `reset` | the request is read, then the connection is reset (RST, SO_LINGER 0) |
| `close` | the request is read, then the connection is closed with no answer at all |
| `truncate` | the status line and headers and part of the body, then the connection closes |
| `stall` | the request is read and nothing ever comes back (until `limit_s` or `stop`) |
| `garbage` | bytes that are not HTTP, then the connection closes |
| `slow` | the answer one small chunk at a time, with a pause between chunks |

Every fate but `pass` and `slow` reads one HTTP request first; they serve HTTP only. A fate
applies to the whole connection: a client with a keep-alive pool opens a new one for its
next request, which draws again. On top of the fates, whatever they are:

- `cut()`: close every open connection at once and refuse (accept, then close) new ones
  until `restore()`;
- `stall()`: stop moving bytes either way (connections stay open, data waits in the
  proxy) until `resume()`.

Everything runs on one asyncio loop in a daemon thread. `limit_s` bounds a connection's
life and `idle_s` a silent direction (the defaults suit HTTP; a database pool's connections
live long and sit idle, so the soak passes None for both); `stop` closes every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections import Counter
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Final

FATES: Final = ("pass", "reset", "close", "truncate", "stall", "garbage", "slow")
STALL_LIMIT_S: Final = 60.0
SLOW_CHUNK: Final = 64
SLOW_PAUSE_S: Final = 0.02
IO_TIMEOUT_S: Final = 30.0
CALL_TIMEOUT_S: Final = 10.0
CHUNK: Final = 65536


class FaultProxy:
    """A loopback TCP proxy to `target` that breaks connections by a seeded plan or on command.

    Args:
        target: (host, port) of the server; must be loopback.
        fates: weight of each fate (see `FATES`); they need not sum to 1.
        seed: seed of the generator that draws each connection's fate.
        limit_s: the longest a connection lives (None: no bound).
        idle_s: the longest one direction of a forwarded connection stays silent before
            it is closed (None: no bound).
    """

    def __init__(
        self,
        target: tuple[str, int],
        fates: Mapping[str, float] | None = None,
        seed: int = 0,
        *,
        limit_s: float | None = STALL_LIMIT_S,
        idle_s: float | None = IO_TIMEOUT_S,
    ) -> None:
        fates = {"pass": 1.0} if fates is None else fates
        unknown = set(fates) - set(FATES)
        if unknown:
            raise ValueError(f"unknown fates {sorted(unknown)}; expected some of {FATES}")
        if target[0] not in {"127.0.0.1", "::1", "localhost"}:
            raise ValueError("the fault proxy only forwards to loopback")
        self.target = target
        self.limit_s = limit_s
        self.idle_s = idle_s
        self._names = list(fates)
        self._weights = [fates[name] for name in self._names]
        self._rng = random.Random(seed)
        self.seen: Counter[str] = Counter()
        self.accepted = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._flowing: asyncio.Event | None = None
        self._cut = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self.port = 0

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Listen on 127.0.0.1 and return once ready."""
        self._thread.start()
        if not self._ready.wait(CALL_TIMEOUT_S):
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
        self._thread.join(CALL_TIMEOUT_S)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- control, from another thread: each returns once the loop has done it -------------

    def cut(self) -> None:
        """Close every connection and refuse new ones until `restore`."""
        self._call(self._set_cut(True))

    def restore(self) -> None:
        """Accept and forward connections again."""
        self._call(self._set_cut(False))

    def stall(self) -> None:
        """Hold every byte, both ways, until `resume`."""
        self._call(self._set_flowing(False))

    def resume(self) -> None:
        """Move the held bytes and forward again."""
        self._call(self._set_flowing(True))

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        future: Future[None] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        future.result(timeout=CALL_TIMEOUT_S)

    async def _set_cut(self, cut: bool) -> None:
        self._cut = cut
        if cut:
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()

    async def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    # -- on the proxy's loop --------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        async with self._server:
            await self._stopping.wait()
            self._server.close()
            await self._set_cut(True)
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
        if self._cut:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.accepted += 1
        fate = self._draw()
        try:
            await asyncio.wait_for(self._serve(fate, reader, writer), self.limit_s)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
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
        """Send one request to the server and read its whole answer (connection: close)."""
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
        self._writers.add(up_writer)
        try:
            # Each direction ends on its own (EOF, `idle_s` of silence, or a cut); exceptions
            # are collected, and cancelling the gather (stop) cancels both.
            await asyncio.gather(
                self._pipe(reader, up_writer, slow=False),
                self._pipe(up_reader, writer, slow=slow),
                return_exceptions=True,
            )
        finally:
            self._writers.discard(up_writer)
            up_writer.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, slow: bool
    ) -> None:
        assert self._flowing is not None
        try:
            while True:
                data = await asyncio.wait_for(
                    reader.read(SLOW_CHUNK if slow else CHUNK), self.idle_s
                )
                if not data:
                    break
                await self._flowing.wait()
                if writer.transport.is_closing():
                    return
                writer.write(data)
                await writer.drain()
                if slow:
                    await asyncio.sleep(SLOW_PAUSE_S)
        finally:
            if self._cut:
                writer.transport.abort()
            elif writer.can_write_eof() and not writer.transport.is_closing():
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
